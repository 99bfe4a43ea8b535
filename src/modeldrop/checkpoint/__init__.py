"""Is this checkpoint loadable? The safetensors header parser, the archive / directory / S3 scanner
(`artifact_scan`), the validation report (`validation`), architecture rules as data (Gemma-4
KV-shared tensors), the comparison with a base checkpoint and `repair`.

May import: `contracts`. Reads S3 only through a client the caller passes (no boto3 of its own).
"""
