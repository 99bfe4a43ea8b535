"""A PEFT LoRA adapter against the base it is meant for: adapter_config.json as PEFT reads it
(`peft_rules`), the fit of its tensors to the base (`adapter_rules`), the base's linear weights as a
LoRA sees them, dense or quantized (`quantized_base`), and what it brings beside its tensors
(`adapter_companions`). The report that puts them together is `checkpoint.adapter_validation`.

May import: `contracts`, `checkpoint.headers`, `checkpoint.archive`, `checkpoint.chat`.
"""
