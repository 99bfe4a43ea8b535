"""The reaper deletes only expired, managed endpoints (and orphans of ended deployments)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from conftest import create_endpoint

from modeldrop.aws.sagemaker_resources import tags_for
from modeldrop.contracts import clock


def _create(stack: Any, name: str, tags: list[dict[str, str]]) -> None:
    from modeldrop.local.sample_checkpoint import tar_gz_bytes, write_checkpoint

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
    left = set(stack.leftover_resources())
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
    stack.table().put_item(Item={"deployment_id": "gone", "status": "failed", "steps": {}})
    result = stack.invoke_function("ReaperFunction", {})
    assert sorted(result["orphans_deleted"]) == ["endpoint-config/modeldrop-gone", "model/modeldrop-gone"]
    assert stack.leftover_resources() == []
