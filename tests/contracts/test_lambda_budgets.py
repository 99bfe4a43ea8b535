"""The loops that wait inside a Lambda fit the Lambda: each stops while enough time is left, and that
margin is below every timeout the template gives the functions that run them."""

from __future__ import annotations

from pathlib import Path

import yaml

from modeldrop.aws.clients import RUNTIME
from modeldrop.aws.sagemaker import inference_components
from modeldrop.evaluation import runner

ROOT = Path(__file__).resolve().parents[2]


def _timeouts() -> dict[str, float]:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("!", lambda loader, suffix, node: None)
    template = yaml.load((ROOT / "template.yaml").read_text(), Loader=Loader)
    default = template.get("Globals", {}).get("Function", {}).get("Timeout", 3)
    return {
        name: float(r["Properties"].get("Timeout", default))
        for name, r in template["Resources"].items()
        if r["Type"] == "AWS::Serverless::Function"
    }


def test_the_component_settle_loop_stops_inside_every_function_that_runs_it() -> None:
    timeouts = _timeouts()
    one_pass = inference_components.SETTLE_SECONDS + inference_components.SETTLE_RESERVE_SECONDS
    for function in ("ExecutionEndedFunction", "TeardownFunction", "ReaperFunction"):
        assert one_pass < timeouts[function], function


def test_one_eval_case_fits_the_smoke_eval_and_the_budget_covers_a_case() -> None:
    policy = runner.RetryPolicy()
    # Attempts 1 .. n-1 are each followed by a sleep of at most the policy's ceiling for that attempt.
    sleeps = [min(policy.cap_seconds, policy.base_seconds * 2**a) for a in range(1, policy.attempts)]
    needed = runner.case_seconds(policy)
    assert needed >= float(RUNTIME.read_timeout) + sum(sleeps) + runner.AFTER_CASES_SECONDS
    assert needed < _timeouts()["SmokeEvalFunction"]


def test_the_emulator_holds_each_function_to_the_templates_timeout() -> None:
    from modeldrop.local.stack.emulated import _Context

    context = _Context("f", "arn:aws:lambda:us-east-1:123456789012:function:f", 60.0)
    assert context.get_remaining_time_in_millis() == 60_000
