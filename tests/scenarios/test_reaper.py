"""The reaper deletes only expired, managed endpoints (and orphans of ended deployments)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from conftest import create_endpoint

from modeldrop.aws.sagemaker.sagemaker_resources import tags_for
from modeldrop.contracts import clock


def _create(stack: Any, name: str, tags: list[dict[str, str]]) -> None:
    from modeldrop.local.samples.checkpoint import tar_gz_bytes, write_checkpoint

    sample = stack.hosting.scratch / "reaper-sample"
    archive = tar_gz_bytes(sample if sample.exists() else write_checkpoint(sample))
    create_endpoint(stack, name, archive, env={}, tags=tags)


def test_reaper_deletes_expired_managed_and_nothing_else(stack: Any) -> None:
    past = clock.iso(clock.utcnow() - timedelta(minutes=5))
    future = clock.iso(clock.utcnow() + timedelta(hours=2))
    _create(stack, "modeldrop-expired", tags_for("modeldrop-local", "expired", past))
    _create(stack, "modeldrop-fresh", tags_for("modeldrop-local", "fresh", future))
    _create(
        stack, "someone-elses", [{"Key": "team", "Value": "search"}, {"Key": "modeldrop:expires-at", "Value": past}]
    )
    _create(stack, "other-stack", tags_for("another-stack", "x", past))
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == ["modeldrop-expired"]
    sm = stack.client("sagemaker")
    endpoints = sm.list_endpoints()["Endpoints"]
    left = {f"endpoint/{e['EndpointName']}" for e in endpoints if e["EndpointStatus"] != "Deleting"}
    left |= {f"endpoint-config/{c['EndpointConfigName']}" for c in sm.list_endpoint_configs()["EndpointConfigs"]}
    left |= {f"model/{m['ModelName']}" for m in sm.list_models()["Models"]}
    assert not any("modeldrop-expired" in r for r in left)
    for name in ("modeldrop-fresh", "someone-elses", "other-stack"):
        assert {f"endpoint/{name}", f"endpoint-config/{name}", f"model/{name}"} <= left


def test_reaper_marks_the_deployment_expired(stack: Any, archive: bytes) -> None:
    # Not named model.tar.gz, so the upload itself starts nothing; the pipeline starts it directly.
    stack.client("s3").put_object(Bucket=stack.bucket, Key="ttl/weights.tar.gz", Body=archive)
    desc = stack.wait(
        stack.start({"artifact_uri": f"s3://{stack.bucket}/ttl/weights.tar.gz", "ttl_hours": 1}, name="ttl-run")
    )
    assert desc["status"] == "SUCCEEDED"
    name = json.loads(desc["output"])["endpoint_name"]
    assert stack.invoke_function("ReaperFunction", {})["expired"] == []
    clock.advance(2 * 3600)
    assert stack.invoke_function("ReaperFunction", {})["expired"] == [name]
    item = stack.table().get_item(Key={"deployment_id": json.loads(desc["output"])["deployment_id"]})["Item"]
    assert item["status"] == "expired"
    assert stack.leftover_resources() == []


def test_reaper_leaves_endpoints_that_cannot_be_deleted_yet(make_stack: Any) -> None:
    stack = make_stack(fault="slow-start", real_startup_grace=0.5)
    _create(
        stack, "modeldrop-busy", tags_for("modeldrop-local", "busy", clock.iso(clock.utcnow() - timedelta(hours=2)))
    )
    stack.client("sagemaker").describe_endpoint(EndpointName="modeldrop-busy")
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == []
    assert result["retry_next_run"] == ["modeldrop-busy (Creating)"]
    # Two hours past expiry is past two reaper periods: the overdue alarm's metric counts it.
    assert result["overdue"] == ["modeldrop-busy"]
    assert stack.hosting.running() == ["modeldrop-busy"]


def test_reaper_removes_orphans_of_ended_deployments(stack: Any) -> None:
    sm = stack.client("sagemaker")
    tags = tags_for("modeldrop-local", "gone", clock.iso(clock.utcnow() + timedelta(hours=1)))
    _create(stack, "modeldrop-gone", tags)
    sm.delete_endpoint(EndpointName="modeldrop-gone")  # a teardown that stopped half way
    assert sm.describe_endpoint(EndpointName="modeldrop-gone")["EndpointStatus"] == "Deleting"
    with pytest.raises(sm.exceptions.ClientError):  # ... and, as SageMaker does, the endpoint is gone later
        sm.describe_endpoint(EndpointName="modeldrop-gone")
    stack.table().put_item(Item={"deployment_id": "gone", "status": "failed", "steps": {}})
    result = stack.invoke_function("ReaperFunction", {})
    assert sorted(result["orphans_deleted"]) == ["endpoint-config/modeldrop-gone", "model/modeldrop-gone"]
    assert stack.leftover_resources() == []


def test_an_unreadable_or_missing_expiry_tag_falls_back_to_the_default_ttl(stack: Any) -> None:
    """Missing, empty or unparseable (even lower-case z) must not mean 'never reaped, never overdue'."""
    soon_lower = clock.iso(clock.utcnow() + timedelta(hours=1)).replace("Z", "z")
    cases = (
        ("modeldrop-notag", None),
        ("modeldrop-empty", ""),
        ("modeldrop-junk", "soon"),
        ("modeldrop-lower", soon_lower),
    )
    for name, value in cases:
        tags = [t for t in tags_for("modeldrop-local", name, "x") if t["Key"] != "modeldrop:expires-at"]
        if value is not None:
            tags.append({"Key": "modeldrop:expires-at", "Value": value})
        _create(stack, name, tags)
    assert stack.invoke_function("ReaperFunction", {})["expired"] == []  # within the default TTL (4 h)
    clock.advance(4 * 3600 + 60)
    result = stack.invoke_function("ReaperFunction", {})
    assert sorted(result["expired"]) == ["modeldrop-empty", "modeldrop-junk", "modeldrop-lower", "modeldrop-notag"]
    assert any("unreadable" in e for e in result["errors"]) and any(
        "no modeldrop:expires-at" in e for e in result["errors"]
    )


def test_one_refused_delete_does_not_end_the_run(stack: Any, monkeypatch: Any) -> None:
    from moto.sagemaker import models as sm_models
    from moto.sagemaker.exceptions import SagemakerClientError

    class Throttled(SagemakerClientError):
        code = "ThrottlingException"

    past = clock.iso(clock.utcnow() - timedelta(minutes=5))
    for name in ("modeldrop-a", "modeldrop-b"):
        _create(stack, name, tags_for("modeldrop-local", name, past))
    original = sm_models.SageMakerModelBackend.delete_endpoint

    def throttle_a(self: Any, endpoint_name: str) -> None:
        if endpoint_name == "modeldrop-a":
            raise Throttled("Rate exceeded")
        original(self, endpoint_name)

    monkeypatch.setattr(sm_models.SageMakerModelBackend, "delete_endpoint", throttle_a)
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == ["modeldrop-b"] and any("modeldrop-a" in e for e in result["errors"]), result


def test_a_copy_with_a_live_deployments_tags_does_not_touch_its_record(stack: Any, archive: bytes) -> None:
    stack.client("s3").put_object(Bucket=stack.bucket, Key="live/weights.tar.gz", Body=archive)
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/live/weights.tar.gz"}, name="live-run"))
    deployment_id = json.loads(desc["output"])["deployment_id"]
    # Someone creates an endpoint by hand, copying the live one's tags, with an expiry already past.
    _create(stack, "modeldrop-copy", tags_for("modeldrop-local", deployment_id, clock.iso(clock.utcnow())))
    clock.advance(60)
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == ["modeldrop-copy"]
    item = stack.table().get_item(Key={"deployment_id": deployment_id})["Item"]
    assert item["status"] == "succeeded"


def test_a_failed_deployments_endpoint_is_reaped_whatever_its_ttl(stack: Any, archive: bytes) -> None:
    stack.client("s3").put_object(Bucket=stack.bucket, Key="dead/weights.tar.gz", Body=archive)
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/dead/weights.tar.gz"}, name="dead-run"))
    out = json.loads(desc["output"])
    # Its record says failed (a teardown that never ran), its endpoint is still up, TTL far away: the
    # state written straight into the table, as no step may move a succeeded record to failed.
    stack.table().update_item(
        Key={"deployment_id": out["deployment_id"]},
        UpdateExpression="SET #s = :failed",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":failed": "failed"},
    )
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == [out["endpoint_name"]], result
    assert stack.table().get_item(Key={"deployment_id": out["deployment_id"]})["Item"]["status"] == "failed"


def test_the_reaper_deletes_served_copies_of_ended_deployments_only(stack: Any, archive: bytes) -> None:
    """A Lambda that ran on after its execution stopped may have written a served copy after the
    cleanup: the reaper deletes the copies of ended deployments (and, after an hour, of unknown ones)."""
    from modeldrop.local.emulator.iam.enforcement import acting_as

    registry = stack.registry()
    for deployment_id, status in (("ended-1", "aborted"), ("serving-1", None)):
        registry.register(deployment_id, deployment_id, {}, {}, f"arn:local:{deployment_id}")
        if status:
            registry.record(deployment_id, "execution_ended", {}, status=status)
    with acting_as(stack.functions["ValidateFunction"].principal):
        for deployment_id in ("ended-1", "serving-1", "unknown-1"):
            key = f"modeldrop-served/{deployment_id}/model.tar.gz"
            stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=archive)
        # A copy that is only an open upload: its Lambda was killed before any object was complete.
        stack.client("s3").create_multipart_upload(Bucket=stack.bucket, Key="modeldrop-served/killed-1/shard")
    soon = stack.invoke_function("ReaperFunction", {})
    assert soon["served_copies_deleted"] == [f"s3://{stack.bucket}/modeldrop-served/ended-1/model.tar.gz"]
    from modeldrop.aws import clients
    from modeldrop.pipeline.reaper.reaper import reap

    later = reap(
        stack.client("sagemaker"), registry, stack.client("events"), stack.resources["EventBus"], "modeldrop-local",
        "modeldrop", now=clock.utcnow() + timedelta(hours=2), s3=clients.s3(), bucket=stack.bucket,
    )  # fmt: skip
    assert later.served_copies_deleted[-1] == f"s3://{stack.bucket}/modeldrop-served/unknown-1/model.tar.gz"
    assert len(later.served_copies_deleted) == 2
    assert later.served_copies_deleted[0].startswith(f"s3://{stack.bucket}/modeldrop-served/killed-1/shard (upload ")
    left = stack.client("s3").list_objects_v2(Bucket=stack.bucket, Prefix="modeldrop-served/")["Contents"]
    assert [o["Key"] for o in left] == ["modeldrop-served/serving-1/model.tar.gz"]
    assert stack.client("s3").list_multipart_uploads(Bucket=stack.bucket).get("Uploads", []) == []


def test_an_ended_deployments_endpoint_whose_delete_keeps_failing_is_overdue(stack: Any, monkeypatch: Any) -> None:
    from moto.sagemaker import models as sm_models
    from moto.sagemaker.exceptions import SagemakerClientError

    class Refused(SagemakerClientError):
        code = "ValidationException"

    registry = stack.registry()
    registry.register("stuck-1", "stuck-1", {}, {"endpoint_name": "modeldrop-stuck"}, "arn:local:stuck-1")
    registry.record("stuck-1", "result", {}, status="failed", ended_at=clock.iso(clock.utcnow()))
    _create(
        stack, "modeldrop-stuck", tags_for("modeldrop-local", "stuck-1", clock.iso(clock.utcnow() + timedelta(days=2)))
    )

    def refuse(self: Any, endpoint_name: str) -> None:
        raise Refused("Cannot delete the endpoint right now")

    monkeypatch.setattr(sm_models.SageMakerModelBackend, "delete_endpoint", refuse)
    assert stack.invoke_function("ReaperFunction", {})["overdue"] == []  # just ended: retried next run
    clock.advance(3600)
    result = stack.invoke_function("ReaperFunction", {})
    assert result["overdue"] == ["modeldrop-stuck"] and result["expired"] == [], result


def _deployed(stack: Any, archive: bytes, key: str, **request: Any) -> dict[str, Any]:
    stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=archive)
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/{key}", **request}))
    assert desc["status"] == "SUCCEEDED", desc
    return json.loads(desc["output"])


def test_an_endpoint_deleted_out_of_band_closes_its_record_frees_its_claim_and_copy(stack: Any, archive: bytes) -> None:
    from modeldrop.aws.dynamodb import stack_budget

    out = _deployed(stack, archive, "oob/weights.tar.gz")
    sm = stack.client("sagemaker")
    sm.delete_endpoint(EndpointName=out["endpoint_name"])  # someone in the console
    stack.settle()
    result = stack.invoke_function("ReaperFunction", {})
    assert result["reconciled"] == [out["deployment_id"]], result
    record = stack.registry().get(out["deployment_id"])
    assert record.status == "torn_down" and record.ended_at is not None
    assert "deleted outside modeldrop" in json.dumps(record.step_dict("reconciled"))
    assert stack_budget.current(stack.table()) == (0.0, 0)
    served = stack.client("s3").list_objects_v2(Bucket=stack.bucket, Prefix="modeldrop-served/").get("Contents", [])
    assert served == []
    # The version is free again: the same bytes deploy anew.
    again = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/oob/weights.tar.gz"}))
    assert again["status"] == "SUCCEEDED", again.get("cause")


def test_an_expiry_tag_edited_past_the_records_is_not_honoured(stack: Any, archive: bytes) -> None:
    out = _deployed(stack, archive, "tag/weights.tar.gz", ttl_hours=1)
    sm = stack.client("sagemaker")
    arn = sm.describe_endpoint(EndpointName=out["endpoint_name"])["EndpointArn"]
    sm.add_tags(
        ResourceArn=arn,
        Tags=[{"Key": "modeldrop:expires-at", "Value": clock.iso(clock.utcnow() + timedelta(hours=100))}],
    )
    clock.advance(2 * 3600)
    assert stack.invoke_function("ReaperFunction", {})["expired"] == [out["endpoint_name"]]
    assert stack.registry().get(out["deployment_id"]).status == "expired"
