"""The chat contract, judged before any GPU: the model must be able to stop (`chat_contract`). The JSON
side files (`side_files`), token lookups in the tokenizer files (`vocabulary`), the chat template
rendered as transformers renders it (`chat_template_render`), in a forked child held to time and
memory bounds (`bounded_child`).

May import: `contracts`, `checkpoint.headers`, `checkpoint.archive`.
"""
