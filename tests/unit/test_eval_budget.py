"""The smoke eval sends no case that could outlive its Lambda: what is left unsent fails the eval
with the reason, instead of Lambda killing it mid-case with no report."""

from __future__ import annotations

from typing import Any

from modeldrop.contracts import clock
from modeldrop.contracts.models import EvalThresholds
from modeldrop.evaluation.eval_sets import default_eval_set
from modeldrop.evaluation.runner import EvalTarget, RetryPolicy, case_seconds, run_eval


class _Unreachable:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"no case should be sent ({name})")


def test_cases_are_not_sent_when_less_than_one_case_is_left() -> None:
    cases = default_eval_set()
    with clock.budget(lambda: case_seconds(RetryPolicy()) - 1):
        report = run_eval(_Unreachable(), EvalTarget("ep", 4096), cases, EvalThresholds(), 512)  # type: ignore[arg-type]
    assert not report.passed
    assert [c.outcome for c in report.cases] == ["error"] * len(cases)
    assert all("not sent: the eval's Lambda had" in (c.detail or "") for c in report.cases)


def test_an_eval_that_must_finish_stops_with_a_named_error_saying_how_many_cases_ran() -> None:
    """The channel's gate: a verdict on half the cases judges nothing, so the run stops before a case
    that could outlive the Lambda, with EvalOutOfTime naming how many ran -- not a step timeout."""
    import pytest

    from modeldrop.contracts.errors import EvalOutOfTime
    from modeldrop.evaluation.smoke_eval import EvalCase

    cases = default_eval_set()
    with clock.budget(lambda: case_seconds(RetryPolicy()) - 1), pytest.raises(EvalOutOfTime, match="ran 0 of 3"):
        run_eval(_Unreachable(), EvalTarget("ep", 4096), cases, EvalThresholds(), 512, must_finish=True)  # type: ignore[arg-type]
    # One case fits (it is refused before any call: its prompt overflows), then the time is gone.
    long = EvalCase.model_validate({"id": "long", "messages": [{"role": "user", "content": "word " * 5000}]})
    left = iter([10_000.0, case_seconds(RetryPolicy()) - 1])
    with clock.budget(lambda: next(left)), pytest.raises(EvalOutOfTime, match="ran 1 of 2"):
        run_eval(_Unreachable(), EvalTarget("ep", 64), [long, *cases[:1]], EvalThresholds(), 512, must_finish=True)  # type: ignore[arg-type]
