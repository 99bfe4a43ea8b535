"""What the Lambda functions run: `functions/*/app.py` are thin wrappers over this package.

Its parts, each importing only the ones listed before it (tests/contracts/test_layout.py holds that
order):
- this package's own modules, what every part shares: the handlers' settings from the environment
  (`config`), the stack's limits no request can raise (`limits`), the handlers' error contract
  (`lambda_support`), where a deployment's reports go (`reports`).
- `adapters/`: a deployment's LoRA adapters: validated and written beside their base, attached to
  another deployment's base endpoint, its inference components, one released.
- `deployment/`: the state machine's steps, one function per state: the S3 starter, register and
  preflight, copy, validate, the engine check, the endpoint, the smoke eval, the closing steps and
  the teardown loop.
- `channels/`: a stable endpoint per model line: promotion past the gate and its settling, adapter
  promotions, rollback and closing, idle channels, what a channel costs, the reaper's channel upkeep.
- `reaper/`: the scheduled reaper: expired deployments, what ended deployments left, orphans.

May import: `contracts`, `checkpoint`, `serving`, `evaluation`, `aws`. Never `cli`, `local` or
`operate`: the Lambda layer ships this package and those it imports, nothing else.
"""
