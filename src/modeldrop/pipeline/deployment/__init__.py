"""The state machine's steps, one function per state: the S3 starter (`starter`), the record and its
preflight (`register_steps`, `preflight`), the shard copy (`copy_steps`), the preparing steps
(`steps`), the engine check (`engine_check_step`), the endpoint and its capacity fallback
(`endpoint_steps`, `attempts`), the smoke eval (`eval_steps`), the closing steps and the teardown loop
(`closing_steps`, `teardown`), and a step that finds its deployment ended (`ownership`).

May import: `contracts`, `checkpoint`, `serving`, `evaluation`, `aws`, the `pipeline` package's own
modules, `pipeline.adapters`.
"""
