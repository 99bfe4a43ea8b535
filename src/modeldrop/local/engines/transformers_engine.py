"""The transformers engine: real CPU generation behind the container contract, for small checkpoints.

Same HTTP surface as the reference engine (OpenAI chat with SSE, LMI's inputs schema, vLLM's
context-length 400), but the answer comes from the checkpoint's own weights and tokenizer via
transformers' greedy `generate`, streamed token by token as it is produced. Needs torch and
transformers in the interpreter that runs it: the hosting emulator uses MODELDROP_TORCH_PYTHON
when set, so the tool's own venv needs neither.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from queue import Queue
from typing import Any

from modeldrop.local.engines.reference_engine import MAX_LEN_KEYS, Engine, Generation, log, serve


class TransformersEngine(Engine):
    # One generation at a time: the active adapter is the model's state.
    _lock = threading.Lock()

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
        self._apply_adapters()
        log(f"Maximum model length: {self.max_model_len}; served model name: {self.name}")
        self.ready.set()
        log("Application startup complete.")

    def _apply_adapters(self) -> None:
        """The LoRA adapters the env names, applied with PEFT: generation through one really runs its
        lora_A/lora_B matrices (a base request runs with the adapters disabled)."""
        super()._load_adapters()  # the same names and paths, checked as the engines check them
        if not self.adapters:
            return
        from peft import PeftModel

        for index, name in enumerate(sorted(self.adapters)):
            path = self.model_dir / "adapters" / name
            if index == 0:
                self.model = PeftModel.from_pretrained(self.model, path, adapter_name=name).eval()
            else:
                self.model.load_adapter(path, adapter_name=name)
        self.adapters = {name: name for name in self.adapters}  # the key is the PEFT adapter's name

    def register_adapter(self, name: str, src: str) -> tuple[int, str]:
        """An adapter component's adapter, applied with PEFT to the running model."""
        status, message = super().register_adapter(name, src)
        if status != 200:
            return status, message
        from peft import PeftModel

        with self._lock:
            if isinstance(self.model, PeftModel):
                self.model.load_adapter(src, adapter_name=name)
            else:
                self.model = PeftModel.from_pretrained(self.model, src, adapter_name=name).eval()
        self.adapters[name] = name
        return status, message

    def unregister_adapter(self, name: str) -> tuple[int, str]:
        status, message = super().unregister_adapter(name)
        if status == 200:
            with self._lock, contextlib.suppress(ValueError):  # PEFT keeps its last adapter loaded
                self.model.delete_adapter(name)
        return status, message

    def chat_prompt(self, messages: list[dict[str, Any]]) -> tuple[Any, int]:
        encoded = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        return ids, len(ids)

    def text_prompt(self, text: str) -> tuple[Any, int]:
        ids = list(self.tokenizer(text)["input_ids"])
        return ids, len(ids)

    def generate(self, prompt_input: Any, prompt: int, max_tokens: int | None, adapter: str = "") -> Generation:
        """Greedy generation in a thread, each token handed over as the model produces it; through the
        adapter named ADAPTER, or with every adapter disabled for the base."""
        limit = self.max_model_len - prompt if max_tokens is None else int(max_tokens)
        queue: Queue[int | None] = Queue()
        streamer = _TokenQueue(queue)
        inputs = self.torch.tensor([prompt_input])

        def run() -> None:

            try:
                with self.torch.no_grad(), self._lock:
                    scope: Any = contextlib.nullcontext()
                    if self.adapters and adapter:
                        self.model.set_adapter(adapter)
                    elif self.adapters:
                        scope = self.model.disable_adapter()
                    with scope:
                        self.model.generate(inputs, max_new_tokens=limit, do_sample=False, streamer=streamer)
            finally:
                queue.put(None)

        threading.Thread(target=run, daemon=True).start()
        gen = Generation(iter(()))
        eos = self.tokenizer.eos_token_id

        def produce() -> Iterator[str]:
            while (token := queue.get()) is not None:
                gen.count += 1
                if token == eos:
                    gen.finish = "stop"
                    while queue.get() is not None:  # let the generating thread finish
                        pass
                    return
                yield self.tokenizer.decode([token])
            gen.finish = "length" if gen.count >= limit else "stop"

        gen.tokens = produce()
        return gen


class _TokenQueue:
    """A transformers streamer (put/end) that passes generated token ids on, skipping the prompt."""

    def __init__(self, queue: Queue[int | None]) -> None:
        self.queue = queue
        self.prompt_seen = False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        for token in value.reshape(-1).tolist():
            self.queue.put(int(token))

    def end(self) -> None:
        pass


def main(argv: list[str] | None = None) -> None:
    serve(TransformersEngine, "transformers", argv)


if __name__ == "__main__":
    main()
