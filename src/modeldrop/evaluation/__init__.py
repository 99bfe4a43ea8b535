"""The truncation-aware smoke eval: cases, checks and verdicts (`smoke_eval`), running them against an
endpoint (`runner`), the token budget per case (`context_budget`), the chat / LMI / SSE protocols
and the reports. The default eval set is in `data/`.

May import: `contracts`, `serving` (the plan's token ceiling, the engine env readers) and `aws` (an
endpoint's configured env). Calls sagemaker-runtime only through a client the caller passes.
"""
