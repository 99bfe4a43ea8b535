"""`run-local --channel NAME`: a channel's day on the emulator, every deployment asking for the
channel in its request so that the state machine gates and promotes it. The generated checkpoint
creates the channel; a second generated checkpoint is gated against the first and promoted onto the
same endpoint name by a blue/green update; the grace period passes and the reaper removes the first
version's resources; the channel is closed so nothing is left.

Then the adapter line, channel NAME-lora: a shared deployment (a base and one LoRA adapter) creates
it; the next adapter arrives as files and a modeldrop.json marker naming the channel, goes onto the
running base and is promoted with no new endpoint (clients switch components), timed from the
marker; the channel is rolled back in one step, then closed.

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

from modeldrop.aws.dynamodb.channel_store import ChannelStore
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ModeldropError, cause_message
from modeldrop.evaluation.runner import runtime_client_config
from modeldrop.pipeline.channels.channel_admin import close_channel, rollback
from modeldrop.pipeline.channels.promotion import ChannelContext

CHANNEL_FAULTS = frozenset({"regression", "alarm-during-bake", "silent-rollback"})
GRACE = timedelta(hours=1)
# Local processes on a shared CPU: latency differences this large are the machine, not the model.
LOCAL_LATENCY_SLACK_S = 30.0
CHANNEL_QUOTA = 2.0
GATE = {"latency_slack_s": LOCAL_LATENCY_SLACK_S}


def channel_parameters(deploy_engine: str | None, faults: frozenset[str]) -> dict[str, str]:
    """The emulated stack's parameters for a channel's run."""
    # The local engines' latency is a busy laptop's: the gate's noise tolerance is the local stack's to raise.
    parameters = {"MaxGateLatencySlack": f"{LOCAL_LATENCY_SLACK_S:g}"}
    if deploy_engine:
        parameters["DefaultEngine"] = deploy_engine
    if "regression" in faults:  # the candidate's own smoke eval tolerates what the gate refuses
        parameters["MaxEvalTolerance"] = "100"
    if "zero-refused" in faults:  # the stack's owner knows the region refuses scale to zero (the emulator does too)
        from modeldrop.local.stack.emulated import REGION

        parameters["NoScaleToZeroRegions"] = REGION
    return parameters


def channel_context(stack: Any) -> ChannelContext:
    from modeldrop.local.stack.emulated import REGION, STACK_NAME

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
        autoscaling=stack.client("application-autoscaling"),
    )


def run_channel(
    stack: Any,
    channel: str,
    workdir: Path,
    deploy: Callable[..., Any],
    faults: frozenset[str],
    on_state: Any,
    candidate: Path | None = None,
) -> Any:
    """The channel's day, each deployment asking for the channel in its request (the state machine
    gates and promotes); DEPLOY is run-local's own deploy (keep=True leaves the endpoint up). The
    sample serves first; CANDIDATE (run-local's ARTIFACT, else a second generated checkpoint) is
    promoted onto it."""
    from modeldrop.local.emulator import service_quotas
    from modeldrop.local.samples.checkpoint import write_checkpoint
    from modeldrop.serving.memory_plan import instance_catalog

    # A quota of 2 per type, common for GPU types: the candidate's preview beside the channel, then the
    # green fleet beside the serving one (the preview gone first), never three at once.
    service_quotas.set_endpoint_quotas({name: CHANNEL_QUOTA for name in instance_catalog()["instances"]})
    ctx = channel_context(stack)
    asks = {"channel": channel, "gate": GATE, "promotion_grace_hours": GRACE.total_seconds() / 3600}
    first = deploy(stack, None, workdir, on_state, request=asks, key="local/first/model.tar.gz", keep=True)
    steps: list[dict[str, Any]] = []
    if first.status != "succeeded":
        return first, {"steps": steps}
    steps.append({"step": "created", "deployment_id": first.deployment_id})
    if "regression" in faults:
        stack.hosting.plan("truncate")
    second_dir = candidate or write_checkpoint(workdir / "second", shards=3)
    tolerant = {"eval_thresholds": {"max_truncated": 100, "max_errors": 0}} if "regression" in faults else {}
    second = deploy(stack, second_dir, workdir, on_state, request={**asks, **tolerant},
                    key="local/second/model.tar.gz", keep=True)  # fmt: skip
    if second.status == "succeeded":
        steps.append({"step": "promoted", "deployment_id": second.deployment_id})
        clock.advance(int(GRACE.total_seconds()) + 60)
        retired = stack.invoke_function("ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"})
        steps.append({"step": "grace ended", "reaper_retired": retired.get("retired", [])})
    else:
        steps.append({"step": "not promoted", "deployment_id": second.deployment_id, "error": second.error})
    adapter_line = None
    if second.status == "succeeded" and not faults:
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
    return second, summary


def adapter_channel_name(channel: str) -> str:
    """The run's adapter channel beside CHANNEL (within a channel name's 24 characters)."""
    return f"{channel[:19].rstrip('-')}-lora"


def adapter_day(
    stack: Any, ctx: ChannelContext, name: str, workdir: Path, deploy: Callable[..., Any], on_state: Any
) -> dict[str, Any]:
    """A shared base with one adapter creates channel NAME; the next adapter arrives as files and a
    marker naming the channel (as a training pipeline uploads it) and is promoted onto the running
    base without a new endpoint; a rollback returns to the first; the channel is closed."""
    from modeldrop.local.samples.adapter import write_adapter
    from modeldrop.local.samples.checkpoint import write_checkpoint
    from modeldrop.local.scenarios import inputs as run_inputs

    base_dir = write_checkpoint(workdir / "lora-base")
    steps: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"name": name, "steps": steps}
    first_adapter = run_inputs.adapter_request(stack, base_dir, workdir, rank=8)["adapter_uri"]
    asks = {"channel": name, "gate": GATE}
    first = deploy(stack, base_dir, workdir, on_state, keep=True, key="local/lora-base/model.tar.gz",
                   request={"adapter_mode": "shared", "adapter_uri": first_adapter, **asks})  # fmt: skip
    if first.status != "succeeded":
        return {**summary, "error": f"the shared base failed: {first.error}: {cause_message(first.cause)}"}
    steps.append({"step": "created", "deployment_id": first.deployment_id, "invoke": _invoke(ctx, name)})
    before = _endpoints(ctx)
    second = _marker_deploy(stack, write_adapter(workdir / "lora-day2", r=8, seed=7), asks, on_state)
    if second["status"] != "SUCCEEDED":
        why = cause_message(second.get("cause"))  # the Lambda's errorMessage, never its stack trace
        summary["error"] = f"the day-2 adapter was not promoted: {second.get('error')}: {why}"
    else:
        promoted = ctx.channels.get(name)
        event = promoted.history[-1] if promoted and promoted.history else None
        steps.append({"step": "promoted, adapter only", "deployment_id": second["deployment_id"],
                      "invoke": _invoke(ctx, name), "endpoints_created": sorted(_endpoints(ctx) - before),
                      "seconds_to_serving": event.seconds if event else None,
                      "timed": event.reason if event else None})  # fmt: skip
        try:
            back = rollback(ctx, name, grace=GRACE)
            steps.append({"step": "rolled back", "deployment_id": back.live.deployment_id if back.live else None,
                          "invoke": back.invoke_target()})  # fmt: skip
        except ModeldropError as exc:
            summary["error"] = f"{type(exc).__name__}: {exc.message}"
    record = ctx.channels.get(name)
    summary["history"] = [e.model_dump(mode="json") for e in record.history] if record else []
    summary["closed"] = close_channel(ctx, name) if record else []
    return summary


def _marker_deploy(stack: Any, folder: Path, marker: dict[str, Any], on_state: Any) -> dict[str, Any]:
    """FOLDER's files uploaded under a prefix, then a modeldrop.json marker: the S3 event starts the
    execution (no direct start); returns how it ended, with its deployment id."""
    import json
    from datetime import datetime

    from modeldrop.aws.execution_watch import watch
    from modeldrop.contracts.models import deployment_id_of

    s3, sfn = stack.client("s3"), stack.client("stepfunctions")
    seen = {e["executionArn"] for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]}
    prefix = f"runs/{datetime.now().strftime('%Y%m%d-%H%M%S')}/{folder.name}/"
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        s3.upload_file(str(path), stack.bucket, prefix + path.name)
    s3.put_object(Bucket=stack.bucket, Key=prefix + "modeldrop.json", Body=json.dumps(marker).encode())
    stack.settle()
    started = [e for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
               if e["executionArn"] not in seen]  # fmt: skip
    if not started:
        return {"status": "NOT_STARTED", "error": "NoExecution", "cause": "the marker started no execution"}
    desc, _states = watch(sfn, started[0]["executionArn"], on_state, poll_seconds=0.02, timeout_seconds=300)
    stack.settle()
    return {**desc, "deployment_id": deployment_id_of(desc)}


def _invoke(ctx: ChannelContext, name: str) -> dict[str, str] | None:
    channel = ctx.channels.get(name)
    return channel.invoke_target() if channel else None


def _endpoints(ctx: ChannelContext) -> set[str]:
    return {e["EndpointName"] for e in ctx.sm.list_endpoints()["Endpoints"]}
