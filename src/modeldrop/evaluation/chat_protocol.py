"""Request bodies and answers of the two schemas the serving containers speak.

`chat` is the OpenAI chat-completions schema (vLLM, SGLang and LMI all serve it);
`lmi` is LMI's own `{"inputs", "parameters"}` schema. Streaming uses the chat schema's SSE chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Schema = Literal["chat", "lmi"]


class ProtocolError(ValueError):
    """The container answered 200 with something that is not a completion."""


@dataclass
class Completion:
    text: str
    finish_reason: str | None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def render_prompt(messages: list[dict[str, str]]) -> str:
    """A plain transcript for the `inputs` schema, which takes text, not messages."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    return "\n".join([*lines, "assistant:"])


def build_body(
    schema: Schema,
    messages: list[dict[str, str]],
    max_tokens: int,
    stream: bool,
    model: str | None = None,
    adapter_field: str = "model",
) -> dict[str, Any]:
    """The request body; MODEL names a LoRA adapter: in OpenAI's `model` field, or in LMI's `adapters`
    list (ADAPTER_FIELD "adapters", which LMI reads in either schema)."""
    if schema == "lmi":
        lmi: dict[str, Any] = {
            "inputs": render_prompt(messages),
            "parameters": {"max_new_tokens": max_tokens, "do_sample": False, "details": True},
        }
        if model:
            lmi["adapters"] = [model]
        return lmi
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if model:
        body.update({"adapters": [model]} if adapter_field == "adapters" else {"model": model})
    if stream:
        # Without include_usage a stream carries no token counts.
        body.update(stream=True, stream_options={"include_usage": True})
    return body


def parse_completion(schema: Schema, raw: bytes) -> Completion:
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError(f"response is not JSON: {raw[:200]!r}") from None
    if schema == "lmi":
        return _parse_lmi(payload)
    if not isinstance(payload, dict) or "choices" not in payload:
        message = (payload.get("message") or payload.get("error")) if isinstance(payload, dict) else payload
        raise ProtocolError(f"not a chat completion: {str(message)[:300]}")
    try:
        choice = payload["choices"][0]
        text = choice["message"]["content"] or ""
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError):
        raise ProtocolError("response is not an OpenAI chat completion") from None
    usage = payload.get("usage") or {}
    return Completion(text, finish, usage.get("prompt_tokens"), usage.get("completion_tokens"))


def _parse_lmi(payload: Any) -> Completion:
    if isinstance(payload, list) and payload:
        payload = payload[0]
    if not isinstance(payload, dict) or "generated_text" not in payload:
        raise ProtocolError(f"not an LMI generation: {str(payload)[:300]}")
    details = payload.get("details") or {}
    finish = details.get("finish_reason")
    # LMI says "length" like OpenAI; TGI-style containers say "max_new_tokens".
    if finish == "max_new_tokens":
        finish = "length"
    return Completion(
        str(payload["generated_text"]), finish, details.get("prompt_tokens"), details.get("generated_tokens")
    )


@dataclass
class StreamAssembler:
    """Folds chat-completion chunks into one Completion."""

    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    chunks: int = 0

    def add(self, data: str) -> str:
        """Add one event's data; returns the text it carried (empty for role/usage chunks)."""
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            raise ProtocolError(f"stream event is not JSON: {data[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise ProtocolError(f"stream event is not an object: {data[:200]!r}")
        if "error" in chunk and "choices" not in chunk:
            error = chunk["error"]
            raise ProtocolError(f"error event in stream: {error.get('message') if isinstance(error, dict) else error}")
        self.chunks += 1
        usage = chunk.get("usage") or {}
        self.prompt_tokens = usage.get("prompt_tokens", self.prompt_tokens)
        self.completion_tokens = usage.get("completion_tokens", self.completion_tokens)
        text = ""
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text += delta.get("content") or ""
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        self.parts.append(text)
        return text

    def completion(self) -> Completion:
        return Completion("".join(self.parts), self.finish_reason, self.prompt_tokens, self.completion_tokens)
