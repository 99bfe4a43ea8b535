"""Truncation-aware smoke eval: pure request building, response parsing and verdicts.

A cut answer is still HTTP 200; only finish_reason == "length" tells. Truncated predictions get
blamed on the model, so truncation is its own verdict with a recommended max_tokens.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from modeldrop.errors import RequestInvalid, describe_validation
from modeldrop.models import ChatMessage, EvalThresholds

CaseOutcome = Literal["pass", "check_failed", "truncated", "context_overflow", "error", "timeout"]


class Checks(BaseModel):
    min_chars: int | None = None
    contains: list[str] = Field(default_factory=list)
    regex: str | None = None
    valid_json: bool = False


class EvalCase(BaseModel):
    id: str
    messages: list[ChatMessage]
    reference: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    checks: Checks = Field(default_factory=Checks)


class CaseResult(BaseModel):
    id: str
    outcome: CaseOutcome
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    max_tokens: int
    latency_s: float | None = None
    detail: str = ""
    recommended_max_tokens: int | None = None


class EvalReport(BaseModel):
    endpoint_name: str
    passed: bool
    cases: list[CaseResult]
    thresholds: EvalThresholds
    summary: str


def parse_eval_set(text: str, source: str) -> list[EvalCase]:
    cases: list[EvalCase] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            cases.append(EvalCase.model_validate_json(line))
        except ValidationError as exc:
            raise RequestInvalid(
                f"{source} line {lineno}: {describe_validation(exc)}", "each line is a JSON object with id and messages"
            ) from None
    if not cases:
        raise RequestInvalid(f"{source} has no eval cases")
    return cases


def default_eval_set() -> list[EvalCase]:
    text = resources.files("modeldrop").joinpath("data/default_eval.jsonl").read_text()
    return parse_eval_set(text, "default eval set")


def chat_request(case: EvalCase, max_tokens: int) -> dict[str, Any]:
    return {
        "messages": [m.model_dump() for m in case.messages],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def judge(case: EvalCase, max_tokens: int, body: bytes, latency_s: float | None) -> CaseResult:
    """Verdict on a 200 answer; invoke_endpoint raises for every other status."""
    base: dict[str, Any] = {"id": case.id, "max_tokens": max_tokens, "latency_s": latency_s}
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return CaseResult(outcome="error", detail=f"response is not JSON: {body[:200]!r}", **base)
    if not isinstance(payload, dict) or "choices" not in payload:
        message = (payload.get("message") or payload.get("error")) if isinstance(payload, dict) else payload
        return CaseResult(outcome="error", detail=f"not a chat completion: {str(message)[:300]}", **base)
    try:
        choice = payload["choices"][0]
        text = choice["message"]["content"] or ""
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError):
        return CaseResult(outcome="error", detail="response is not an OpenAI chat completion", **base)
    usage = payload.get("usage") or {}
    base.update(
        finish_reason=finish, completion_tokens=usage.get("completion_tokens"), prompt_tokens=usage.get("prompt_tokens")
    )
    if finish == "length":
        used = usage.get("completion_tokens") or max_tokens
        return CaseResult(
            outcome="truncated",
            detail=f"answer cut at max_tokens={max_tokens} (HTTP 200, finish_reason=length)",
            recommended_max_tokens=max(2 * used, max_tokens * 2),
            **base,
        )
    failure = run_checks(case.checks, text)
    if failure:
        return CaseResult(outcome="check_failed", detail=failure, **base)
    return CaseResult(outcome="pass", **base)


def run_checks(checks: Checks, text: str) -> str | None:
    if checks.min_chars is not None and len(text.strip()) < checks.min_chars:
        return f"answer shorter than {checks.min_chars} characters"
    for needle in checks.contains:
        if needle not in text:
            return f"answer does not contain {needle!r}"
    if checks.regex and not re.search(checks.regex, text):
        return f"answer does not match /{checks.regex}/"
    if checks.valid_json:
        try:
            json.loads(text)
        except json.JSONDecodeError as exc:
            return f"answer is not valid JSON: {exc}"
    return None


def verdict(endpoint_name: str, results: list[CaseResult], thresholds: EvalThresholds) -> EvalReport:
    truncated = [r.id for r in results if r.outcome == "truncated"]
    errors = [r.id for r in results if r.outcome in ("error", "timeout", "context_overflow")]
    checks = [r.id for r in results if r.outcome == "check_failed"]
    passed = (
        len(truncated) <= thresholds.max_truncated
        and len(errors) <= thresholds.max_errors
        and len(checks) <= thresholds.max_check_failures
    )
    parts = [f"{len(results) - len(truncated) - len(errors) - len(checks)}/{len(results)} passed"]
    if truncated:
        recs = {r.id: r.recommended_max_tokens for r in results if r.outcome == "truncated"}
        parts.append(f"truncated: {', '.join(truncated)} (raise max_tokens: {recs})")
    if errors:
        parts.append(f"errors: {', '.join(errors)}")
    if checks:
        parts.append(f"checks failed: {', '.join(checks)}")
    return EvalReport(
        endpoint_name=endpoint_name, passed=passed, cases=results, thresholds=thresholds, summary="; ".join(parts)
    )
