"""The champion/challenger gate, case by case, on eval reports as the runner writes them."""

from __future__ import annotations

from typing import Any

from modeldrop.contracts.models import EvalThresholds
from modeldrop.evaluation.gate import GateThresholds, compare
from modeldrop.evaluation.smoke_eval import CaseResult, EvalReport, Percentiles


def _case(case_id: str, **extra: Any) -> CaseResult:
    fields: dict[str, Any] = {
        "outcome": "pass",
        "max_tokens": 64,
        "finish_reason": "stop",
        "completion_tokens": 20,
        "latency_s": 1.0,
        "ttft_s": 0.2,
        "tokens_per_s": 25.0,
        "answer_preview": "Hello there, friend.",
        "answer_chars": 20,
        "answer_is_json": False,
    }
    return CaseResult(id=case_id, **{**fields, **extra})


def _report(name: str, *cases: CaseResult) -> EvalReport:
    none = Percentiles(p50=None, p90=None)
    return EvalReport(
        endpoint_name=name, max_model_len=4096, streaming=True, schema_name="chat", passed=True, counts={},
        cases=list(cases), thresholds=EvalThresholds(), ttft_s=none, latency_s=none, tokens_per_s=none, summary="",
    )  # fmt: skip


def test_an_equal_or_better_candidate_is_promotable() -> None:
    champion = _report("prod", _case("a"), _case("b", ttft_s=0.5))
    better = _report("cand", _case("a", ttft_s=0.1, tokens_per_s=40.0), _case("b", ttft_s=0.55))
    gate = compare(champion, better, GateThresholds())
    assert gate.promote and gate.regressed_cases == 0 and gate.by_kind == {}
    assert gate.cases[0].ttft_s == (0.2, 0.1) and "promotable" in gate.summary


def test_each_kind_of_regression_is_named_per_case() -> None:
    champion = _report(
        "prod", _case("cut"), _case("empty"), _case("refuse"), _case("json", answer_is_json=True),
        _case("long"), _case("slow"), _case("gone"), _case("fail"),
    )  # fmt: skip
    candidate = _report(
        "cand",
        _case("cut", outcome="truncated", finish_reason="length"),
        _case("empty", answer_preview="", answer_chars=0),
        _case("refuse", answer_preview="I'm sorry, but I can't help with that."),
        _case("json", answer_is_json=False),
        _case("long", answer_chars=400),
        _case("slow", ttft_s=1.5),
        _case("fail", outcome="check_failed", detail="missing 'Paris'"),
    )
    gate = compare(champion, candidate, GateThresholds())
    assert not gate.promote and gate.regressed_cases == 8
    assert gate.by_kind == {
        "failed": 2, "truncated": 1, "empty": 1, "refused": 1, "invalid_json": 1, "length": 1, "ttft": 1, "missing": 1,
    }  # fmt: skip
    reasons = {d.id: d.regressions for d in gate.cases}
    assert reasons["cut"][1].startswith("truncated")
    assert reasons["gone"] == ["missing: the candidate's eval has no such case"]
    assert "blocked: 8 of 8 cases regressed" in gate.summary


def test_thresholds_decide_and_noise_is_not_a_regression() -> None:
    champion = _report("prod", _case("a", ttft_s=0.01), _case("b"))
    candidate = _report("cand", _case("a", ttft_s=0.2), _case("b", outcome="truncated", finish_reason="length"))
    # 0.01 -> 0.2 s is 20x, but under the 0.25 s slack: noise. The truncation is one regressed case.
    assert compare(champion, candidate, GateThresholds()).regressed_cases == 1
    assert compare(champion, candidate, GateThresholds(max_regressed_cases=1)).promote
    assert not compare(champion, candidate, GateThresholds(latency_slack_s=0.1, max_regressed_cases=1)).promote
    # A case that failed on the champion too is no regression of the candidate.
    both = _report("prod", _case("b", outcome="truncated", finish_reason="length"))
    assert compare(both, _report("cand", *candidate.cases[1:]), GateThresholds()).promote


def test_a_champion_that_answered_nothing_makes_the_gate_undetermined_never_a_pass() -> None:
    """Scaled in after the gate's knock, the champion errs on every case: a candidate whose answers all fail
    their checks regresses on nothing measured against that, and must still not be promoted."""
    silent = "ValidationError (HTTP 400): Inference Component ch has no capacity to process this request"
    champion = _report("ch", *(_case(i, outcome="error", detail=silent, answer_preview="", answer_chars=None,
                                     answer_is_json=None, finish_reason=None) for i in "abc"))  # fmt: skip
    broken = _report("cand", *(_case(i, outcome="check_failed", answer_preview="zzzz") for i in "abc"))
    gate = compare(champion, broken, GateThresholds())
    assert not gate.promote and gate.champion_silent == ["a", "b", "c"]
    assert "undetermined" in gate.summary and "answered 0 of 3" in gate.summary and "no capacity" in gate.summary
    one_silent = _report("ch", _case("a"), _case("b"), _case("c", outcome="timeout", detail="60 s"))
    assert not compare(one_silent, _report("cand", _case("a"), _case("b"), _case("c")), GateThresholds()).promote
    assert not compare(_report("ch"), broken, GateThresholds()).promote  # no case answered at all
