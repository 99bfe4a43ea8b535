"""The weights against config.json: the dimensions the engines derive (`model_dims`), the rules that
need no per-architecture table (`weight_rules`), which files the engines load (`layout_rules`),
quantization and rope (`quant_rules`), hybrid layers (`hybrid_layers`), per-architecture rules
(`architecture_rules`), config fields as the libraries type them (`config_rules`), and a fine-tune
against its base (`base_compare`).

May import: `contracts`, `serving`, `checkpoint.headers`, `checkpoint.archive`.
"""
