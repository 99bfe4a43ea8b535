"""Channels on the emulator: a stable endpoint, a candidate promoted onto it only past the
champion/challenger gate, by a blue/green UpdateEndpoint read back afterwards; blocked, rolled back
by an alarm, or silently not applied, the champion keeps serving and the candidate is deleted; a
rollback in one step; the superseded version removed by the reaper after its grace; nothing left."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import create_endpoint

from modeldrop.contracts import clock
from modeldrop.evaluation.eval_sets import load_eval_set
from modeldrop.evaluation.gate import GateThresholds
from modeldrop.local.scenarios.run import run_local


def _kinds(result: Any) -> list[str]:
    return [e["kind"] for e in result.channel["history"]]


def test_a_second_version_is_promoted_onto_the_same_endpoint_and_the_first_goes_after_its_grace() -> None:
    result = run_local(channel="demo")
    assert result.status == "succeeded", (result.error, result.cause)
    channel = result.channel
    first, second = (s.get("deployment_id") for s in channel["steps"][:2])
    assert channel["endpoint_name"] == "modeldrop-ch-demo" and channel["serving"] == second != first
    assert _kinds(result) == ["created", "promoted", "retired"]
    promoted = channel["history"][1]
    assert promoted["previous"] == first and promoted["seconds"] > 0 and promoted["drift"] == []
    gate = promoted["gate"]
    assert gate["promote"] and gate["cases"] and all("answer_chars" in c for c in gate["cases"])
    retired = channel["steps"][2]["reaper_retired"]
    assert any(r.startswith("endpoint-config/") and first in r for r in retired)
    assert any(r.startswith("model/") and first in r for r in retired)
    # The adapter line beside it: promoted onto the running base with no endpoint created, timed.
    lora = channel["adapter_channel"]
    assert lora["name"] == "demo-lora" and "error" not in lora, lora.get("error")
    assert [s["step"] for s in lora["steps"]] == ["created", "promoted, adapter only", "rolled back"]
    created, promoted_adapter, back = lora["steps"]
    assert promoted_adapter["endpoints_created"] == [] and promoted_adapter["seconds_to_serving"] > 0
    assert promoted_adapter["invoke"]["EndpointName"] == created["invoke"]["EndpointName"]
    assert promoted_adapter["invoke"]["InferenceComponentName"] != created["invoke"]["InferenceComponentName"]
    assert back["invoke"] == created["invoke"]
    assert [e["kind"] for e in lora["history"]] == ["created", "promoted", "rolled_back"]
    assert any(c.startswith("endpoint/") for c in lora["closed"])
    assert result.leftover_resources == []


def test_run_local_promotes_the_users_own_checkpoint_onto_the_samples_channel(tmp_path: Path) -> None:
    from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

    candidate = write_tar_gz(write_checkpoint(tmp_path / "mine", shards=4), tmp_path / "mine.tar.gz")
    result = run_local(candidate, channel="demo")
    assert result.status == "succeeded", (result.error, result.cause)
    first, second = (s.get("deployment_id") for s in result.channel["steps"][:2])
    assert result.channel["serving"] == second != first and result.deployment_id == second
    assert result.leftover_resources == []


@pytest.mark.parametrize(
    ("fault", "error", "reason"),
    [
        ("regression", "PromotionBlocked", "truncated"),
        ("alarm-during-bake", "PromotionFailed", "rolled back automatically: alarm modeldrop-ch-demo-5xx"),
        ("silent-rollback", "PromotionFailed", "rolled back silently"),
    ],
)
def test_a_candidate_that_is_not_promoted_leaves_the_champion_serving(fault: str, error: str, reason: str) -> None:
    result = run_local(channel="demo", fault=fault)
    assert result.status == "failed" and result.error == error, (result.error, result.cause)
    channel = result.channel
    first = channel["steps"][0]["deployment_id"]
    assert channel["serving"] == first
    refused = channel["history"][-1]
    assert refused["kind"] in ("blocked", "promotion_failed") and reason in refused["reason"]
    # The candidate's own endpoint, config and model went with the refusal (its endpoint before the update
    # already, once the gate passed: the green fleet never needs a third fleet's quota).
    candidate = f"modeldrop-{refused['deployment_id']}"
    assert f"endpoint-config/{candidate}" in refused["reason"] and f"model/{candidate}" in refused["reason"]
    if fault == "regression":
        assert f"endpoint/{candidate}" in refused["reason"]
    assert result.record is not None and result.record.error == error and result.record.status == "torn_down"
    assert result.leftover_resources == []


def test_rollback_returns_the_channel_to_its_last_known_good_version(tmp_path: Path, make_stack: Any) -> None:
    from modeldrop.contracts.errors import ChannelInvalid
    from modeldrop.local.samples.checkpoint import write_checkpoint
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.local.scenarios.run import _deploy
    from modeldrop.pipeline.channels.channel_admin import close_channel, rollback
    from modeldrop.pipeline.channels.promotion import promote

    stack = make_stack()
    ctx = channel_context(stack)
    cases, gate = load_eval_set(None, None), GateThresholds(latency_slack_s=30)
    first = _deploy(stack, None, tmp_path, None, keep=True)
    second = _deploy(stack, write_checkpoint(tmp_path / "v2", shards=3), tmp_path, None,
                     key="local/v2/model.tar.gz", request={"ttl_hours": 2}, keep=True)  # fmt: skip
    assert first.status == second.status == "succeeded"
    promote(ctx, str(first.deployment_id), "main", cases, gate)
    with pytest.raises(ChannelInvalid, match="keeps no earlier version"):
        rollback(ctx, "main")
    sm = stack.client("sagemaker")
    # A racing twin wrote the channel after this promotion read it: refused before the endpoint is touched.
    from modeldrop.aws.dynamodb.channel_store import ChannelChanged

    read_first = ctx.channels.get("main")
    assert read_first is not None and read_first.live is not None
    ctx.channels.save(read_first)
    fresh = ctx.channels.get
    ctx.channels.get = lambda name: read_first  # type: ignore[method-assign]
    with pytest.raises(ChannelChanged):
        promote(ctx, str(second.deployment_id), "main", cases, gate)
    ctx.channels.get = fresh  # type: ignore[method-assign]
    assert (
        sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointConfigName"] == read_first.live.endpoint_config
    )
    channel = promote(ctx, str(second.deployment_id), "main", cases, gate)
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointConfigName"] == channel.live.endpoint_config
    # A rollback that read the channel before a twin wrote it is refused with the endpoint untouched.
    read_before = ctx.channels.get("main")
    assert read_before is not None
    ctx.channels.save(read_before)
    ctx.channels.get = lambda name: read_before  # type: ignore[method-assign]
    with pytest.raises(ChannelChanged):
        rollback(ctx, "main")
    ctx.channels.get = fresh  # type: ignore[method-assign]
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointConfigName"] == channel.live.endpoint_config
    back = rollback(ctx, "main")
    assert back.live is not None and back.live.deployment_id == first.deployment_id
    assert [v.deployment_id for v in back.kept] == [second.deployment_id]
    desc = sm.describe_endpoint(EndpointName="modeldrop-ch-main")
    assert desc["EndpointStatus"] == "InService" and desc["EndpointConfigName"] == back.live.endpoint_config
    assert [e.kind for e in back.history] == ["created", "promoted", "rolled_back"]
    # The channel's endpoint has no TTL: the reaper leaves it, and what it keeps, well past any default.
    clock.advance(30 * 3600)
    reaped = stack.invoke_function("ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"})
    assert "modeldrop-ch-main" not in reaped["expired"] and reaped["errors"] == []
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointStatus"] == "InService"
    assert any(second.deployment_id in r for r in reaped["retired"])  # its grace (1 h) ended
    # A deployment the channel serves is not torn down by its id; a stale channel record is not saved.
    from modeldrop.operate.deployments import OperateError, refuse_if_channel_holds

    with pytest.raises(OperateError, match="serves channel main"):
        refuse_if_channel_holds(ctx.registry, str(first.deployment_id))
    stale = ctx.channels.get("main")
    assert stale is not None and ctx.channels.save(stale).revision == stale.revision + 1
    with pytest.raises(ChannelChanged):
        ctx.channels.save(stale)
    close_channel(ctx, "main")
    assert stack.leftover_resources() == []


def _two_endpoints(make_stack: Any, archive: bytes) -> Any:
    stack = make_stack()
    for name in ("modeldrop-blue", "modeldrop-green"):
        create_endpoint(stack, name, archive)
    sm = stack.client("sagemaker")
    for name in ("modeldrop-blue", "modeldrop-green"):
        for _ in range(40):
            if sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "Creating":
                break
    return stack, sm


WAIT = {"WaitIntervalInSeconds": 0}
ONE = {"Type": "INSTANCE_COUNT", "Value": 1}


def test_update_endpoint_is_as_strict_as_the_api_reference(make_stack: Any, archive: bytes) -> None:
    stack, sm = _two_endpoints(make_stack, archive)
    refused = {
        "no such config": {"EndpointConfigName": "modeldrop-none"},
        "LINEAR without a step": {
            "DeploymentConfig": {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "LINEAR", **WAIT}}}
        },
        "termination wait past an hour": {
            "DeploymentConfig": {
                "BlueGreenUpdatePolicy": {
                    "TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", **WAIT},
                    "TerminationWaitInSeconds": 3601,
                }
            }
        },
        "both policies": {
            "DeploymentConfig": {
                "BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", **WAIT}},
                "RollingUpdatePolicy": {"MaximumBatchSize": ONE, "WaitIntervalInSeconds": 60},
            }
        },
        "eleven alarms": {
            "DeploymentConfig": {"AutoRollbackConfiguration": {"Alarms": [{"AlarmName": f"a{i}"} for i in range(11)]}}
        },
    }
    for label, change in refused.items():
        kwargs = {"EndpointName": "modeldrop-blue", "EndpointConfigName": "modeldrop-green", **change}
        with pytest.raises(sm.exceptions.ClientError) as caught:
            sm.update_endpoint(**kwargs)
        assert caught.value.response["Error"]["Code"] == "ValidationException", label
    sm.update_endpoint(EndpointName="modeldrop-blue", EndpointConfigName="modeldrop-green")
    assert sm.describe_endpoint(EndpointName="modeldrop-blue")["EndpointStatus"] in ("Updating", "InService")
    if sm.describe_endpoint(EndpointName="modeldrop-blue")["EndpointStatus"] == "Updating":
        with pytest.raises(sm.exceptions.ClientError, match="Cannot update in-progress endpoint"):
            sm.update_endpoint(EndpointName="modeldrop-blue", EndpointConfigName="modeldrop-blue")
    for _ in range(40):
        if sm.describe_endpoint(EndpointName="modeldrop-blue")["EndpointStatus"] != "Updating":
            break
    desc = sm.describe_endpoint(EndpointName="modeldrop-blue")
    assert desc["EndpointStatus"] == "InService" and desc["EndpointConfigName"] == "modeldrop-green"
    # A config whose model is gone: accepted, and the update fails back to the serving config, with the reason.
    sm.delete_model(ModelName="modeldrop-blue")
    sm.update_endpoint(EndpointName="modeldrop-blue", EndpointConfigName="modeldrop-blue")
    for _ in range(5):
        desc = sm.describe_endpoint(EndpointName="modeldrop-blue")
        if desc["EndpointStatus"] != "Updating":
            break
    assert desc["EndpointStatus"] == "InService" and desc["EndpointConfigName"] == "modeldrop-green"
    assert "Could not find model" in desc.get("FailureReason", "")
    for name in ("modeldrop-blue", "modeldrop-green"):
        sm.delete_endpoint(EndpointName=name)
    assert not [p for p in stack.hosting.running() if p.startswith("modeldrop-blue")]


def test_update_endpoint_holds_the_green_fleet_to_the_quota_the_role_to_its_alarms_and_the_timeout(
    make_stack: Any, archive: bytes
) -> None:
    """What the API reference and the guardrails guide ask, and moto accepts: the new fleet counts against
    the endpoint quota (ResourceLimitExceeded, UpdateEndpoint's only modeled error); the execution role
    must be allowed cloudwatch:DescribeAlarms on the rollback alarms; MaximumExecutionTimeoutInSeconds is
    600-28,800, and a new fleet not up within it is rolled back."""
    from modeldrop.contracts import clock
    from modeldrop.local.emulator import service_quotas

    stack, sm = _two_endpoints(make_stack, archive)
    cw = stack.client("cloudwatch")
    policy = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", **WAIT}}}

    def timing_out(seconds: int) -> dict[str, Any]:
        blue_green = {**policy["BlueGreenUpdatePolicy"], "MaximumExecutionTimeoutInSeconds": seconds}
        return {"BlueGreenUpdatePolicy": blue_green}

    update = {"EndpointName": "modeldrop-blue", "EndpointConfigName": "modeldrop-green"}
    with pytest.raises(sm.exceptions.ClientError, match="MaximumExecutionTimeoutInSeconds"):
        sm.update_endpoint(**update, DeploymentConfig=timing_out(28_801))  # botocore itself refuses under 600
    # Two running fleets of the type fill a quota of 2: the green fleet of a third is refused (past the
    # timeout's check: 28,800 is the API's own maximum, accepted).
    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 2)
    with pytest.raises(sm.exceptions.ClientError) as over:
        sm.update_endpoint(**update, DeploymentConfig=timing_out(28_800))
    assert over.value.response["Error"]["Code"] == "ResourceLimitExceeded"
    assert sm.describe_endpoint(EndpointName="modeldrop-blue")["EndpointStatus"] == "InService"
    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 3)
    # An alarm the role may not read: refused. The local role reads <prefix>-ch-* alarms only.
    cw.put_metric_alarm(AlarmName="someone-elses", MetricName="m", Namespace="n", Statistic="Sum", Period=60,
                        EvaluationPeriods=1, Threshold=1, ComparisonOperator="GreaterThanThreshold")  # fmt: skip
    alarmed = {**policy, "AutoRollbackConfiguration": {"Alarms": [{"AlarmName": "someone-elses"}]}}
    with pytest.raises(sm.exceptions.ClientError, match="cloudwatch:DescribeAlarms"):
        sm.update_endpoint(**update, DeploymentConfig=alarmed)
    # A new fleet that is not up within the timeout is rolled back, the serving config kept.
    from modeldrop.local.emulator.sagemaker.endpoint_updates import GREEN

    sm.update_endpoint(**update, DeploymentConfig=timing_out(600))
    green = stack.hosting.endpoints["modeldrop-blue" + GREEN]
    stack.hosting._stop(green)  # a fleet still starting (nothing answers its ping) when the timeout passes
    green.process, green.status, green.startup_timeout = None, "Creating", 10**6
    clock.advance(601)
    desc = sm.describe_endpoint(EndpointName="modeldrop-blue")
    for _ in range(5):
        if desc["EndpointStatus"] != "Updating":
            break
        desc = sm.describe_endpoint(EndpointName="modeldrop-blue")
    assert desc["EndpointStatus"] == "InService" and desc["EndpointConfigName"] == "modeldrop-blue", desc
    assert "MaximumExecutionTimeoutInSeconds" in desc.get("FailureReason", "")
    for name in ("modeldrop-blue", "modeldrop-green"):
        sm.delete_endpoint(EndpointName=name)


def test_rollback_alarms_let_one_error_and_a_long_answer_through_and_clear_after_a_rollback(
    make_stack: Any, archive: bytes
) -> None:
    """The channel's alarms take neither one 5XX nor an allowed long generation (48 s under the 60 s cap)
    for a broken fleet; after a guardrail rollback the alarm returns to OK once its evaluation periods
    pass, so the next update is not rolled back by a stale ALARM; a blue/green update may not rename
    the endpoint's variants."""
    from modeldrop.aws.autoscaling.channel_alarms import alarms_in_alarm, put_channel_alarms
    from modeldrop.contracts import clock
    from modeldrop.local.emulator.sagemaker.endpoint_updates import ALARM_CLEARS_AFTER, _set_alarm

    stack, sm = _two_endpoints(make_stack, archive)
    cw = stack.client("cloudwatch")
    names = put_channel_alarms(cw, "modeldrop-ch-x")
    alarms = {a["AlarmName"]: a for a in cw.describe_alarms(AlarmNames=names)["MetricAlarms"]}
    errors, latency = alarms["modeldrop-ch-x-5xx"], alarms["modeldrop-ch-x-latency"]
    assert errors["Threshold"] >= 1 and errors["DatapointsToAlarm"] >= 2
    assert latency["Threshold"] / 1e6 > 48
    # A config naming another variant: refused for a blue/green update.
    model = sm.describe_endpoint_config(EndpointConfigName="modeldrop-green")["ProductionVariants"][0]["ModelName"]
    variant = {"VariantName": "Other", "ModelName": model, "InstanceType": "ml.g6.2xlarge", "InitialInstanceCount": 1}
    sm.create_endpoint_config(EndpointConfigName="modeldrop-renamed", ProductionVariants=[variant])
    policy = {"BlueGreenUpdatePolicy": {"TrafficRoutingConfiguration": {"Type": "ALL_AT_ONCE", **WAIT}}}
    with pytest.raises(sm.exceptions.ClientError, match="production variants"):
        sm.update_endpoint(
            EndpointName="modeldrop-blue", EndpointConfigName="modeldrop-renamed", DeploymentConfig=policy
        )
    # An alarm that fired during a bake clears once its periods have passed after the rollback.
    backend_alarm = "modeldrop-ch-x-5xx"
    from moto.sagemaker.models import sagemaker_backends

    backend = sagemaker_backends["123456789012"]["us-east-1"]
    _set_alarm(backend, backend_alarm, "ALARM", "test: errors on the new fleet")
    from modeldrop.local.emulator.sagemaker.endpoint_updates import _alarm_clears

    _alarm_clears(backend)[backend_alarm] = clock.utcnow() + ALARM_CLEARS_AFTER
    sm.describe_endpoint(EndpointName="modeldrop-blue")
    assert alarms_in_alarm(cw, names) == [backend_alarm]  # still within its evaluation periods
    clock.advance(ALARM_CLEARS_AFTER.total_seconds() + 1)
    sm.describe_endpoint(EndpointName="modeldrop-blue")
    assert alarms_in_alarm(cw, names) == []
    for name in ("modeldrop-blue", "modeldrop-green"):
        sm.delete_endpoint(EndpointName=name)


def test_a_channel_day_whose_step_fails_fails_the_run_in_the_users_words(monkeypatch: Any) -> None:
    """The adapter line's day-2 promotion refused: the run is failed (exit 1 from the CLI), its cause the
    Lambda's message -- never the error payload with its stack trace and this machine's paths."""
    from modeldrop.local.scenarios import channel as channel_day
    from modeldrop.local.scenarios.run import run_local

    payload = json.dumps({"errorType": "CheckpointRefused", "errorMessage": "ENGINE_REFUSED: the adapter's rank",
                          "stackTrace": ['  File "/somewhere/engine_check_step.py", line 85']})  # fmt: skip
    refused = {"status": "FAILED", "error": "CheckpointRefused", "cause": payload}
    monkeypatch.setattr(channel_day, "_marker_deploy", lambda *a, **k: refused)
    result = run_local(channel="demo")
    assert result.status == "failed" and result.error == "ChannelDayFailed", (result.error, result.cause)
    assert "ENGINE_REFUSED: the adapter's rank" in str(result.cause)
    assert "stackTrace" not in result.model_dump_json() and result.leftover_resources == []
