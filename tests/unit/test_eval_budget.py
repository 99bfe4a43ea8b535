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
