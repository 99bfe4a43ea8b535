"""Is this checkpoint loadable? Everything judged before any GPU, read without extracting anything.

Its parts, each importing only the ones listed before it (tests/contracts/test_layout.py holds that
order):
- `headers/`: the safetensors header, parsed as strictly as the reference parser (its JSON as
  serde_json reads it).
- `archive/`: reading an artifact once without extracting it: the strict tar and gzip readers, PAX
  headers, parallel inflation, the archive rules, the directory / archive / S3 scan (`ArtifactScan`).
- `weights/`: the weights against config.json: dimensions as the engines derive them, layouts the
  engines load, quantization and rope, hybrid layers, per-architecture rules, config fields, the
  comparison with a base checkpoint.
- `chat/`: the chat contract (the model must be able to stop): side files, vocabulary lookups, the chat
  template rendered as transformers renders it, in a bounded child.
- `adapters/`: a PEFT LoRA adapter against its base: adapter_config.json as PEFT reads it, the base's
  linear weights as a LoRA sees them, what the adapter brings beside its tensors.
- `engine/`: the engine's own verdict (`engine_check`, and `engine_probe`, which runs in the engine's
  interpreter).
- this package's own modules, which put the parts together: the checks (`checkpoint_checks`), the
  report (`validation_report`), `validation` and `adapter_validation`, and `repair`.

May import: `contracts`, `serving` (engine versions, the memory plan's data). Reads S3 only through
a client the caller passes (no boto3 of its own).
"""
