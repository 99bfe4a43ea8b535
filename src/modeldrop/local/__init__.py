"""The laptop path: the real ASL and handlers over an emulated AWS account (needs the `local` extra).
Never shipped in the Lambda layer. May import anything in modeldrop except `cli`.

Its parts, each importing only the ones listed before it (tests/contracts/test_layout.py holds
that order):
- `faults`: the names of the failures `run-local --fault` plays (data; the emulator reads them too).
- `samples/`: generated checkpoints and adapters (the sample Gemma-4, the CPU Llama, PEFT adapters).
- `engines/`: the local model servers behind the container contract (reference, transformers, vLLM)
  and how a container process is launched for each.
- `emulator/`: the emulated AWS services over moto, each as strict as its API reference: `s3/`,
  `stepfunctions`, `iam/` (policies, the Service Authorization Reference, enforcement, the simulator),
  `sagemaker/` (hosting of endpoints and inference components, UpdateEndpoint, sagemaker-runtime);
  `moto_shims` installs them all.
- `stack/`: the SAM stack built inside the emulator from template.yaml, and `modeldrop local up`.
- `scenarios/`: `run-local` itself: inputs, the faults that reshape the account, a shared deployment's
  and a channel's day, clean stops on a signal.
"""
