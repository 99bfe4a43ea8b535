"""The state machine's steps (`steps`: one function per state), the S3 starter, the reaper, what
every Lambda handler shares (`lambda_support`) and the handlers' settings from the environment
(`config`). `functions/*/app.py` are thin wrappers over this package.

May import: `contracts`, `checkpoint`, `serving`, `evaluation`, `aws`. Never `cli`, `local` or
`operate`: the Lambda layer ships this package and those it imports, nothing else.
"""
