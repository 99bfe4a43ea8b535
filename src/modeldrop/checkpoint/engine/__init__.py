"""The engine's own verdict on a checkpoint directory: `engine_check` starts `engine_probe` in the
engine's interpreter (vLLM's own ModelConfig, model class and weight loader on the meta device) and
turns its answer into findings.

May import: `contracts`, `serving`, `checkpoint.weights` (each release's own lists), `checkpoint.archive` (the
scan a skeleton is written from). `engine_probe`
imports nothing of modeldrop: it runs in another interpreter.
"""
