"""The local model servers that honour the SageMaker container contract (port, /ping, /invocations):
the weight-free `reference_engine`, real CPU generation with transformers (`transformers_engine`),
and how each engine's container process is launched from a deployment's container env, vLLM
included (`launch`). The servers run in the engine's own interpreter (the vLLM venv's, say), so they
import nothing of modeldrop beyond this package."""
