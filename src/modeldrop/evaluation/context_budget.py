"""Token budgets for eval cases and the numbers inside a context-length error.

The eval does not have the model's tokenizer, so it estimates from UTF-8 bytes: prompts at the
optimistic ~4 bytes per token (so a case is never refused on a guess that it is too long), answers
at a pessimistic ~3 bytes per token plus a margin (so the derived max_tokens does not cut them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

PROMPT_BYTES_PER_TOKEN = 4.0
ANSWER_BYTES_PER_TOKEN = 3.0
ANSWER_MARGIN = 1.5
ANSWER_SLACK_TOKENS = 32
TEMPLATE_TOKENS_PER_MESSAGE = 4
DEFAULT_MAX_TOKENS = 512


def estimate_prompt_tokens(messages: list[dict[str, str]]) -> int:
    text_bytes = sum(len(m["content"].encode()) for m in messages)
    return math.ceil(text_bytes / PROMPT_BYTES_PER_TOKEN) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)


def estimate_answer_tokens(reference: str) -> int:
    return max(1, math.ceil(len(reference.encode()) / ANSWER_BYTES_PER_TOKEN))


@dataclass(frozen=True)
class CaseBudget:
    max_tokens: int | None
    source: str  # "case", "reference", "default"
    refused: str | None = None  # why the case cannot be sent at all


def budget_for(
    messages: list[dict[str, str]],
    case_max_tokens: int | None,
    reference: str | None,
    ceiling: int,
    max_model_len: int | None,
) -> CaseBudget:
    """max_tokens for one case: the case's own, else the reference's length with a margin, else a default.

    Derived values are capped by the invocation-time ceiling and by the room the context leaves.
    """
    prompt = estimate_prompt_tokens(messages)
    needed = 1
    if case_max_tokens is not None:
        max_tokens, source, needed = case_max_tokens, "case", case_max_tokens
    elif reference:
        needed = estimate_answer_tokens(reference)
        max_tokens = min(math.ceil(needed * ANSWER_MARGIN) + ANSWER_SLACK_TOKENS, ceiling)
        source = "reference"
    else:
        max_tokens, source = min(DEFAULT_MAX_TOKENS, ceiling), "default"
    if max_model_len is not None:
        room = max_model_len - prompt
        if room < needed:
            return CaseBudget(
                None,
                source,
                refused=(
                    f"prompt ~{prompt} tokens + {needed} {'requested' if source == 'case' else 'needed'} "
                    f"> max_model_len {max_model_len}"
                ),
            )
        max_tokens = min(max_tokens, room)
    return CaseBudget(max_tokens, source)


@dataclass(frozen=True)
class ContextOverflow:
    limit: int
    prompt_tokens: int | None
    requested_tokens: int | None

    def describe(self, endpoint_name: str, configured_max_model_len: int | None) -> str:
        parts = [f"context limit {self.limit} tokens"]
        if self.prompt_tokens is not None:
            parts.append(f"prompt {self.prompt_tokens}")
        if self.requested_tokens is not None:
            parts.append(f"requested {self.requested_tokens}")
        text = f"{', '.join(parts)} on endpoint {endpoint_name}"
        if configured_max_model_len is not None and configured_max_model_len != self.limit:
            text += (
                f" - but {endpoint_name} is configured with max_model_len {configured_max_model_len}: "
                "the answer came from a different model server than the one intended"
            )
        elif configured_max_model_len is not None:
            text += " (its configured max_model_len)"
        return text


_INT = r"(\d[\d,]*)"
_PATTERNS = [
    # vLLM 0.6-0.9's wording
    re.compile(
        rf"maximum context length is {_INT} tokens\. However, you requested {_INT} output tokens and your prompt "
        rf"contains at least {_INT} input tokens",
        re.S,
    ),
    # vLLM <= 0.5: "you requested 5000 tokens (4000 in the messages, 1000 in the completion)"
    re.compile(
        rf"maximum context length is {_INT} tokens\. However, you requested \d[\d,]* tokens \({_INT} in the "
        rf"messages, {_INT} in the completion\)",
        re.S,
    ),
    # vLLM >= 0.10
    re.compile(
        rf"is too large: {_INT}\. This model's maximum context length is {_INT} tokens and your request has "
        rf"{_INT} input tokens",
        re.S,
    ),
    # vLLM, prompt alone too long
    re.compile(rf"maximum context length is {_INT} tokens\. However, your request has {_INT} input tokens", re.S),
    # SGLang
    re.compile(
        rf"maximum context length of {_INT} tokens\. You requested a total of \d[\d,]* tokens: {_INT} tokens from "
        rf"the input messages and {_INT} tokens for the completion",
        re.S,
    ),
    re.compile(rf"The input \({_INT} tokens\) is longer than the model's context length \({_INT} tokens\)", re.S),
]


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def parse_context_overflow(message: str) -> ContextOverflow | None:
    """The numbers in a context-length error from vLLM or SGLang, or None if it is not one."""
    for index, pattern in enumerate(_PATTERNS):
        m = pattern.search(message)
        if m is None:
            continue
        g = [_n(x) for x in m.groups()]
        if index == 0:
            return ContextOverflow(limit=g[0], prompt_tokens=g[2], requested_tokens=g[1])
        if index == 1:
            return ContextOverflow(limit=g[0], prompt_tokens=g[1], requested_tokens=g[2])
        if index == 2:
            return ContextOverflow(limit=g[1], prompt_tokens=g[2], requested_tokens=g[0])
        if index == 3:
            return ContextOverflow(limit=g[0], prompt_tokens=g[1], requested_tokens=None)
        if index == 4:
            return ContextOverflow(limit=g[0], prompt_tokens=g[1], requested_tokens=g[2])
        return ContextOverflow(limit=g[1], prompt_tokens=g[0], requested_tokens=None)
    return None
