"""The reference engine: a deterministic, weight-free model server that speaks the container contract.

It is not a language model. It reads the model directory the way an engine starts (config.json,
the safetensors headers), then answers `/ping` and `/invocations` with the protocol behaviour the
eval depends on: OpenAI chat completions with and without SSE streaming, LMI's inputs/parameters
schema, `finish_reason == "length"` exactly when max_tokens cuts the answer, vLLM's context-length
400, usage counts, and a per-token latency. Its answer text is a deterministic function of the
prompt, so the same run gives the same answers.

Standard library only: it starts in a fraction of a second as its own process.

Settings come from the container env the deployment built (max model length, served model name)
and from MODELDROP_REFERENCE_* variables (latency, load time, faults) set by the local hosting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import struct
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from modeldrop.local.engines.http_base import StreamingJSONHandler

_TOKEN = re.compile(r"\w+|[^\w\s]")
# A few multi-byte words so that streamed answers split UTF-8 characters across chunks.
_WORDS = tuple(
    [
        "the",
        "model",
        "answers",
        "this",
        "request",
        "with",
        "a",
        "short",
        "deterministic",
        "reply",
        "drawn",
        "from",
        "a",
        "fixed",
        "vocabulary",
        "so",
        "that",
        "every",
        "run",
        "of",
        "the",
        "same",
        "prompt",
        "gives",
        "the",
        "same",
        "tokens",
        "and",
        "counts",
        "café",
        "naïve",
        "모델",
        "응답",
    ]
)
MAX_LEN_KEYS = ("SM_VLLM_MAX_MODEL_LEN", "SM_SGLANG_CONTEXT_LENGTH", "OPTION_MAX_MODEL_LEN")
# How SageMaker tells the container which adapter inference component an invocation named.
ADAPTER_HEADER = "X-Amzn-SageMaker-Adapter-Identifier"
_NAME_KEYS = ("SM_VLLM_SERVED_MODEL_NAME", "SM_SGLANG_SERVED_MODEL_NAME", "OPTION_SERVED_MODEL_NAME")
TRUNCATE_AT = 8

OOM_LINE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of "
    "21.96 GiB of which 301.56 MiB is free. Including non-PyTorch memory, this process has 21.66 GiB memory in use."
)


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    # A chat template adds a few tokens per turn and the generation prompt.
    return sum(count_tokens(str(m.get("content", ""))) + 4 for m in messages) + 3


def answer_tokens(prompt: str) -> list[str]:
    """The reply: 12-31 tokens chosen by the prompt's hash, ending in a full stop."""
    digest = hashlib.sha256(prompt.encode()).digest()
    length = 12 + digest[0] % 20
    words = [_WORDS[(digest[i % 32] + i) % len(_WORDS)] for i in range(length - 1)]
    tokens = [(" " if i else "") + w for i, w in enumerate(words)]
    tokens[0] = tokens[0].capitalize()
    return [*tokens, "."]


@dataclass
class Generation:
    """Tokens as they are produced; `finish` and `count` are final once `tokens` is exhausted."""

    tokens: Iterator[str]
    finish: str = "stop"
    count: int = 0


class Engine:
    def __init__(self, model_dir: Path, env: dict[str, str]) -> None:
        self.model_dir = model_dir
        self.env = env
        self.ready = threading.Event()
        self.ms_per_token = float(env.get("MODELDROP_REFERENCE_MS_PER_TOKEN", "2"))
        self.fault = env.get("MODELDROP_REFERENCE_FAULT", "")
        self.max_model_len = 0
        self.name = next((env[k] for k in _NAME_KEYS if env.get(k)), str(model_dir))
        # LoRA adapters served beside the base: name -> what keys its answers (its weights' digest).
        self.adapters: dict[str, str] = {}

    def load(self) -> None:
        """Read what an engine reads at start; exit like one when the checkpoint is unusable."""
        config_path = self.model_dir / "config.json"
        if not config_path.is_file():
            log(f"ValueError: no config.json in {self.model_dir}")
            sys.exit(1)
        config = json.loads(config_path.read_text())
        text = config.get("text_config") or config
        configured = next((self.env[k] for k in MAX_LEN_KEYS if self.env.get(k)), None)
        self.max_model_len = int(configured or text.get("max_position_embeddings") or 2048)
        params = 0
        shards = sorted(self.model_dir.rglob("*.safetensors"))
        for shard in shards:
            with shard.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n))
            for key, spec in header.items():
                if key != "__metadata__":
                    count = 1
                    for dim in spec["shape"]:
                        count *= dim
                    params += count
        log(f"Loading model weights from {self.model_dir}: {len(shards)} shard(s), {params} parameters")
        time.sleep(float(self.env.get("MODELDROP_REFERENCE_LOAD_SECONDS", "0.1")))
        if self.fault == "oom":
            log("Traceback (most recent call last):")
            log(
                '  File "/usr/local/lib/python3.12/site-packages/vllm/worker/worker.py", line 242, '
                "in determine_num_available_blocks"
            )
            log(OOM_LINE)
            sys.exit(1)
        self._load_adapters()
        log(f"Maximum model length: {self.max_model_len}; served model name: {self.name}")
        self.ready.set()
        log("Application startup complete.")

    def _load_adapters(self) -> None:
        """The adapters the env names (vLLM --lora-modules, SGLang --lora-paths), or LMI's adapters/ folder;
        an adapter that is not there fails the start, as the engines fail it."""
        named = self.env.get("SM_VLLM_LORA_MODULES") or self.env.get("SM_SGLANG_LORA_PATHS") or ""
        pairs = [item.split("=", 1) for item in named.split() if "=" in item]
        if self.env.get("OPTION_ENABLE_LORA") == "true" and (self.model_dir / "adapters").is_dir():
            pairs += [
                [d.name, f"/opt/ml/model/adapters/{d.name}"] for d in sorted((self.model_dir / "adapters").iterdir())
            ]
        for name, path in pairs:
            local = self.model_dir / path.removeprefix("/opt/ml/model").lstrip("/")
            weights = local / "adapter_model.safetensors"
            if not weights.is_file() or not (local / "adapter_config.json").is_file():
                log(f"ValueError: Loading lora {name} failed: No adapter found for {path}")
                sys.exit(1)
            rank = json.loads((local / "adapter_config.json").read_text()).get("r")
            with weights.open("rb") as fh:
                self.adapters[name] = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
            log(f"Loaded LoRA adapter {name} from {path} (rank {rank})")

    def register_adapter(self, name: str, src: str) -> tuple[int, str]:
        """SageMaker's LoRA API: load the adapter at SRC (an adapter component's extracted artifact)
        under NAME; (status, message) as the container answers."""
        local = Path(src)
        weights = local / "adapter_model.safetensors"
        if not weights.is_file() or not (local / "adapter_config.json").is_file():
            return 400, f"Loading lora {name} failed: No adapter found for {src}"
        rank = json.loads((local / "adapter_config.json").read_text()).get("r")
        if self.fault == "adapter-load" and self.adapters:
            message = f"Loading lora {name} failed: LoRA rank {rank} is greater than max_lora_rank"
            log(f"ValueError: {message}")
            return 400, message
        with weights.open("rb") as fh:
            self.adapters[name] = hashlib.sha256(fh.read(1 << 20)).hexdigest()[:16]
        log(f"Loaded LoRA adapter {name} from {src} (rank {rank})")
        return 200, f"Adapter {name} registered"

    def unregister_adapter(self, name: str) -> tuple[int, str]:
        if self.adapters.pop(name, None) is None:
            return 404, f"Adapter {name} not found"
        log(f"Unloaded LoRA adapter {name}")
        return 200, f"Adapter {name} unregistered"

    def adapter_key(self, model: Any) -> str | None:
        """'' for the base, the adapter's key for an adapter's name, None for a name not served."""
        if model in (None, "", self.name):
            return ""
        return self.adapters.get(str(model))

    def not_found(self, model: Any) -> dict[str, Any]:
        message = f"The model `{model}` does not exist."
        return {"object": "error", "message": message, "type": "NotFoundError", "param": None, "code": 404}

    def context_error(self, prompt: int, requested: int) -> dict[str, Any]:
        message = (
            f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
            f"{requested} output tokens and your prompt contains at least {prompt} input tokens, for a total of "
            f"at least {prompt + requested} tokens. Please reduce the length of the input prompt or the number "
            "of requested output tokens."
        )
        return {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}

    def chat_prompt(self, messages: list[dict[str, Any]]) -> tuple[Any, int]:
        """(what generate() takes, prompt token count) for chat messages."""
        return json.dumps(messages, sort_keys=True), prompt_tokens(messages)

    def text_prompt(self, text: str) -> tuple[Any, int]:
        return text, count_tokens(text)

    def generate(self, prompt_input: Any, prompt: int, max_tokens: int | None, adapter: str = "") -> Generation:
        """The answer: keyed on the prompt, and on the adapter's weights when one is named."""
        room = self.max_model_len - prompt
        limit = room if max_tokens is None else max_tokens
        if self.fault == "truncate":
            limit = min(limit, TRUNCATE_AT)
        tokens = answer_tokens(f"{adapter}\n{prompt_input}" if adapter else prompt_input)
        finish = "length" if len(tokens) > limit else "stop"
        tokens = tokens[:limit]

        def produce() -> Iterator[str]:
            for token in tokens:
                time.sleep(self.ms_per_token / 1000)
                yield token

        return Generation(produce(), finish, len(tokens))


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Handler(StreamingJSONHandler):
    engine: Engine

    def log_message(self, format: str, *args: Any) -> None:
        log(f'INFO:     {self.address_string()} - "{self.requestline}" {args[1] if len(args) > 1 else ""}')

    def _json(self, status: int, body: Any) -> None:
        self.send_json(status, body)

    def do_GET(self) -> None:
        if self.path == "/ping":
            if self.engine.ready.is_set():
                self._json(200, {})
            else:
                self._json(503, {"status": "loading"})
            return
        self._json(404, {"message": f"no route {self.path}"})

    def do_DELETE(self) -> None:
        name = self.path.removeprefix("/adapters/")
        if name == self.path or not name:
            self._json(404, {"message": f"no route {self.path}"})
            return
        status, message = self.engine.unregister_adapter(name)
        self._json(status, {"message": message})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path == "/adapters":
            self._register(raw)
            return
        if self.path not in ("/invocations", "/v1/chat/completions"):
            self._json(404, {"message": f"no route {self.path}"})
            return
        if not self.engine.ready.is_set():
            self._json(503, {"message": "model is loading"})
            return
        try:
            body = json.loads(raw)
            assert isinstance(body, dict)
        except (json.JSONDecodeError, AssertionError):
            self._json(400, {"object": "error", "message": "request body is not a JSON object", "code": 400})
            return
        adapter = self.headers.get(ADAPTER_HEADER)
        if adapter:  # an adapter component's invocation: the platform names the adapter
            body = {**body, "adapters": [adapter]}
        if "inputs" in body:
            self._lmi(body)
        elif isinstance(body.get("messages"), list):
            self._chat(body)
        else:
            self._json(400, {"object": "error", "message": "expected 'messages' or 'inputs'", "code": 400})

    def _register(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            name, src = str(body["name"]), str(body["src"])
        except (json.JSONDecodeError, KeyError, TypeError):
            self._json(400, {"message": 'expected {"name": ..., "src": ...}'})
            return
        if not self.engine.ready.is_set():
            self._json(503, {"message": "model is loading"})
            return
        status, message = self.engine.register_adapter(name, src)
        self._json(status, {"message": message})

    def _lmi(self, body: dict[str, Any]) -> None:
        params = body.get("parameters") or {}
        named = body.get("adapters")
        model = named[0] if isinstance(named, list) and named else None
        adapter = self.engine.adapter_key(model)
        if adapter is None:
            self._json(404, {"error": self.engine.not_found(model)["message"], "code": 404})
            return
        text, prompt = self.engine.text_prompt(str(body["inputs"]))
        max_tokens = params.get("max_new_tokens")
        if max_tokens is not None and prompt + int(max_tokens) > self.engine.max_model_len:
            self._json(400, {"error": self.engine.context_error(prompt, int(max_tokens))["message"], "code": 400})
            return
        gen = self.engine.generate(text, prompt, max_tokens, adapter)
        answer = "".join(gen.tokens)
        details = {"finish_reason": gen.finish, "generated_tokens": gen.count, "prompt_tokens": prompt}
        self._json(200, {"generated_text": answer, "details": details if params.get("details") else None})

    def _chat(self, body: dict[str, Any]) -> None:
        named = body.get("adapters")  # LMI's field, in either schema; OpenAI's `model` otherwise
        model = named[0] if isinstance(named, list) and named else body.get("model")
        adapter = self.engine.adapter_key(model)
        if adapter is None:
            self._json(404, self.engine.not_found(model))
            return
        messages = body["messages"]
        prompt_input, prompt = self.engine.chat_prompt(messages)
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is not None and prompt + int(max_tokens) > self.engine.max_model_len:
            self._json(400, self.engine.context_error(prompt, int(max_tokens)))
            return
        if prompt >= self.engine.max_model_len:
            self._json(400, self.engine.context_error(prompt, 1))
            return
        prompt_text = json.dumps(messages, sort_keys=True)
        gen = self.engine.generate(prompt_input, prompt, max_tokens, adapter)
        completion_id = "chatcmpl-" + hashlib.sha256(prompt_text.encode()).hexdigest()[:16]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            self._stream(completion_id, gen, prompt if include_usage else None)
            return
        answer = "".join(gen.tokens)
        usage = {"prompt_tokens": prompt, "completion_tokens": gen.count, "total_tokens": prompt + gen.count}
        self._json(
            200,
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.engine.name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": answer},
                        "finish_reason": gen.finish,
                    }
                ],
                "usage": usage,
            },
        )

    def _stream(self, completion_id: str, gen: Generation, prompt_for_usage: int | None) -> None:
        self.start_chunked({"Content-Type": "text/event-stream"})
        base = {"id": completion_id, "object": "chat.completion.chunk", "model": self.engine.name}

        def send(data: str) -> None:
            self.write_chunk(f"data: {data}\n\n".encode())

        def chunk(delta: dict[str, str], finish_reason: str | None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
            return json.dumps({**base, "choices": [choice]}, ensure_ascii=False)

        send(chunk({"role": "assistant", "content": ""}, None))
        for i, token in enumerate(gen.tokens):
            if self.engine.fault == "stream-break" and i == gen.count // 2:
                # The server dies mid-answer: the chunked body never gets its terminator.
                log("RuntimeError: engine core died while streaming")
                self.close_connection = True
                return
            send(chunk({"content": token}, None))
        send(chunk({}, gen.finish))
        if prompt_for_usage is not None:
            total = prompt_for_usage + gen.count
            usage = {"prompt_tokens": prompt_for_usage, "completion_tokens": gen.count, "total_tokens": total}
            send(json.dumps({**base, "choices": [], "usage": usage}))
        send("[DONE]")
        self.end_chunked()


def _exit_with_parent(parent: int) -> None:
    # The hosting emulator stops its processes; if it is killed outright, do not outlive it.
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def serve(engine_class: type[Engine], label: str, argv: list[str] | None = None) -> None:
    """Parse --port/--host/--model-dir, answer /ping at once (503 while loading), then load."""
    parser = argparse.ArgumentParser(description=f"modeldrop {label} engine")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-dir", type=Path, default=Path("/opt/ml/model"))
    args = parser.parse_args(argv)
    engine = engine_class(args.model_dir, dict(os.environ))
    Handler.engine = engine
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    log(f"INFO:     {label} engine listening on http://{args.host}:{args.port}")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    engine.load()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()


def main(argv: list[str] | None = None) -> None:
    serve(Engine, "reference", argv)


if __name__ == "__main__":
    main()
