"""The champion/challenger gate: the same eval set run against the serving model (champion) and a
candidate, compared case by case. A candidate is promotable only when nothing regresses past the
thresholds: a case the champion passed and it does not, an answer cut (finish_reason=length),
empty or refused where the champion's was not, JSON no longer valid, an answer length far off the
champion's, or a time to first token / generation rate far worse.

Latency is judged per case with an absolute slack: on a shared GPU a few tens of milliseconds
are noise, and a ratio alone would block a candidate for it.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, Field

from modeldrop.contracts.models import GateThresholds
from modeldrop.evaluation.smoke_eval import CaseResult, EvalReport

__all__ = ["GateReport", "GateThresholds", "compare"]

# What a model says when it declines (the answer's start); a fine-tune that learned to refuse regresses.
_REFUSAL = re.compile(
    r"^\s*(i'?m sorry|i am sorry|sorry, (but )?i|i can(no|')t|i cannot|i won'?t|i am unable|i'?m unable|as an ai)",
    re.IGNORECASE,
)
KINDS = ("failed", "truncated", "empty", "refused", "invalid_json", "length", "ttft", "throughput", "missing")
# A champion's outcome that is no answer at all (a transport error, no capacity, a timeout): nothing to
# judge the candidate's case against.
SILENT = ("error", "timeout")


class CaseDelta(BaseModel):
    id: str
    champion: str  # outcome (and finish_reason)
    candidate: str
    answer_chars: tuple[int | None, int | None]
    ttft_s: tuple[float | None, float | None]
    tokens_per_s: tuple[float | None, float | None]
    regressions: list[str] = Field(default_factory=list)


class GateReport(BaseModel):
    champion_endpoint: str
    candidate_endpoint: str
    promote: bool
    regressed_cases: int
    by_kind: dict[str, int]
    cases: list[CaseDelta]
    thresholds: GateThresholds
    summary: str
    # The cases the champion did not answer: the gate cannot judge against silence, and does not promote.
    champion_silent: list[str] = Field(default_factory=list)


def _empty(case: CaseResult) -> bool:
    return case.outcome == "pass" and (case.answer_chars == 0 or not case.answer_preview.strip())


def _state(case: CaseResult) -> str:
    return f"{case.outcome} ({case.finish_reason})" if case.finish_reason else case.outcome


def _ratio(new: float | int | None, old: float | int | None) -> float | None:
    return new / old if new is not None and old else None


def _slower(new: float | None, old: float | None, t: GateThresholds) -> bool:
    return new is not None and old is not None and new - old > t.latency_slack_s and new > t.max_ttft_ratio * old


def _answer_regressions(old: CaseResult, new: CaseResult) -> list[str]:
    found = []
    if old.outcome == "pass" and new.outcome != "pass":
        found.append(f"failed: {new.outcome}" + (f" ({new.detail[:120]})" if new.detail else ""))
    if new.finish_reason == "length" and old.finish_reason != "length":
        found.append("truncated: finish_reason=length where the champion's answer ended")
    if _empty(new) and not _empty(old):
        found.append("empty: no answer where the champion answered")
    if _REFUSAL.match(new.answer_preview) and not _REFUSAL.match(old.answer_preview):
        found.append(f"refused: {new.answer_preview[:60]!r}")
    if old.answer_is_json and new.answer_is_json is False:
        found.append("invalid_json: the champion's answer was JSON, the candidate's is not")
    return found


def _size_and_speed_regressions(old: CaseResult, new: CaseResult, t: GateThresholds) -> list[str]:
    found = []
    ratio = _ratio(new.answer_chars, old.answer_chars)
    if ratio is not None and new.answer_chars and not 1 / t.max_length_ratio <= ratio <= t.max_length_ratio:
        found.append(f"length: {new.answer_chars} characters against {old.answer_chars}")
    if _slower(new.ttft_s, old.ttft_s, t):
        found.append(f"ttft: {new.ttft_s:.3f} s against {old.ttft_s:.3f} s")
    rate = _ratio(new.tokens_per_s, old.tokens_per_s)
    slower = (new.latency_s or 0) - (old.latency_s or 0) > t.latency_slack_s
    if rate is not None and rate < t.min_tokens_per_s_ratio and slower:
        found.append(f"throughput: {new.tokens_per_s} tokens/s against {old.tokens_per_s}")
    return found


def _regressions(old: CaseResult, new: CaseResult, t: GateThresholds) -> list[str]:
    return _answer_regressions(old, new) + _size_and_speed_regressions(old, new, t)


def _summary(promote: bool, regressed: int, cases: int, by_kind: dict[str, int], thresholds: GateThresholds,
             champion: EvalReport, silent: list[str]) -> str:  # fmt: skip
    if not silent and champion.cases:
        kinds = ", ".join(f"{n} {k}" for k, n in by_kind.items() if n) or "none"
        return (
            f"{'promotable' if promote else 'blocked'}: {regressed} of {cases} cases regressed "
            f"(at most {thresholds.max_regressed_cases}); regressions: {kinds}"
        )
    first = next((c.detail for c in champion.cases if c.outcome in SILENT and c.detail), "")
    return (
        f"blocked, undetermined: the champion answered {len(champion.cases) - len(silent)} of "
        f"{len(champion.cases)} cases ({first[:160] or 'no answer'}): a candidate is never judged against "
        "an answer that did not come; promote again once the champion answers"
    )


def compare(champion: EvalReport, candidate: EvalReport, thresholds: GateThresholds) -> GateReport:
    """CANDIDATE's eval judged against CHAMPION's, case by case (cases matched by id)."""
    theirs = {c.id: c for c in candidate.cases}
    deltas = []
    for old in champion.cases:
        new = theirs.get(old.id)
        if new is None:
            deltas.append(
                CaseDelta(
                    id=old.id,
                    champion=_state(old),
                    candidate="missing",
                    answer_chars=(old.answer_chars, None),
                    ttft_s=(old.ttft_s, None),
                    tokens_per_s=(old.tokens_per_s, None),
                    regressions=["missing: the candidate's eval has no such case"],
                )
            )
            continue
        deltas.append(
            CaseDelta(
                id=old.id,
                champion=_state(old),
                candidate=_state(new),
                answer_chars=(old.answer_chars, new.answer_chars),
                ttft_s=(old.ttft_s, new.ttft_s),
                tokens_per_s=(old.tokens_per_s, new.tokens_per_s),
                regressions=_regressions(old, new, thresholds),
            )
        )
    by_kind = {kind: 0 for kind in KINDS}
    for delta in deltas:
        for regression in delta.regressions:
            by_kind[regression.split(":")[0]] += 1
    regressed = sum(1 for d in deltas if d.regressions)
    silent = [c.id for c in champion.cases if c.outcome in SILENT]
    promote = regressed <= thresholds.max_regressed_cases and not silent and bool(champion.cases)
    summary = _summary(promote, regressed, len(deltas), by_kind, thresholds, champion, silent)
    return GateReport(
        champion_endpoint=champion.endpoint_name,
        candidate_endpoint=candidate.endpoint_name,
        promote=promote,
        regressed_cases=regressed,
        by_kind={k: n for k, n in by_kind.items() if n},
        cases=deltas,
        thresholds=thresholds,
        summary=summary,
        champion_silent=silent,
    )
