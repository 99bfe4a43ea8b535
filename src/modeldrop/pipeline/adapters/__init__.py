"""A deployment's LoRA adapters: validated and written beside the base (`adapter_steps`), attached to
another deployment's base endpoint (`attach_steps`), the endpoint's inference components
(`component_steps`), and one adapter component released (`adapter_release`).

May import: `contracts`, `checkpoint`, `serving`, `aws`, the `pipeline` package's own modules.
"""
