"""`run-local --channel NAME`: a channel's day on the emulator. The generated checkpoint is deployed
and creates the channel; a second generated checkpoint is deployed, gated against the first, and
promoted onto the same endpoint name by a blue/green update; the grace period passes and the
reaper removes the first version's resources; the channel is closed so nothing is left.

Then the adapter line, channel NAME-lora: a shared deployment (a base and one LoRA adapter) creates
it; a second adapter attached to that running base is gated against the first and promoted with no
new endpoint (clients switch components); the channel is rolled back in one step, then closed.

With `--fault regression` the candidate truncates every answer (its own smoke eval tolerates it)
and the gate blocks it; with `alarm-during-bake` the channel's 5XX alarm fires during the bake and
SageMaker rolls back; with `silent-rollback` the endpoint ends the update InService on the old
config. In each the champion keeps serving, and the candidate's resources are deleted.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import boto3

from modeldrop.aws.channel_store import ChannelStore
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ModeldropError
from modeldrop.evaluation.gate import GateThresholds
from modeldrop.evaluation.runner import runtime_client_config
from modeldrop.evaluation.smoke_eval import load_eval_set
from modeldrop.pipeline.promotion import ChannelContext, close_channel, promote, rollback

CHANNEL_FAULTS = frozenset({"regression", "alarm-during-bake", "silent-rollback"})
GRACE = timedelta(hours=1)
# Local processes on a shared CPU: latency differences this large are the machine, not the model.
LOCAL_LATENCY_SLACK_S = 30.0


def channel_parameters(deploy_engine: str | None, faults: frozenset[str]) -> dict[str, str] | None:
    """The emulated stack's parameters for the run (None: the template's defaults)."""
    parameters = {"DefaultEngine": deploy_engine} if deploy_engine else {}
    if "regression" in faults:  # the candidate's own smoke eval tolerates what the gate refuses
        parameters["MaxEvalTolerance"] = "100"
    return parameters or None


def channel_context(stack: Any) -> ChannelContext:
    from modeldrop.local.stack import REGION, STACK_NAME

    registry = stack.registry()
    runtime = boto3.client(
        "sagemaker-runtime", region_name=REGION, endpoint_url=stack.runtime.url, config=runtime_client_config()
    )
    return ChannelContext(
        sm=stack.client("sagemaker"),
        runtime=runtime,
        cloudwatch=stack.client("cloudwatch"),
        registry=registry,
        channels=ChannelStore(registry.table),
        resource_prefix=str(stack.parameters.get("ResourcePrefix", "modeldrop")),
        stack_tag=STACK_NAME,
        s3=stack.client("s3"),
    )


def run_channel(
    stack: Any,
    channel: str,
    workdir: Path,
    deploy: Callable[..., Any],
    faults: frozenset[str],
    on_state: Any,
) -> Any:
    """The channel's day; DEPLOY is run-local's own deploy (keep=True leaves the endpoint up)."""
    from modeldrop.local.sample_checkpoint import write_checkpoint

    ctx = channel_context(stack)
    cases = load_eval_set(None, None)
    gate = GateThresholds(latency_slack_s=LOCAL_LATENCY_SLACK_S)
    first = deploy(stack, None, workdir, on_state, keep=True)
    steps: list[dict[str, Any]] = []
    if first.status != "succeeded":
        return first, {"steps": steps}
    promote(ctx, str(first.deployment_id), channel, cases, gate)
    steps.append({"step": "created", "deployment_id": first.deployment_id})
    if "regression" in faults:
        stack.hosting.plan("truncate")
    second_dir = write_checkpoint(workdir / "second", shards=3)
    tolerant = {"eval_thresholds": {"max_truncated": 100, "max_errors": 0}} if "regression" in faults else {}
    second = deploy(stack, second_dir, workdir, on_state, request=tolerant or None, key="local/second/model.tar.gz",
                    keep=True)  # fmt: skip
    error: ModeldropError | None = None
    if second.status == "succeeded":
        try:
            promote(ctx, str(second.deployment_id), channel, cases, gate, grace=GRACE)
            steps.append({"step": "promoted", "deployment_id": second.deployment_id})
            clock.advance(int(GRACE.total_seconds()) + 60)
            retired = stack.invoke_function(
                "ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"}
            )
            steps.append({"step": "grace ended", "reaper_retired": retired.get("retired", [])})
        except ModeldropError as exc:
            error = exc
            steps.append({"step": "not promoted", "deployment_id": second.deployment_id, "error": type(exc).__name__})
    adapter_line = None
    if error is None and not faults:
        adapter_line = adapter_day(stack, ctx, adapter_channel_name(channel), workdir, deploy, on_state)
    record = ctx.channels.get(channel)
    summary: dict[str, Any] = {
        "name": channel,
        "endpoint_name": record.endpoint_name if record else None,
        "serving": record.live.deployment_id if record and record.live else None,
        "steps": steps,
        "history": [e.model_dump(mode="json") for e in record.history] if record else [],
        **({"adapter_channel": adapter_line} if adapter_line else {}),
    }
    summary["closed"] = close_channel(ctx, channel) if record else []
    result = second if error is None else second.model_copy(
        update={"status": "failed", "error": type(error).__name__, "cause": error.message}
    )  # fmt: skip
    return result, summary


def adapter_channel_name(channel: str) -> str:
    """The run's adapter channel beside CHANNEL (within a channel name's 24 characters)."""
    return f"{channel[:19].rstrip('-')}-lora"


def adapter_day(
    stack: Any, ctx: ChannelContext, name: str, workdir: Path, deploy: Callable[..., Any], on_state: Any
) -> dict[str, Any]:
    """A shared base with one adapter creates channel NAME; a second adapter attached to that base is
    promoted without a new endpoint; a rollback returns to the first; the channel is closed."""
    from modeldrop.local import run_inputs
    from modeldrop.local.sample_checkpoint import write_checkpoint

    base_dir = write_checkpoint(workdir / "lora-base")
    steps: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"name": name, "steps": steps}
    # Two days' adapters: each its own name and weights, trained at the same rank.
    uris = run_inputs.adapter_request(stack, base_dir, workdir, count=2, rank=8)
    shared = {"adapter_mode": "shared", "adapter_uri": uris["adapter_uri"]}
    first = deploy(stack, base_dir, workdir, on_state, keep=True, key="local/lora-base/model.tar.gz", request=shared)
    if first.status != "succeeded":
        return {**summary, "error": f"the shared base failed: {first.error}: {first.cause}"}
    created = promote(ctx, str(first.deployment_id), name, load_eval_set(None, None), GateThresholds(
        latency_slack_s=LOCAL_LATENCY_SLACK_S))  # fmt: skip
    steps.append({"step": "created", "deployment_id": first.deployment_id, "invoke": created.invoke_target()})
    before = _endpoints(ctx)
    attached = {"adapter_uri": uris["adapters"][0], "base_endpoint": str(first.deployment_id)}
    second = deploy(stack, base_dir, workdir, on_state, keep=True, key="local/lora-unused/model.tar.gz",
                    request=attached)  # fmt: skip
    if second.status != "succeeded":
        summary["error"] = f"the attached adapter failed: {second.error}: {second.cause}"
    else:
        try:
            promoted = promote(ctx, str(second.deployment_id), name, load_eval_set(None, None),
                               GateThresholds(latency_slack_s=LOCAL_LATENCY_SLACK_S), grace=GRACE)  # fmt: skip
            event = promoted.history[-1]
            steps.append({"step": "promoted, adapter only", "deployment_id": second.deployment_id,
                          "invoke": promoted.invoke_target(), "endpoints_created": sorted(_endpoints(ctx) - before),
                          "seconds_to_serving": event.seconds, "timed": event.reason})  # fmt: skip
            back = rollback(ctx, name, grace=GRACE)
            steps.append({"step": "rolled back", "deployment_id": back.live.deployment_id if back.live else None,
                          "invoke": back.invoke_target()})  # fmt: skip
        except ModeldropError as exc:
            summary["error"] = f"{type(exc).__name__}: {exc.message}"
    record = ctx.channels.get(name)
    summary["history"] = [e.model_dump(mode="json") for e in record.history] if record else []
    summary["closed"] = close_channel(ctx, name) if record else []
    return summary


def _endpoints(ctx: ChannelContext) -> set[str]:
    return {e["EndpointName"] for e in ctx.sm.list_endpoints()["Endpoints"]}
