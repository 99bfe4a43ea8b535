"""The pure rules behind capacity fallback and quota waits: which types are tried, in what order,
what counts as a capacity failure, and how long a waiter waits."""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts import clock
from modeldrop.contracts.errors import EndpointFailed, InsufficientCapacity, QuotaExceeded
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import EndpointRef, EnginePlan
from modeldrop.pipeline.deployment import attempts, endpoint_steps
from modeldrop.serving.instance_choice import candidates, usable
from modeldrop.serving.memory_plan import ModelShape, hourly_price
from modeldrop.serving.plan import plan_serving

# A ~15 GiB model: OOM on a 24 GB L4 at 256 sequences, fits on the 48 GB L40S.
SHAPE = ModelShape(weights_gib=15.18, vocab_size=262_144, num_hidden_layers=35, num_key_value_heads=2, head_dim=256)


def _plan_for(seqs: int) -> Any:
    return lambda t: plan_serving("vllm", SHAPE, t, "us-east-1", max_num_seqs=seqs, max_model_len=4096)


def test_auto_is_the_first_type_then_every_fitting_type_cheapest_first() -> None:
    listed = candidates("ml.g6.2xlarge", ["auto"], _plan_for(32), "us-east-1")
    assert listed[0].instance_type == "ml.g6.2xlarge"
    rest = [c for c in listed[1:]]
    assert rest and all(c.verdict == "fits" for c in rest)
    prices = [hourly_price(c.instance_type, "us-east-1") or 0 for c in rest]
    assert prices == sorted(prices)


def test_a_type_the_plan_refuses_is_listed_but_never_tried() -> None:
    listed = candidates("ml.g6.2xlarge", ["ml.g6.2xlarge", "ml.g6e.2xlarge"], _plan_for(256), "us-east-1")
    assert [(c.instance_type, c.verdict, c.usable) for c in listed] == [
        ("ml.g6.2xlarge", "oom", False),
        ("ml.g6e.2xlarge", "fits", True),
    ]
    assert "OOM" in listed[0].reason
    assert [c.instance_type for c in usable(listed)] == ["ml.g6e.2xlarge"]


def test_max_hourly_price_keeps_dear_types_out() -> None:
    listed = candidates("ml.g6.2xlarge", ["ml.g6.2xlarge", "ml.p5.48xlarge"], _plan_for(32), "us-east-1", 10.0)
    assert [(c.instance_type, c.usable) for c in listed] == [("ml.g6.2xlarge", True), ("ml.p5.48xlarge", False)]
    assert listed[1].verdict == "over-price" and "$113.07/h" in listed[1].reason


@pytest.mark.parametrize(
    ("reason", "never_ran", "capacity"),
    [
        ("Unable to provision requested ML compute capacity due to InsufficientInstanceCapacity", False, True),
        (
            "Unable to provision requested ML compute capacity. Please retry using a different ML instance type.",
            False,
            True,
        ),
        ("Request to service failed. If failure persists after retry, contact customer support.", True, True),
        ("Request to service failed. If failure persists after retry, contact customer support.", False, False),
        ("The primary container for production variant AllTraffic did not pass the ping health check.", True, False),
    ],
)
def test_what_counts_as_a_capacity_failure(reason: str, never_ran: bool, capacity: bool) -> None:
    assert attempts.is_capacity_failure(reason, lambda: never_ran) is capacity


class _SageMaker:
    def __init__(self, desc: dict[str, Any]) -> None:
        self.desc = desc

    def describe_endpoint(self, EndpointName: str) -> dict[str, Any]:
        return self.desc


class _Logs:
    """An endpoint's log group: none, or its streams' creation times."""

    def __init__(self, group: bool, streams: list[Any] | None = None) -> None:
        self.group = group
        self.streams = streams or []

    def describe_log_streams(self, **_: Any) -> dict[str, Any]:
        if not self.group:
            raise ClientError({"Error": {"Code": "ResourceNotFoundException", "Message": "no"}}, "DescribeLogStreams")
        return {"logStreams": [{"creationTime": int(t.timestamp() * 1000)} for t in self.streams]}


def _ref() -> EndpointRef:
    return EndpointRef(
        endpoint_name="modeldrop-x",
        endpoint_config_name="modeldrop-x",
        model_name="modeldrop-x",
        deadline_at=clock.iso(clock.utcnow() + timedelta(hours=3)),
        instance_type="ml.g6.2xlarge",
    )


def test_a_creating_endpoint_with_no_instance_after_the_capacity_wait_is_a_capacity_failure() -> None:
    created = clock.utcnow() - timedelta(minutes=31)
    desc = {"EndpointStatus": "Creating", "CreationTime": created, "LastModifiedTime": created}
    with pytest.raises(InsufficientCapacity, match="no instance for 31 min"):
        endpoint_steps.poll(_SageMaker(desc), _ref(), 3, logs=_Logs(group=False), capacity_wait_seconds=1800)
    # A stream since it was created (an instance started the container), a modification, or less time:
    # still waiting.
    started = _Logs(group=True, streams=[created + timedelta(minutes=2)])
    assert endpoint_steps.poll(_SageMaker(desc), _ref(), 3, logs=started).status == "Creating"
    # A group an earlier endpoint of the same name left (log groups outlive endpoints) is no evidence.
    reused = _Logs(group=True, streams=[created - timedelta(days=3)])
    with pytest.raises(InsufficientCapacity):
        endpoint_steps.poll(_SageMaker(desc), _ref(), 3, logs=reused, capacity_wait_seconds=1800)
    modified = {**desc, "LastModifiedTime": created + timedelta(minutes=5)}
    assert endpoint_steps.poll(_SageMaker(modified), _ref(), 3, logs=_Logs(group=False)).status == "Creating"
    assert (
        endpoint_steps.poll(_SageMaker(desc), _ref(), 3, logs=_Logs(group=False), capacity_wait_seconds=3600).polls == 4
    )


def test_an_oom_is_never_a_capacity_failure() -> None:
    desc = {"EndpointStatus": "Failed", "FailureReason": "did not pass the ping health check"}
    with pytest.raises(EndpointFailed):
        endpoint_steps.poll(_SageMaker(desc), _ref(), 0, logs=_Logs(group=False))


def _request(wait_seconds: int) -> NormalizedRequest:
    return NormalizedRequest(
        deployment_id="d",
        execution_name="d",
        execution_arn="arn:aws:states:us-east-1:123456789012:execution:sm:d",
        artifact_uri="s3://bucket-a/model.tar.gz",
        engine="vllm",
        instance_type="ml.g6.2xlarge",
        ttl_hours=1,
        eval_set_uri=None,
        max_model_len=None,
        max_num_seqs=None,
        eval_thresholds={},
        source="direct",
        resource_name="modeldrop-d",
        deploy_deadline_seconds=3600,
        quota_wait_seconds=wait_seconds,
    )


class _Table:
    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    def update_item(self, **kwargs: Any) -> dict[str, Any]:
        self.writes.append(kwargs)
        return {"Attributes": {"deployment_id": kwargs["Key"]["deployment_id"]}}


PLAN = EnginePlan(
    env={},
    instance_type="ml.g6.2xlarge",
    max_num_seqs=32,
    max_model_len=4096,
    startup_timeout_seconds=600,
    download_timeout_seconds=600,
)


def test_quota_waits_back_off_with_jitter_and_stop_at_the_deadline() -> None:
    busy = QuotaExceeded("at quota")
    now = clock.utcnow()
    rng = random.Random(7)
    waits = []
    until = None
    count = 0
    for _ in range(40):
        out = attempts.quota_busy(Registry(_Table()), _request(1800), PLAN, busy, count, until, now, rng)
        until, count = out.quota_wait_until, out.quota_waits
        if not out.wait_seconds:
            break
        waits.append(out.wait_seconds)
        now += timedelta(seconds=out.wait_seconds)
    assert waits[0] <= 30 and max(waits) <= 300 and len(set(waits)) > 1
    assert sum(waits) <= 1800 and out.wait_seconds == 0  # the deadline ends the waiting
    # No wait asked for: at quota means move on at once.
    assert attempts.quota_busy(Registry(_Table()), _request(0), PLAN, busy, 0, None, clock.utcnow()).wait_seconds == 0


class _Quotas:
    """Service Quotas as AWS answers: the applied values, and the AWS defaults the rest are at."""

    def __init__(self, applied: dict[str, float], defaults: dict[str, float]) -> None:
        self.lists = {"list_service_quotas": applied, "list_aws_default_service_quotas": defaults}

    def get_paginator(self, name: str) -> Any:
        values = self.lists[name]

        class _Pages:
            def paginate(self, **_kwargs: Any) -> list[dict[str, Any]]:
                quotas = [
                    {"QuotaName": f"{t} for endpoint usage", "QuotaCode": f"L-{t}", "Value": v}
                    for t, v in values.items()
                ]
                return [{"Quotas": quotas}]

        return _Pages()


def test_a_quota_left_at_its_aws_default_is_still_found() -> None:
    from modeldrop.aws.sagemaker.endpoint_quota import endpoint_quotas

    quotas = _Quotas(applied={"ml.g6e.2xlarge": 4}, defaults={"ml.g6.2xlarge": 0, "ml.g6e.2xlarge": 1})
    found = endpoint_quotas(quotas)  # type: ignore[arg-type]
    assert found["ml.g6.2xlarge"] == ("L-ml.g6.2xlarge", 0.0)  # only the default lists it
    assert found["ml.g6e.2xlarge"] == ("L-ml.g6e.2xlarge", 4.0)  # the applied value wins
