"""The transformers engine: real CPU generation behind the container contract, for small checkpoints.

Same HTTP surface as the reference engine (OpenAI chat with SSE, LMI's inputs schema, vLLM's
context-length 400), but the answer comes from the checkpoint's own weights and tokenizer via
transformers' `generate` (greedy). Needs torch + transformers in the interpreter that runs it:
the hosting emulator uses MODELDROP_TORCH_PYTHON when set, so the tool's own venv needs neither.
"""

from __future__ import annotations

import json
from typing import Any

from modeldrop.local.reference_engine import MAX_LEN_KEYS, Engine, log, serve


class TransformersEngine(Engine):
    def load(self) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config_path = self.model_dir / "config.json"
        config = json.loads(config_path.read_text())
        text = config.get("text_config") or config
        configured = next((self.env[k] for k in MAX_LEN_KEYS if self.env.get(k)), None)
        self.max_model_len = int(configured or text.get("max_position_embeddings") or 2048)
        hf_config = AutoConfig.from_pretrained(self.model_dir)
        model_class: Any = AutoModelForCausalLM
        if hf_config.model_type == "gemma4":
            from transformers import Gemma4ForConditionalGeneration

            model_class = Gemma4ForConditionalGeneration
        log(f"Loading {hf_config.model_type} from {self.model_dir} with transformers on CPU")
        self.model = model_class.from_pretrained(self.model_dir, dtype=torch.bfloat16).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.torch = torch
        log(f"Maximum model length: {self.max_model_len}; served model name: {self.name}")
        self.ready.set()
        log("Application startup complete.")

    def chat_prompt(self, messages: list[dict[str, Any]]) -> tuple[Any, int]:
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        return ids, len(ids)

    def text_prompt(self, text: str) -> tuple[Any, int]:
        ids = list(self.tokenizer(text)["input_ids"])
        return ids, len(ids)

    def generate(self, prompt_text: Any, prompt: int, max_tokens: int | None) -> tuple[list[str], str, int]:
        limit = self.max_model_len - prompt if max_tokens is None else int(max_tokens)
        inputs = self.torch.tensor([prompt_text])
        with self.torch.no_grad():
            output = self.model.generate(inputs, max_new_tokens=limit, do_sample=False)
        new = [int(t) for t in output[0][inputs.shape[1] :]]
        eos = self.tokenizer.eos_token_id
        if eos is not None and eos in new:
            new = new[: new.index(eos)]
            return [self.tokenizer.decode([t]) for t in new], "stop", len(new) + 1
        finish = "length" if len(new) >= limit else "stop"
        return [self.tokenizer.decode([t]) for t in new], finish, len(new)


def main(argv: list[str] | None = None) -> None:
    serve(TransformersEngine, "transformers", argv)


if __name__ == "__main__":
    main()
