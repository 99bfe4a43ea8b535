"""What a request may carry: env values that cannot smuggle flags or credentials, the stack's limits,
markers that cannot take capabilities, secrets never echoed."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from modeldrop.contracts.env_safety import env_problem, redact
from modeldrop.contracts.errors import LimitExceeded, RequestInvalid
from modeldrop.contracts.models import DeploymentRequest
from modeldrop.pipeline.limits import StackLimits

URI = "s3://bucket-a/runs/7/model.tar.gz"


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("SM_VLLM_SERVED_MODEL_NAME", "m\nSM_VLLM_MAX_NUM_SEQS=1024", "control character"),
        ("SM_VLLM_SERVED_MODEL_NAME", "m\rx", "control character"),
        ("SM_VLLM_SERVED_MODEL_NAME", "m\x00", "control character"),
        ("SM_VLLM_SERVED_MODEL_NAME", "a\tb", "control character"),
        ("SM_VLLM_HF_TOKEN", "anything", "credential"),
        ("SM_SGLANG_API_KEY", "k", "credential"),
        ("OPTION_SECRET", "x", "credential"),
        ("SM_VLLM_SERVED_MODEL_NAME", "hf_abcdefghijklmnopqrstuvwxyz0123", "credential"),
        ("SM_VLLM_SERVED_MODEL_NAME", "AKIAABCDEFGHIJKLMNOP", "credential"),
        ("SM_VLLM_TRUST_REMOTE_CODE", "", "trust_remote_code"),
        ("OPTION_TRUST_REMOTE_CODE", "true", "trust_remote_code"),
        ("BAD KEY", "x", "not an environment variable name"),
        ("SM_VLLM_X", "x" * 1025, "over SageMaker's 1024"),
    ],
)
def test_env_values_that_could_smuggle_are_refused_without_repeating_them(key: str, value: str, says: str) -> None:
    problem = env_problem(key, value)
    assert problem is not None and says in problem
    if len(value) > 4:
        assert value not in problem


@pytest.mark.parametrize(
    "key",
    ["SM_VLLM_MAX_NUM_BATCHED_TOKENS", "SM_VLLM_TOKENIZER_MODE", "SM_SGLANG_ENABLE_TORCH_COMPILE", "OPTION_DTYPE"],
)
def test_ordinary_engine_keys_pass(key: str) -> None:
    assert env_problem(key, "4096") is None


def test_requests_refuse_smuggling_and_unbounded_numbers() -> None:
    for engine_env in ({"SM_VLLM_SERVED_MODEL_NAME": "m\n--x"}, {"SM_VLLM_HF_TOKEN": "hf_x"}):
        with pytest.raises(ValidationError):
            DeploymentRequest.model_validate({"artifact_uri": URI, "engine_env": engine_env})
    with pytest.raises(ValidationError):
        DeploymentRequest.model_validate({"artifact_uri": URI, "max_hourly_price": float("inf")})
    with pytest.raises(ValidationError):
        DeploymentRequest.model_validate({"artifact_uri": URI, "instance_count": 1000})


def test_log_lines_are_redacted() -> None:
    line = "login with hf_abcdefghijklmnopqrstuvwxyz0123 and AKIAABCDEFGHIJKLMNOP failed"
    assert redact(line) == "login with [redacted] and [redacted] failed"


def _request(**fields: object) -> DeploymentRequest:
    return DeploymentRequest.model_validate({"artifact_uri": URI, **fields})


@pytest.mark.parametrize(
    ("fields", "types", "parameter"),
    [
        ({"instance_count": 8}, ["ml.p5.48xlarge"], "AllowedInstanceTypes"),
        ({"instance_count": 3}, ["ml.g6.2xlarge"], "MaxInstanceCount"),
        ({"instance_count": 2}, ["ml.g6e.12xlarge"], "MaxHourlyPrice"),
        ({}, ["ml.g6.2xlarge", "ml.g6e.12xlarge", "ml.p4d.24xlarge"], "AllowedInstanceTypes"),
        ({"force_plan": True}, ["ml.g6.2xlarge"], "AllowForcePlan"),
        ({"engine_settings": {"trust_remote_code": True}}, ["ml.g6.2xlarge"], "AllowTrustRemoteCode"),
        ({"eval_thresholds": {"max_truncated": 5}}, ["ml.g6.2xlarge"], "MaxEvalTolerance"),
        ({"channel": "main", "gate": {"max_regressed_cases": 1}}, ["ml.g6.2xlarge"], "MaxGateRegressions"),
        ({"channel": "main", "promotion_grace_hours": 100}, ["ml.g6.2xlarge"], "MaxTtlHours"),
    ],
)
def test_the_stack_limits_refuse_what_no_request_may_raise(
    fields: dict[str, object], types: list[str], parameter: str
) -> None:
    with pytest.raises(LimitExceeded) as refused:
        StackLimits().check(_request(**fields), types, "us-east-1", 4)
    assert parameter in refused.value.message and parameter in refused.value.hint


def test_limits_a_stack_owner_raised_are_honoured_and_the_ttl_is_bounded() -> None:
    generous = StackLimits(
        allowed_instance_types=("ml.*",),
        max_instance_count=8,
        max_hourly_price=1000,
        allow_force_plan=True,
        max_ttl_hours=336,
    )
    generous.check(_request(instance_count=8, force_plan=True), ["ml.p5.48xlarge"], "us-east-1", 336)
    with pytest.raises(LimitExceeded, match="MaxTtlHours"):
        StackLimits().check(_request(), ["ml.g6.2xlarge"], "us-east-1", 336)
    with pytest.raises(LimitExceeded, match="no price is known"):
        StackLimits(allowed_instance_types=("ml.*",)).check(_request(), ["ml.g5.48xlarge"], "us-east-1", 4)
    # The per-instance ceiling is the stack's share, or the request's own when it is lower.
    assert StackLimits().price_ceiling(2, None) == 10 and StackLimits().price_ceiling(1, 3.5) == 3.5


def test_markers_may_not_carry_capabilities_and_secrets_are_never_echoed() -> None:
    from modeldrop.aws.secret_refs import parse_ref
    from modeldrop.pipeline.deployment.starter import parse_marker

    capabilities = (
        ("secrets", {"HF_TOKEN": "ssm:/modeldrop/t"}),
        ("endpoint_name", "modeldrop-prod"),
        ("base_endpoint", "modeldrop-team-base"),  # another deployment's endpoint to put adapters on
    )
    for field, value in capabilities:
        with pytest.raises(RequestInvalid, match="may not set"):
            parse_marker(json.dumps({field: value}).encode(), "s3://b/p/modeldrop.json")
    # A channel's gate: a marker may tighten every threshold and set its latency noise tolerance (bounded
    # by the stack's MaxGateLatencySlack), but loosen none past the defaults.
    loosened = ({"max_regressed_cases": 1}, {"max_length_ratio": 50}, {"max_ttft_ratio": 100},
                {"min_tokens_per_s_ratio": 0.01})  # fmt: skip
    for loose in loosened:
        with pytest.raises(RequestInvalid, match="may not loosen the channel's gate"):
            parse_marker(json.dumps({"channel": "main", "gate": loose}).encode(), "s3://b/p/modeldrop.json")
    tight = {"channel": "main", "gate": {"max_length_ratio": 1.5, "latency_slack_s": 30}}
    assert parse_marker(json.dumps(tight).encode(), "s3://b/p/modeldrop.json") == tight
    with pytest.raises(RequestInvalid) as raw:
        parse_ref("HF_TOKEN", "hf_plaintext_token_0123456789")
    assert "hf_plaintext" not in str(raw.value)


def test_the_cli_reads_the_stacks_channel_limit_from_its_parameters() -> None:
    """`promote` creates channels up to the stack's MaxChannels, as the state machine's Promote does."""
    from modeldrop.operate.deployments import stack_info

    class Cfn:
        def describe_stacks(self, StackName: str) -> dict[str, object]:
            outputs = {"StateMachineArn": "arn:aws:states:us-east-1:1:stateMachine:m", "DeploymentsTableName": "t"}
            return {
                "Stacks": [
                    {
                        "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()],
                        "Parameters": [{"ParameterKey": "MaxChannels", "ParameterValue": "3"}],
                    }
                ]
            }

    assert stack_info(Cfn(), "modeldrop", "us-east-1").max_channels == 3  # type: ignore[arg-type]
