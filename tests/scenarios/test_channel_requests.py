"""`channel` in the request (and the marker): the state machine promotes by itself. The first
deployment creates the channel, a second is gated and promoted onto the same endpoint name by its
Promote task and the checks between its waits, a regressing one ends the execution PromotionBlocked
with the champion serving; a marker asking for a looser gate than the stack allows is refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz


def _upload(stack: Any, tmp_path: Path, name: str, shards: int = 2) -> str:
    packed = write_tar_gz(write_checkpoint(tmp_path / name, shards=shards), tmp_path / f"{name}.tar.gz")
    stack.client("s3").upload_file(str(packed), stack.bucket, f"direct/{name}/model.tar.gz")
    return f"s3://{stack.bucket}/direct/{name}/model.tar.gz"


def _versions(stack: Any, tmp_path: Path, count: int) -> list[Any]:
    """COUNT succeeded deployments of distinct generated checkpoints (v1, v2, ...), their endpoints kept."""
    from modeldrop.local.scenarios.run import _deploy

    runs = [
        _deploy(stack, write_checkpoint(tmp_path / f"v{i}", shards=i + 1), tmp_path, None,
                key=f"local/v{i}/model.tar.gz", request={"ttl_hours": 2}, keep=True)
        for i in range(1, count + 1)
    ]  # fmt: skip
    assert all(r.status == "succeeded" for r in runs), [(r.error, r.cause) for r in runs]
    return runs


def _run(stack: Any, request: dict[str, Any]) -> dict[str, Any]:
    desc = stack.wait(stack.start(request), timeout=240)
    return {**desc, "output": json.loads(desc["output"]) if desc.get("output") else None}


def test_the_state_machine_creates_the_channel_then_promotes_onto_it(make_stack: Any, tmp_path: Path) -> None:
    stack = make_stack({"MaxEvalTolerance": "10", "MaxGateLatencySlack": "30"})
    sm = stack.client("sagemaker")
    gate = {"latency_slack_s": 30}
    first = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "day1"), "channel": "main", "gate": gate})
    assert first["status"] == "SUCCEEDED", (first.get("error"), first.get("cause"))
    created = first["output"]["channel"]
    assert created["status"] == "serving" and created["endpoint_name"] == "modeldrop-ch-main"
    first_id = first["output"]["deployment_id"]
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointStatus"] == "InService"

    second = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "day2", 3), "channel": "main", "gate": gate})
    assert second["status"] == "SUCCEEDED", (second.get("error"), second.get("cause"))
    promoted = second["output"]["channel"]
    assert promoted["status"] == "serving" and promoted["gate"].startswith("promotable")
    second_id = second["output"]["deployment_id"]
    record = stack.registry().get(second_id)
    assert record.step_dict("promoted")["channel"] == "main"
    config = sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointConfigName"]
    assert second_id in config
    history = stack.client("stepfunctions").get_execution_history(executionArn=second["executionArn"],
                                                                  maxResults=1000)["events"]  # fmt: skip
    entered = [e["stateEnteredEventDetails"]["name"] for e in history if "stateEnteredEventDetails" in e]
    assert entered[-4:] == ["Promote", "PromotionSettled", "WaitForPromotion", "CheckPromotion"] or (
        "CheckPromotion" in entered and entered[-1] == "Promoted"
    ), entered[-8:]

    # A regressing candidate: the execution ends PromotionBlocked, the channel serves the second.
    stack.hosting.plan("truncate")
    third = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "day3"), "channel": "main", "gate": gate,
                         "eval_thresholds": {"max_truncated": 10}})  # fmt: skip
    assert third["status"] == "FAILED" and third["error"] == "PromotionBlocked", third.get("cause")
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointConfigName"] == config
    from modeldrop.aws.dynamodb.channel_store import ChannelStore

    channel = ChannelStore(stack.registry().table).get("main")
    assert channel is not None and channel.live is not None and channel.live.deployment_id == second_id
    assert [e.kind for e in channel.history] == ["created", "promoted", "blocked"]
    assert channel.kept[0].deployment_id == first_id
    blocked_id = channel.history[-1].deployment_id
    blocked_record = stack.registry().get(str(blocked_id))
    assert blocked_record.status == "torn_down", channel.history[-1].reason
    # The candidate's own record says why, as `status` of the deployment shows it.
    assert blocked_record.error == "PromotionBlocked" and "regressed" in str(blocked_record.failure_reason)
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel

    close_channel(channel_context(stack), "main")
    assert stack.leftover_resources() == []


def test_a_request_cannot_loosen_the_gate_past_the_stack(make_stack: Any, tmp_path: Path) -> None:
    stack = make_stack()
    run = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "loose"), "channel": "main",
                       "gate": {"max_regressed_cases": 3}})  # fmt: skip
    assert run["status"] == "FAILED" and run["error"] == "LimitExceeded"
    assert "MaxGateRegressions" in run["cause"]
    bad = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "bad"), "channel": "Main_1"})
    assert bad["status"] == "FAILED" and bad["error"] == "RequestInvalid"


def test_a_marker_naming_an_adapter_channel_puts_its_adapter_on_the_base_with_no_endpoint(
    make_stack: Any, tmp_path: Path
) -> None:
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.local.samples.adapter import write_adapter

    stack = make_stack({"MaxGateLatencySlack": "30"})
    s3, sm = stack.client("s3"), stack.client("sagemaker")
    base = _upload(stack, tmp_path, "base")
    packed = write_tar_gz(write_adapter(tmp_path / "day1", seed=1), tmp_path / "day1.tar.gz")
    s3.upload_file(str(packed), stack.bucket, "direct/day1/adapter.tar.gz")
    first = _run(stack, {"artifact_uri": f"s3://{stack.bucket}/direct/day1/adapter.tar.gz", "base": base,
                         "adapter_mode": "shared", "channel": "support", "gate": {"latency_slack_s": 30}})  # fmt: skip
    assert first["status"] == "SUCCEEDED", (first.get("error"), first.get("cause"))
    assert first["output"]["channel"]["invoke"]["InferenceComponentName"].endswith("-day1")
    endpoints = sm.list_endpoints()["Endpoints"]

    # Day 2: the adapter's files and a marker naming the channel, nothing else -- as a pipeline uploads them.
    day2 = write_adapter(tmp_path / "day2", seed=2)
    second = _marker_run(stack, day2, {"channel": "support", "gate": {"latency_slack_s": 30}}, first["executionArn"])
    assert second["status"] == "SUCCEEDED", (second.get("error"), second.get("cause"))
    promoted = second["output"]["channel"]
    assert promoted["status"] == "serving" and "-day2" in promoted["invoke"]["InferenceComponentName"]
    assert sm.list_endpoints()["Endpoints"] == endpoints  # no endpoint created
    channel = ChannelStore(stack.registry().table).get("support")
    assert channel is not None and channel.live is not None
    assert channel.live.deployment_id == second["output"]["deployment_id"]
    event = channel.history[-1]
    assert event.kind == "promoted" and event.reason == "timed from its marker" and event.seconds > 0
    assert promoted["seconds"] == event.seconds
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel

    close_channel(channel_context(stack), "support")
    assert stack.leftover_resources() == []


def _marker_run(stack: Any, folder: Path, marker: dict[str, Any], before: str) -> dict[str, Any]:
    """FOLDER's files under runs/day2/, then MARKER beside them, as a pipeline uploads them: the execution
    the marker's event started (the one besides BEFORE's), followed to its end."""
    s3 = stack.client("s3")
    for path in sorted(folder.iterdir()):
        s3.upload_file(str(path), stack.bucket, f"runs/day2/{path.name}")
    s3.put_object(Bucket=stack.bucket, Key="runs/day2/modeldrop.json", Body=json.dumps(marker).encode())
    stack.settle()
    sfn = stack.client("stepfunctions")
    started = [e for e in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
               if e["executionArn"] != before]  # fmt: skip
    assert len(started) == 1
    return _run_existing(stack, started[0]["executionArn"])


def _run_existing(stack: Any, arn: str) -> dict[str, Any]:
    desc = stack.wait(arn, timeout=240)
    return {**desc, "output": json.loads(desc["output"]) if desc.get("output") else None}


def test_a_retried_start_checks_and_a_stale_promotion_does_not_hold_the_channel(
    make_stack: Any, tmp_path: Path
) -> None:
    import pytest

    from modeldrop.contracts import clock
    from modeldrop.contracts.errors import ChannelInvalid
    from modeldrop.contracts.models import NormalizedRequest
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel
    from modeldrop.pipeline.channels.promotion import promote, start_promotion
    from modeldrop.pipeline.channels.promotion_steps import promotion_step

    stack = make_stack({"MaxGateLatencySlack": "30"})
    ctx = channel_context(stack)
    cases_gate = {"latency_slack_s": 30}
    runs = _versions(stack, tmp_path, 3)
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds

    cases, gate = load_eval_set(None, None), GateThresholds(**cases_gate)
    promote(ctx, str(runs[0].deployment_id), "main", cases, gate)
    pending = start_promotion(ctx, str(runs[1].deployment_id), "main", cases, gate)
    assert pending.candidate is not None and pending.candidate.phase == "updating"
    # The state machine's start, retried after the claim: it checks instead of failing as busy.
    record = ctx.registry.get(str(runs[1].deployment_id))
    request = NormalizedRequest.model_validate({**(record.request or {}), "channel": "main", "gate": cases_gate})
    progress = promotion_step(ctx, request, "start", str(record.execution_arn))
    assert progress.deployment_id == runs[1].deployment_id and progress.channel == "main"
    # Another deployment meanwhile is refused as busy ...
    with pytest.raises(ChannelInvalid, match="busy"):
        start_promotion(ctx, str(runs[2].deployment_id), "main", cases, gate)
    # ... until nobody has checked the one under way for longer than its budget (its update's own timeout,
    # from the candidate's plan, and a margin): then it is settled first.
    assert 600 + 600 <= pending.candidate.budget_seconds <= 28_800 + 600
    clock.advance(pending.candidate.budget_seconds + 60)
    channel = promote(ctx, str(runs[2].deployment_id), "main", cases, gate)
    assert channel.live is not None and channel.live.deployment_id == runs[2].deployment_id
    assert [e.kind for e in channel.history] == ["created", "promoted", "promoted"]
    close_channel(ctx, "main")


def test_a_channel_name_taken_by_another_endpoint_is_refused_and_that_endpoint_left_alone(
    make_stack: Any, tmp_path: Path, archive: bytes
) -> None:
    import pytest
    from conftest import create_endpoint

    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.contracts.errors import PromotionFailed
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.local.scenarios.run import _deploy
    from modeldrop.pipeline.channels.promotion import promote

    stack = make_stack()
    create_endpoint(stack, "modeldrop-ch-main", archive, managed_by="someone-else")
    run = _deploy(stack, None, tmp_path, None, keep=True, key="local/v1/model.tar.gz", request={"ttl_hours": 1})
    assert run.status == "succeeded"
    with pytest.raises(PromotionFailed, match="could not be created"):
        promote(channel_context(stack), str(run.deployment_id), "main", load_eval_set(None, None), GateThresholds())
    sm = stack.client("sagemaker")
    assert sm.describe_endpoint(EndpointName="modeldrop-ch-main")["EndpointStatus"] != "Deleting"
    assert ChannelStore(stack.registry().table).get("main") is None  # the claim is undone


def test_a_marker_cannot_choose_the_cases_the_gate_judges_by(make_stack: Any, tmp_path: Path) -> None:
    """A bucket writer's marker names its own one-case eval set (max_tokens 1: both answers cut) for a
    candidate whose every answer truncates: the gate still judges by the channel's pinned cases, and the
    candidate is PromotionBlocked, the champion serving on. The same set overwritten is refused too."""
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.local.samples.checkpoint import write_checkpoint

    stack = make_stack({"MaxEvalTolerance": "100", "MaxGateLatencySlack": "30"})
    s3 = stack.client("s3")
    gate = {"latency_slack_s": 30}
    first = _run(stack, {"artifact_uri": _upload(stack, tmp_path, "day1"), "channel": "main", "gate": gate})
    assert first["status"] == "SUCCEEDED", (first.get("error"), first.get("cause"))
    store = ChannelStore(stack.registry().table)
    pinned = store.get("main")
    assert pinned is not None and pinned.eval_set is not None and pinned.eval_set.source is None  # built-in
    one = {"id": "one", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    s3.put_object(Bucket=stack.bucket, Key="evals/one.jsonl", Body=(json.dumps(one) + "\n").encode())

    stack.hosting.plan("truncate")  # the candidate cuts every answer
    day2 = write_checkpoint(tmp_path / "day2", shards=3)
    marker = {"channel": "main", "gate": gate, "eval_set_uri": f"s3://{stack.bucket}/evals/one.jsonl",
              "eval_thresholds": {"max_truncated": 100}}  # fmt: skip
    second = _marker_run(stack, day2, marker, first["executionArn"])
    assert second["status"] == "FAILED" and second["error"] == "PromotionBlocked", (second.get("cause"),)
    channel = store.get("main")
    assert channel is not None and channel.live is not None and channel.candidate is None
    assert channel.live.deployment_id == first["output"]["deployment_id"]
    assert channel.history[-1].kind == "blocked" and channel.history[-1].gate is not None
    assert len(channel.history[-1].gate["cases"]) == pinned.eval_set.cases  # the pinned cases, not the marker's
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel

    close_channel(channel_context(stack), "main")
    assert stack.leftover_resources() == []


def test_a_pinned_eval_set_overwritten_in_the_bucket_is_refused(make_stack: Any) -> None:
    import pytest

    from modeldrop.contracts.errors import ChannelInvalid
    from modeldrop.evaluation.eval_sets import pin_eval_set, pinned_cases

    stack = make_stack()
    s3 = stack.client("s3")
    case = {"id": "a", "messages": [{"role": "user", "content": "hi"}]}
    s3.put_object(Bucket=stack.bucket, Key="evals/gate.jsonl", Body=(json.dumps(case) + "\n").encode())
    pin, cases = pin_eval_set(f"s3://{stack.bucket}/evals/gate.jsonl", s3, "2026-01-01T00:00:00Z")
    assert pin.cases == len(cases) == 1 and len(pinned_cases(pin, s3)) == 1
    s3.put_object(Bucket=stack.bucket, Key="evals/gate.jsonl", Body=b'{"id": "b", "messages": []}\n')
    if pin.version_id:  # a versioned bucket: the pinned version is read, whatever was written since
        assert [c.id for c in pinned_cases(pin, s3)] == ["a"]
    else:
        with pytest.raises(ChannelInvalid, match="changed since it was pinned"):
            pinned_cases(pin, s3)
    unversioned = pin.model_copy(update={"version_id": None})
    with pytest.raises(ChannelInvalid, match="changed since it was pinned"):
        pinned_cases(unversioned, s3)


def test_a_promotion_is_refused_busy_while_a_rollback_is_in_flight(make_stack: Any, tmp_path: Path) -> None:
    """A rollback claims the channel before it touches the endpoint, as a promotion does: a promotion that
    starts while it is in flight is refused busy with the endpoint untouched, one that read the channel
    before the claim fails its own claim (ChannelChanged), and the record names the config served."""
    from datetime import timedelta

    import pytest

    from modeldrop.aws.dynamodb.channel_store import ChannelChanged
    from modeldrop.contracts.errors import ChannelInvalid
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel
    from modeldrop.pipeline.channels.channel_context import promotion_timeouts, start_update
    from modeldrop.pipeline.channels.promotion import promote, start_promotion
    from modeldrop.pipeline.channels.promotion_settle import claim_rollback, settle_rollback

    stack = make_stack()
    ctx = channel_context(stack)
    runs = _versions(stack, tmp_path, 3)
    cases, gate = load_eval_set(None, None), GateThresholds(latency_slack_s=30)
    promote(ctx, str(runs[0].deployment_id), "main", cases, gate)
    channel = promote(ctx, str(runs[1].deployment_id), "main", cases, gate)
    stale_read = ctx.channels.get("main")  # a promotion's twin read, before the rollback claims
    target = channel.last_known_good()
    assert target is not None and target.deployment_id == runs[0].deployment_id
    timeout, budget = promotion_timeouts(ctx.registry.get(str(runs[0].deployment_id)))
    claimed = claim_rollback(ctx, channel, target, timedelta(hours=1), budget)
    start_update(ctx, claimed, target, 1, timeout)  # the rollback's update, in flight
    sm = stack.client("sagemaker")
    assert sm.describe_endpoint(EndpointName=channel.endpoint_name)["EndpointStatus"] == "Updating"
    with pytest.raises(ChannelInvalid, match="busy"):
        start_promotion(ctx, str(runs[2].deployment_id), "main", cases, gate)
    assert stale_read is not None
    with pytest.raises(ChannelChanged):
        ctx.channels.save(stale_read.model_copy(update={"candidate": claimed.candidate}))
    # The record still names the config the endpoint serves until the rollback has settled ...
    record = ctx.channels.get("main")
    assert record is not None and record.live is not None
    assert record.live.endpoint_config == sm.describe_endpoint(EndpointName=channel.endpoint_name)["EndpointConfigName"]
    from modeldrop.contracts import clock

    clock.advance(3600)
    for _ in range(20):
        if sm.describe_endpoint(EndpointName=channel.endpoint_name)["EndpointStatus"] == "InService":
            break
    settled = settle_rollback(ctx, ctx.channels.get("main"))
    # ... and names the rollback's target once it does.
    served = sm.describe_endpoint(EndpointName=channel.endpoint_name)["EndpointConfigName"]
    assert settled.candidate is None and settled.live is not None and settled.live.endpoint_config == served
    assert settled.live.deployment_id == runs[0].deployment_id and settled.history[-1].kind == "rolled_back"
    close_channel(ctx, "main")


def test_an_update_refused_for_quota_ends_promotion_failed_with_the_channel_free(
    make_stack: Any, tmp_path: Path
) -> None:
    """UpdateEndpoint's green fleet counts against the account's endpoint quota as SageMaker counts it: a
    refusal (ResourceLimitExceeded) ends the promotion PromotionFailed, the claim released, the candidate's
    record saying why and nothing of it left but what its TTL governs."""
    import pytest

    from modeldrop.contracts.errors import PromotionFailed
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.local.emulator import service_quotas
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel
    from modeldrop.pipeline.channels.promotion import promote

    stack = make_stack()
    ctx = channel_context(stack)
    runs = _versions(stack, tmp_path, 2)
    cases, gate = load_eval_set(None, None), GateThresholds(latency_slack_s=30)
    promote(ctx, str(runs[0].deployment_id), "main", cases, gate)
    candidate = ctx.registry.get(str(runs[1].deployment_id))
    assert candidate is not None and candidate.instance_type
    service_quotas.set_endpoint_quota(candidate.instance_type, 1)  # the channel's own fleet fills it
    with pytest.raises(PromotionFailed, match="ResourceLimitExceeded"):
        promote(ctx, str(runs[1].deployment_id), "main", cases, gate)
    channel = ctx.channels.get("main")
    assert channel is not None and channel.candidate is None
    assert channel.live is not None and channel.live.deployment_id == runs[0].deployment_id
    assert channel.history[-1].kind == "promotion_failed" and "ResourceLimitExceeded" in channel.history[-1].reason
    record = ctx.registry.get(str(runs[1].deployment_id))
    assert record is not None and record.error == "PromotionFailed" and record.status == "torn_down"
    assert "ResourceLimitExceeded" in (record.failure_reason or "")
    close_channel(ctx, "main")
    assert stack.leftover_resources() == []


def test_the_reaper_settles_a_promotion_nobody_checked(make_stack: Any, tmp_path: Path) -> None:
    """A promotion whose execution stopped after its claim does not hold the channel until another one
    happens to come: the reaper (the deployed function, under its own IAM) settles it on its schedule."""
    from modeldrop.contracts import clock
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_admin import close_channel
    from modeldrop.pipeline.channels.promotion import promote, start_promotion

    stack = make_stack()
    ctx = channel_context(stack)
    runs = _versions(stack, tmp_path, 2)
    cases, gate = load_eval_set(None, None), GateThresholds(latency_slack_s=30)
    promote(ctx, str(runs[0].deployment_id), "main", cases, gate)
    pending = start_promotion(ctx, str(runs[1].deployment_id), "main", cases, gate)
    assert pending.candidate is not None
    early = stack.invoke_function("ReaperFunction", {})
    assert early["settled"] == [] and early["errors"] == []  # within its budget: left to its checks
    clock.advance(pending.candidate.budget_seconds + 60)
    sm = stack.client("sagemaker")
    for _ in range(40):  # the emulated update moves on as it is described (SageMaker's has long finished)
        if sm.describe_endpoint(EndpointName=pending.endpoint_name)["EndpointStatus"] != "Updating":
            break
    done = stack.invoke_function("ReaperFunction", {})
    assert done["errors"] == [] and len(done["settled"]) == 1, done
    channel = ctx.channels.get("main")
    assert channel is not None and channel.candidate is None
    assert channel.live is not None and channel.live.deployment_id == runs[1].deployment_id
    close_channel(ctx, "main")
    assert stack.leftover_resources() == []


def test_the_reaper_keeps_a_rollbacks_target_and_finishes_a_close_that_stopped(make_stack: Any, tmp_path: Path) -> None:
    """A kept version past its grace is not deleted while a claim may move the endpoint onto it; a close
    whose CLI died after its claim is finished by the reaper (its endpoint would bill on with no TTL)."""
    from datetime import timedelta

    from modeldrop.contracts import clock
    from modeldrop.contracts.channel import ChannelEvent, PendingPromotion
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels.channel_upkeep import retire_due
    from modeldrop.pipeline.channels.promotion import promote
    from modeldrop.pipeline.channels.promotion_settle import claim_rollback

    stack = make_stack()
    ctx = channel_context(stack)
    runs = _versions(stack, tmp_path, 2)
    cases, gate = load_eval_set(None, None), GateThresholds(latency_slack_s=30)
    promote(ctx, str(runs[0].deployment_id), "main", cases, gate)
    channel = promote(ctx, str(runs[1].deployment_id), "main", cases, gate, grace=timedelta(minutes=5))
    target = channel.last_known_good()
    assert target is not None
    claimed = claim_rollback(ctx, channel, target, timedelta(hours=1), 3600)
    clock.advance(600)  # the kept version's grace is over; the rollback's claim is not
    assert retire_due(ctx.sm, ctx.registry, ctx.channels, [claimed], ctx.s3) == []
    sm = stack.client("sagemaker")
    assert sm.describe_endpoint_config(EndpointConfigName=target.endpoint_config)  # still there to move onto
    # The rollback's process dies; so does a close's, after its claim.
    fresh = ctx.channels.get("main")
    assert fresh is not None and fresh.candidate is not None
    closing = PendingPromotion(version=fresh.live or target, phase="closing", started_at=clock.iso(clock.utcnow()),
                               event=ChannelEvent(at=clock.iso(clock.utcnow()), kind="retired"))  # fmt: skip
    ctx.channels.save(fresh.model_copy(update={"candidate": closing}))
    clock.advance(closing.budget_seconds + 60)
    from modeldrop.aws.sagemaker.sagemaker_resources import describe_endpoint

    for endpoint in sm.list_endpoints()["Endpoints"]:  # an hour on, the previews deleted long ago are gone
        describe_endpoint(sm, endpoint["EndpointName"])
    done = stack.invoke_function("ReaperFunction", {})
    assert done["errors"] == [] and any("finished" in line for line in done["settled"]), "\n".join(done["errors"])
    assert ctx.channels.get("main") is None
    assert stack.leftover_resources() == []
