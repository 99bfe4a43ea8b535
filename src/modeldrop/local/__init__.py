"""The laptop path: the real ASL and handlers over moto (needs the `local` extra): the emulated stack,
the moto shims that make it as strict as AWS, the hosting emulator and its engines, the local
sagemaker-runtime with event-stream framing, sample checkpoints, and `run-local` itself.

May import: anything in modeldrop except `cli`. Never shipped in the Lambda layer.
"""
