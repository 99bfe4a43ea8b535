"""The emulated AWS services: moto 5.2.5, patched to be at least as strict as AWS, plus what moto lacks
(inference components, UpdateEndpoint, IAM enforcement and simulation). `moto_shims.install()` applies
every patch once per process; each service's own rules live in its own place:
- `s3/`: copy checksums, preconditions, bucket policies, and file-backed object bodies.
- `stepfunctions`: definitions and Wait states the service refuses, status-change events.
- `iam/`: policy evaluation, the Service Authorization Reference, per-call enforcement, the simulator.
- `sagemaker/`: endpoint hosting (a real server process per endpoint), inference components and their
  copies (scaled to zero and back), blue/green UpdateEndpoint, and the sagemaker-runtime endpoint with
  event-stream framing.
- `autoscaling/`: Application Auto Scaling of component copies and the CloudWatch alarms driving it,
  evaluated on the emulator's clock from the metrics the emulated SageMaker publishes.
Imports `engines` and `faults`, never `stack` or `scenarios`.
"""
