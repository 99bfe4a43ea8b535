"""Truncation-aware smoke eval: eval sets, checks, per-case verdicts and the deployment verdict.

A cut answer is still HTTP 200; only finish_reason == "length" tells. Truncated predictions get
blamed on the model, so truncation is its own verdict with a recommended max_tokens. Pure: the
calls to the endpoint live in eval_runner.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from modeldrop.contracts.models import ChatMessage, EvalThresholds
from modeldrop.evaluation.chat_protocol import Completion

CaseOutcome = Literal["pass", "check_failed", "truncated", "context_overflow", "error", "timeout"]
OUTCOMES: tuple[CaseOutcome, ...] = ("pass", "check_failed", "truncated", "context_overflow", "error", "timeout")


class Checks(BaseModel):
    model_config = ConfigDict(extra="forbid")

    min_chars: int | None = Field(default=None, ge=0)
    contains: list[str] = Field(default_factory=list)
    regex: str | None = None
    valid_json: bool = False
    json_equals_reference: bool = False
    min_similarity: float | None = Field(default=None, ge=0, le=1, description="difflib ratio against the reference")

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"regex does not compile: {exc}") from None
        return value


class EvalCase(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str
    messages: list[ChatMessage] = Field(min_length=1)
    reference: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    checks: Checks = Field(default_factory=Checks)

    def message_dicts(self) -> list[dict[str, str]]:
        return [m.model_dump() for m in self.messages]


class CaseResult(BaseModel):
    id: str
    outcome: CaseOutcome
    max_tokens: int | None
    max_tokens_source: str = "case"
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    latency_s: float | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None
    attempts: int = 1
    detail: str = ""
    recommended_max_tokens: int | None = None
    answer_preview: str = ""
    # Of the whole answer (the preview is cut): what a champion/challenger gate compares.
    answer_chars: int | None = None
    answer_is_json: bool | None = None


class Timing(BaseModel):
    latency_s: float
    ttft_s: float | None = None
    attempts: int = 1


class Percentiles(BaseModel):
    p50: float | None
    p90: float | None


class EvalReport(BaseModel):
    endpoint_name: str
    max_model_len: int | None
    streaming: bool
    schema_name: str
    passed: bool
    counts: dict[str, int]
    cases: list[CaseResult]
    thresholds: EvalThresholds
    ttft_s: Percentiles
    latency_s: Percentiles
    tokens_per_s: Percentiles
    summary: str
    fixes: list[str] = Field(default_factory=list)


def recommended_max_tokens(used: int) -> int:
    """Twice what the cut answer already used, rounded up to a multiple of 64."""
    return int(math.ceil(2 * max(used, 1) / 64) * 64)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def judge(case: EvalCase, max_tokens: int, source: str, completion: Completion, timing: Timing) -> CaseResult:
    """Verdict on a completed answer (the call itself succeeded)."""
    tokens = completion.completion_tokens
    gen_seconds = timing.latency_s - (timing.ttft_s or 0.0)
    rate = round(tokens / gen_seconds, 2) if tokens and gen_seconds > 0 else None
    result = CaseResult(
        id=case.id,
        outcome="pass",
        max_tokens=max_tokens,
        max_tokens_source=source,
        finish_reason=completion.finish_reason,
        completion_tokens=tokens,
        prompt_tokens=completion.prompt_tokens,
        latency_s=round(timing.latency_s, 4),
        ttft_s=None if timing.ttft_s is None else round(timing.ttft_s, 4),
        tokens_per_s=rate,
        attempts=timing.attempts,
        answer_preview=completion.text[:200],
        answer_chars=len(completion.text),
        answer_is_json=_is_json(completion.text),
    )
    if completion.finish_reason == "length":
        used = tokens or max_tokens
        result.outcome = "truncated"
        if used < max_tokens:
            # The request allowed more: the server's own limit cut the answer, not max_tokens.
            result.detail = (
                f"answer cut after {used} tokens although max_tokens={max_tokens} (HTTP 200, finish_reason=length): "
                "a server-side limit stopped it (generation_config max_new_tokens, or the context window); "
                "raising max_tokens will not help"
            )
            return result
        result.recommended_max_tokens = recommended_max_tokens(used)
        result.detail = (
            f"answer cut at max_tokens={max_tokens} (HTTP 200, finish_reason=length); "
            f"raise max_tokens to {result.recommended_max_tokens}"
        )
        return result
    failure = run_checks(case, completion.text)
    if failure:
        result.outcome, result.detail = "check_failed", failure
    return result


def run_checks(case: EvalCase, text: str) -> str | None:
    checks = case.checks
    if checks.min_chars is not None and len(text.strip()) < checks.min_chars:
        return f"answer shorter than {checks.min_chars} characters"
    for needle in checks.contains:
        if needle not in text:
            return f"answer does not contain {needle!r}"
    if checks.regex and not re.search(checks.regex, text):
        return f"answer does not match /{checks.regex}/"
    if checks.valid_json or checks.json_equals_reference:
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return f"answer is not valid JSON: {exc}"
        if checks.json_equals_reference and value != json.loads(case.reference or "null"):
            return "answer's JSON differs from the reference"
    if checks.min_similarity is not None:
        ratio = difflib.SequenceMatcher(None, text.strip(), (case.reference or "").strip()).ratio()
        if ratio < checks.min_similarity:
            return f"similarity to the reference {ratio:.2f} < {checks.min_similarity:.2f}"
    return None


def percentiles(values: list[float]) -> Percentiles:
    if not values:
        return Percentiles(p50=None, p90=None)
    ordered = sorted(values)

    def at(q: float) -> float:
        # Nearest-rank: a small eval set must not report a value no case had.
        return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 4)

    return Percentiles(p50=at(0.5), p90=at(0.9))


def error_count(counts: dict[str, int]) -> int:
    """Cases that got no usable answer: what the max_errors threshold counts."""
    return counts["error"] + counts["timeout"] + counts["context_overflow"]


# The summary's label for each outcome that is not a pass, in the order the summary lists them.
FAILURE_LABELS = {
    "truncated": "truncated",
    "context_overflow": "context overflow",
    "timeout": "timeouts",
    "error": "errors",
    "check_failed": "checks failed",
}
FIXED_ADVICE = {
    "timeout": "answers past the 60 s invocation cap: lower max_tokens, stream, or use async inference",
    "error": "see each error's detail and the endpoint's CloudWatch logs",
    "check_failed": "the model's answers fail the case checks: this is the model, not the serving",
}


def _truncation_advice(cut: list[CaseResult]) -> list[str]:
    advice = []
    if by_request := [r for r in cut if r.recommended_max_tokens is not None]:
        recs = ", ".join(f"{r.id}: {r.recommended_max_tokens}" for r in by_request)
        advice.append(f"raise max_tokens for the truncated cases ({recs}) in the eval set")
    if by_server := [r.id for r in cut if r.recommended_max_tokens is None]:
        advice.append(
            f"{', '.join(by_server)} stopped below their max_tokens: look for a server-side cap "
            "(generation_config.json max_new_tokens, an override-generation-config env, or max_model_len)"
        )
    return advice


def _failure_notes(
    results: list[CaseResult], endpoint_name: str, max_model_len: int | None
) -> tuple[list[str], list[str]]:
    """The summary's part for each failing outcome, and the fixes they suggest."""
    notes: list[str] = []
    fixes: list[str] = []
    for outcome, label in FAILURE_LABELS.items():
        cases = [r for r in results if r.outcome == outcome]
        if not cases:
            continue
        notes.append(f"{label}: {', '.join(r.id for r in cases)}")
        if outcome == "truncated":
            fixes += _truncation_advice(cases)
        elif outcome == "context_overflow":
            fixes.append(
                f"the prompts do not fit max_model_len {max_model_len} of {endpoint_name}: shorten them, raise "
                "max_model_len in the request, or check that this is the endpoint you meant"
            )
        else:
            fixes.append(FIXED_ADVICE[outcome])
    return notes, fixes


def verdict(
    endpoint_name: str,
    results: list[CaseResult],
    thresholds: EvalThresholds,
    max_model_len: int | None = None,
    streaming: bool = False,
    schema_name: str = "chat",
) -> EvalReport:
    counts: dict[str, int] = {o: sum(1 for r in results if r.outcome == o) for o in OUTCOMES}
    errors = error_count(counts)
    passed = (
        counts["truncated"] <= thresholds.max_truncated
        and errors <= thresholds.max_errors
        and counts["check_failed"] <= thresholds.max_check_failures
    )
    notes, fixes = _failure_notes(results, endpoint_name, max_model_len)
    parts = [f"{counts['pass']}/{len(results)} passed", *notes]
    return EvalReport(
        endpoint_name=endpoint_name,
        max_model_len=max_model_len,
        streaming=streaming,
        schema_name=schema_name,
        passed=passed,
        counts=counts,
        cases=results,
        thresholds=thresholds,
        ttft_s=percentiles([r.ttft_s for r in results if r.ttft_s is not None]),
        latency_s=percentiles([r.latency_s for r in results if r.latency_s is not None]),
        tokens_per_s=percentiles([r.tokens_per_s for r in results if r.tokens_per_s is not None]),
        summary="; ".join(parts),
        fixes=fixes,
    )
