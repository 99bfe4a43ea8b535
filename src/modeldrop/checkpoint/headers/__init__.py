"""The safetensors header: parsed as strictly as the reference implementation (`safetensors_header`),
its JSON read as serde_json reads it (`header_json`). The ground floor of `checkpoint`.

May import: nothing of modeldrop.
"""
