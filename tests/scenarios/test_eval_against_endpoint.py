"""The eval's boto3 code against a real local server process behind a local sagemaker-runtime endpoint.

Each endpoint here is a reference-engine process started by the hosting emulator; the runtime
endpoint answers invoke_endpoint and invoke_endpoint_with_response_stream with AWS framing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import create_endpoint
from typer.testing import CliRunner

from modeldrop.contracts.models import EvalThresholds
from modeldrop.evaluation.runner import EvalTarget, RetryPolicy, evaluate_endpoint, run_eval, runtime_client_config
from modeldrop.evaluation.smoke_eval import EvalCase
from modeldrop.local.emulator.sagemaker.runtime import LocalRuntime

NO_WAIT = RetryPolicy(base_seconds=0.01, sleep=lambda _s: None)


def _case(case_id: str, text: str = "Say hello.", **extra: Any) -> EvalCase:
    return EvalCase.model_validate({"id": case_id, "messages": [{"role": "user", "content": text}], **extra})


@pytest.fixture
def endpoint(make_stack: Callable[..., Any], archive: bytes) -> Callable[..., tuple[str, Any]]:
    """Create an InService endpoint with the given container env; returns (name, runtime client)."""
    counter = [0]
    built: list[Any] = []

    def create(
        env: dict[str, str] | None = None,
        fault: str = "none",
        runtime: dict[str, Any] | None = None,
        ms_per_token: float = 2.0,
    ) -> tuple[str, Any]:
        if not built:
            built.append(make_stack())
        stack = built[0]
        stack.hosting.plan(fault)
        stack.hosting.ms_per_token = ms_per_token
        if runtime:
            stack.runtime.stop()
            stack.runtime = LocalRuntime(stack.hosting, **runtime).start()
        counter[0] += 1
        name = f"modeldrop-eval-{counter[0]}"
        sm = stack.client("sagemaker")
        create_endpoint(stack, name, archive, env=env)
        for _ in range(40):
            if sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "Creating":
                break
        assert sm.describe_endpoint(EndpointName=name)["EndpointStatus"] == "InService"
        client = boto3.client(
            "sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url, config=runtime_client_config()
        )
        return name, client

    return create


def test_streaming_and_plain_calls_pass_with_timings(endpoint: Any) -> None:
    name, runtime = endpoint()
    cases = [_case("a"), _case("b", "Tell me about 모델 serving.")]
    streamed = run_eval(runtime, EvalTarget(name, 4096, stream=True), cases, EvalThresholds(), 1200, NO_WAIT)
    plain = run_eval(runtime, EvalTarget(name, 4096, stream=False), cases, EvalThresholds(), 1200, NO_WAIT)
    assert streamed.passed and plain.passed, (streamed.summary, plain.summary)
    for s_case, p_case in zip(streamed.cases, plain.cases, strict=True):
        # Same deterministic answer either way, with usage counts from the server.
        assert s_case.answer_preview == p_case.answer_preview and s_case.completion_tokens == p_case.completion_tokens
        assert s_case.ttft_s is not None and 0 < s_case.ttft_s < s_case.latency_s  # type: ignore[operator]
        assert p_case.ttft_s is None and s_case.tokens_per_s
    assert streamed.ttft_s.p50 is not None and streamed.streaming and not plain.streaming


def test_split_payload_parts_and_multibyte_text(endpoint: Any) -> None:
    name, runtime = endpoint(runtime={"max_part_bytes": 3})
    cases = [_case(f"c{i}", f"prompt number {i} about café and 모델") for i in range(6)]
    split = run_eval(runtime, EvalTarget(name, 4096), cases, EvalThresholds(), 1200, NO_WAIT)
    plain = run_eval(runtime, EvalTarget(name, 4096, stream=False), cases, EvalThresholds(), 1200, NO_WAIT)
    assert split.passed
    assert [c.answer_preview for c in split.cases] == [c.answer_preview for c in plain.cases]
    assert any(ord(ch) > 127 for c in split.cases for ch in c.answer_preview)


def test_truncation_is_reported_with_a_recommended_max_tokens(endpoint: Any) -> None:
    name, runtime = endpoint()
    report = run_eval(runtime, EvalTarget(name, 4096), [_case("short", max_tokens=3)], EvalThresholds(), 1200, NO_WAIT)
    [case] = report.cases
    assert (case.outcome, case.finish_reason, case.completion_tokens) == ("truncated", "length", 3)
    assert case.recommended_max_tokens == 64 and not report.passed


def test_wrong_endpoint_context_error_names_both_limits(endpoint: Any) -> None:
    # The endpoint really serves 64 tokens of context; the caller believes it has 4096.
    name, runtime = endpoint({"SM_VLLM_MAX_MODEL_LEN": "64"})
    report = run_eval(
        runtime, EvalTarget(name, 4096), [_case("long", "word " * 40, max_tokens=40)], EvalThresholds(), 1200, NO_WAIT
    )
    [case] = report.cases
    assert case.outcome == "context_overflow"
    assert case.detail.startswith("context limit 64 tokens, prompt 47, requested 40 on endpoint " + name)
    assert "configured with max_model_len 4096" in case.detail


def test_a_case_that_cannot_fit_is_not_sent(endpoint: Any, make_stack: Any) -> None:
    name, runtime = endpoint({"SM_VLLM_MAX_MODEL_LEN": "64"})
    sm = boto3.client("sagemaker", region_name="us-east-1")
    report = evaluate_endpoint(
        sm, runtime, name, [_case("long", "word " * 80, max_tokens=40)], EvalThresholds(), retry=NO_WAIT
    )
    [case] = report.cases
    assert case.outcome == "context_overflow" and case.attempts == 0
    assert case.detail.startswith("not sent: prompt ~") and "max_model_len 64" in case.detail
    assert report.max_model_len == 64


def test_throttling_is_retried_then_gives_up(endpoint: Any) -> None:
    name, runtime = endpoint(fault="throttle")
    report = run_eval(runtime, EvalTarget(name, 4096), [_case("a"), _case("b")], EvalThresholds(), 1200, NO_WAIT)
    assert [c.attempts for c in report.cases] == [3, 1] and report.passed
    name, runtime = endpoint(fault="throttle")
    stingy = RetryPolicy(attempts=2, base_seconds=0.0, sleep=lambda _s: None)
    report = run_eval(runtime, EvalTarget(name, 4096), [_case("a")], EvalThresholds(), 1200, stingy)
    assert report.cases[0].outcome == "error" and "still throttled after 2 attempts" in report.cases[0].detail


def test_broken_stream_and_timeouts(endpoint: Any) -> None:
    name, runtime = endpoint(fault="stream-break")
    report = run_eval(runtime, EvalTarget(name, 4096), [_case("a")], EvalThresholds(), 1200, NO_WAIT)
    assert report.cases[0].outcome == "error" and "ModelStreamError" in report.cases[0].detail
    name, runtime = endpoint(ms_per_token=60.0, runtime={"invocation_timeout": 0.3})
    slow = run_eval(runtime, EvalTarget(name, 4096, stream=False), [_case("a")], EvalThresholds(), 1200, NO_WAIT)
    assert slow.cases[0].outcome == "timeout" and "timed out" in slow.cases[0].detail
    assert any("60 s invocation cap" in fix for fix in slow.fixes)


def test_container_errors_are_model_errors_with_the_original_status(endpoint: Any) -> None:
    name, runtime = endpoint()
    with pytest.raises(Exception) as caught:
        runtime.invoke_endpoint(EndpointName=name, ContentType="application/json", Body=b"[]")
    response = caught.value.response  # type: ignore[attr-defined]
    assert response["Error"]["Code"] == "ModelError" and response["OriginalStatusCode"] == 400
    assert response["LogStreamArn"].endswith(f"/aws/sagemaker/Endpoints/{name}")
    with pytest.raises(Exception) as missing:
        runtime.invoke_endpoint(EndpointName="nope", ContentType="application/json", Body=b"{}")
    assert missing.value.response["Error"]["Code"] == "ValidationError"  # type: ignore[attr-defined]


def test_lmi_inputs_schema(endpoint: Any) -> None:
    name, runtime = endpoint({"OPTION_MAX_MODEL_LEN": "2048", "OPTION_ROLLING_BATCH": "vllm"})
    report = run_eval(
        runtime,
        EvalTarget(name, 2048, schema="lmi", stream=False),
        [_case("a"), _case("b", max_tokens=2)],
        EvalThresholds(),
        1200,
        NO_WAIT,
    )
    assert [c.outcome for c in report.cases] == ["pass", "truncated"]


def test_eval_command_against_an_endpoint(endpoint: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from modeldrop.cli import app

    name, runtime = endpoint()
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", runtime.meta.endpoint_url)
    runner = CliRunner()
    ok = runner.invoke(app, ["eval", name, "--json", "--region", "us-east-1"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["passed"] is True
    cut = tmp_path / "cut.jsonl"
    cut.write_text(json.dumps({"id": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}) + "\n")
    md = tmp_path / "report.md"
    failed = runner.invoke(app, ["eval", name, "--eval-set", str(cut), "--no-stream", "--markdown", str(md)])
    assert failed.exit_code == 1, failed.output
    assert "truncated" in failed.output and "FAILED" in md.read_text()
    missing = runner.invoke(app, ["eval", "no-such-endpoint", "--region", "us-east-1"])
    assert missing.exit_code == 2 and "does not exist" in missing.output and "Traceback" not in missing.output
    bad = runner.invoke(app, ["eval", name, "--eval-set", str(tmp_path / "nope.jsonl")])
    assert bad.exit_code == 2 and "no such file" in bad.output


def test_compare_promotes_a_twin_and_blocks_a_candidate_that_truncates(
    endpoint: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    from modeldrop.cli import app

    champion, runtime = endpoint()
    twin, _ = endpoint()
    cut, _ = endpoint(fault="truncate")
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", runtime.meta.endpoint_url)
    runner = CliRunner()
    # Latency on a loaded test machine is noise here: the gate's latency rules have their unit tests.
    slack = ["--latency-slack", "60"]
    ok = runner.invoke(app, ["compare", champion, twin, "--json", "--region", "us-east-1", *slack])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["promote"] is True
    blocked = runner.invoke(app, ["compare", champion, cut, "--json", "--region", "us-east-1", *slack])
    assert blocked.exit_code == 1, blocked.output
    gate = json.loads(blocked.output)
    assert not gate["promote"] and gate["by_kind"]["truncated"] == len(gate["cases"]) > 0
    text = runner.invoke(app, ["compare", champion, cut, "--region", "us-east-1", *slack])
    assert text.exit_code == 1 and "PromotionBlocked" in text.output and "Traceback" not in text.output
    # An endpoint against itself: the run-to-run noise a team calibrates its thresholds on.
    same = runner.invoke(app, ["compare", champion, champion, "--region", "us-east-1", *slack])
    assert same.exit_code == 0 and "PROMOTABLE" in same.output
    bad = runner.invoke(app, ["compare", champion, "no-such-endpoint", "--region", "us-east-1"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
