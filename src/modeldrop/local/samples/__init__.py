"""Generated inputs: a small but structurally real Gemma-4-style checkpoint (`checkpoint`), PEFT LoRA
adapters for it (`adapter`), and a Llama the real vLLM serves on a CPU with answers written into its
weights (`cpu_checkpoint`). Used by run-local and the tests; imports nothing else of `local`."""
