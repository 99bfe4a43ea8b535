"""Adapter channels on the emulator: a shared deployment's adapter creates the channel; a candidate
attached to the same running base is gated and promoted with no endpoint created (clients switch
components); a candidate that regresses, or that runs on another base or is no adapter, is refused
with the champion serving; the base and the live component outlive every TTL; the replaced component
goes after its grace; closing the channel leaves nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from modeldrop.contracts import clock
from modeldrop.contracts.errors import ChannelInvalid, PromotionBlocked
from modeldrop.evaluation.eval_sets import load_eval_set
from modeldrop.evaluation.gate import GateThresholds
from modeldrop.local.samples.checkpoint import write_checkpoint
from modeldrop.local.scenarios import inputs as run_inputs
from modeldrop.local.scenarios.channel import channel_context
from modeldrop.local.scenarios.run import _deploy, _teardown_at_exit
from modeldrop.operate.deployments import OperateError, refuse_if_channel_holds
from modeldrop.pipeline.channels.channel_admin import close_channel, rollback
from modeldrop.pipeline.channels.promotion import promote

CASES = load_eval_set(None, None)
LENIENT = GateThresholds(latency_slack_s=30)
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}).encode()


def _endpoints(sm: Any) -> list[str]:
    return sorted(e["EndpointName"] for e in sm.list_endpoints()["Endpoints"] if e["EndpointStatus"] != "Deleting")


def _shared(stack: Any, tmp_path: Path, uri: str, key: str) -> Any:
    run = _deploy(stack, tmp_path / "base", tmp_path, None, keep=True, key=f"local/{key}/model.tar.gz",
                  request={"adapter_mode": "shared", "adapter_uri": uri})  # fmt: skip
    assert run.status == "succeeded", (run.error, run.cause)
    return run


def _attached(stack: Any, tmp_path: Path, uri: str, base: str, ttl: int = 2) -> Any:
    run = _deploy(stack, tmp_path / "base", tmp_path, None, keep=True, key="local/unused/model.tar.gz",
                  request={"adapter_uri": uri, "base_endpoint": base, "ttl_hours": ttl})  # fmt: skip
    assert run.status == "succeeded", (run.error, run.cause)
    return run


def test_an_adapter_only_promotion_creates_no_endpoint_and_is_timed_from_the_upload(
    tmp_path: Path, make_stack: Any
) -> None:
    stack = make_stack()
    ctx = channel_context(stack)
    sm = stack.client("sagemaker")
    write_checkpoint(tmp_path / "base")
    uris = run_inputs.adapter_request(stack, tmp_path / "base", tmp_path, count=4, rank=8)
    first = _shared(stack, tmp_path, uris["adapter_uri"], "first")
    channel = promote(ctx, str(first.deployment_id), "support", CASES, LENIENT)
    assert channel.adapter_only and channel.base_deployment == first.deployment_id and channel.alarms == []
    endpoint = str(first.record.endpoint_name)
    assert channel.invoke_target() == {"EndpointName": endpoint, "InferenceComponentName": f"{endpoint}-lora-sample-1"}

    # A candidate that is not an adapter on this base is refused before anything is compared.
    other_base = _shared(stack, tmp_path, uris["adapters"][2], "other")
    with pytest.raises(ChannelInvalid, match="not on channel support's"):
        promote(ctx, str(other_base.deployment_id), "support", CASES, LENIENT)
    plain = _deploy(stack, None, tmp_path, None, keep=True, key="local/plain/model.tar.gz", request={"ttl_hours": 1})
    with pytest.raises(ChannelInvalid, match="is no adapter on it"):
        promote(ctx, str(plain.deployment_id), "support", CASES, LENIENT)
    promote(ctx, str(plain.deployment_id), "plain", CASES, LENIENT)
    with pytest.raises(ChannelInvalid, match="is an adapter component"):
        promote(ctx, str(other_base.deployment_id), "plain", CASES, LENIENT)

    # A candidate whose answers change length past the gate's ratio is blocked: its component goes,
    # the champion's serves on, and no endpoint is touched.
    before = _endpoints(sm)
    blocked = _attached(stack, tmp_path, uris["adapters"][0], str(first.deployment_id))
    blocked_component = ctx.registry.get(str(blocked.deployment_id)).step_dict("create_endpoint")["components"][
        "adapters"
    ][0]["component"]
    strict = GateThresholds(latency_slack_s=30, max_length_ratio=1.01)
    with pytest.raises(PromotionBlocked, match="regressed"):
        promote(ctx, str(blocked.deployment_id), "support", CASES, strict)
    components = {c["InferenceComponentName"] for c in sm.list_inference_components()["InferenceComponents"]}
    assert blocked_component not in components and f"{endpoint}-lora-sample-1" in components
    assert ctx.registry.get(str(blocked.deployment_id)).status == "torn_down"

    # The daily adapter: attached to the running base, promoted with no endpoint created.
    second = _attached(stack, tmp_path, uris["adapters"][1], endpoint)
    channel = promote(ctx, str(second.deployment_id), "support", CASES, LENIENT)
    assert _endpoints(sm) == before
    assert channel.live is not None and channel.live.deployment_id == second.deployment_id
    assert channel.kept[0].deployment_id == first.deployment_id
    event = channel.history[-1]
    assert event.kind == "promoted" and event.seconds is not None and event.seconds > 0
    assert "upload" in event.reason
    promoted = ctx.registry.get(str(second.deployment_id)).step_dict("promoted")
    assert promoted["seconds"] == event.seconds and promoted["invoke"] == channel.invoke_target()
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    answer = runtime.invoke_endpoint(**channel.invoke_target(), Body=PROBE)["Body"].read()
    assert json.loads(answer)["generated_text"]

    # What the channel holds is not torn down piecemeal.
    with pytest.raises(OperateError, match="runs the base of adapter channel support"):
        refuse_if_channel_holds(ctx.registry, str(first.deployment_id))
    with pytest.raises(OperateError, match="serves channel support"):
        refuse_if_channel_holds(ctx.registry, str(second.deployment_id), str(channel.live.component))
    from modeldrop.operate.stack_teardown import teardown_adapter_now

    with pytest.raises(OperateError, match="serves channel support"):
        teardown_adapter_now(sm, ctx.registry, str(second.deployment_id), str(channel.live.adapter))
    with pytest.raises(OperateError, match="is kept for a rollback by channel support"):
        teardown_adapter_now(sm, ctx.registry, str(first.deployment_id), str(channel.kept[0].adapter))

    # Well past every TTL: the base and the channel's components stay; the grace ends for the first
    # version's component alone, the base serving on.
    clock.advance(30 * 3600)
    reaped = stack.invoke_function("ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"})
    assert reaped["errors"] == [] and endpoint not in reaped["expired"]
    assert reaped["retired"] == [f"inference-component/{endpoint}-lora-sample-1"]
    assert ctx.registry.get(str(first.deployment_id)).ended_at is None
    assert runtime.invoke_endpoint(**channel.invoke_target(), Body=PROBE)["Body"].read() == answer
    with pytest.raises(ChannelInvalid, match="keeps no earlier version"):
        rollback(ctx, "support")

    closed = close_channel(ctx, "support")
    assert f"endpoint/{endpoint}" in closed
    close_channel(ctx, "plain")
    _teardown_at_exit(stack, str(other_base.deployment_id))
    assert stack.leftover_resources() == []
