"""The typed values the steps pass: the artifact (parsed once, in the request) and the deployment record."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from pydantic import ValidationError

from modeldrop.contracts.artifact import Artifact, is_compressed
from modeldrop.contracts.models import DeploymentRequest
from modeldrop.contracts.record import DeploymentRecord, step_key


@pytest.mark.parametrize(
    ("uri", "kind"),
    [("s3://bucket-a/runs/7/model.tar.gz", "tar.gz"), ("s3://bucket-a/runs/7/", "prefix")],
)
def test_an_artifact_is_one_of_the_two_shapes_sagemaker_loads(uri: str, kind: str) -> None:
    artifact = DeploymentRequest(artifact_uri=uri).artifact_uri  # type: ignore[arg-type]
    assert isinstance(artifact, Artifact) and artifact.kind == kind and str(artifact) == uri
    assert artifact.compressed == (kind == "tar.gz") and artifact.folder == "runs/7/"
    # On the wire (state payloads, the record, the schema) it stays the string it was given.
    assert DeploymentRequest(artifact_uri=uri).model_dump(mode="json")["artifact_uri"] == uri  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "uri", ["s3://bucket-a/model.tar", "s3://bucket-a/model.tgz", "s3://bucket-a/weights.safetensors", "s3://bucket-a/"]
)
def test_other_shapes_are_refused_where_the_request_is_read(uri: str) -> None:
    with pytest.raises(ValidationError, match="artifact_uri"):
        DeploymentRequest(artifact_uri=uri)  # type: ignore[arg-type]


def test_one_rule_for_compression_by_name() -> None:
    assert is_compressed("a/model.tar.gz") and is_compressed("x.tgz") and not is_compressed("model.tar")


def test_a_record_is_decoded_once_from_the_table_item() -> None:
    item = {
        "deployment_id": "d-1",
        "status": "succeeded",
        "request": json.dumps({"artifact_uri": "s3://bucket-a/m/model.tar.gz"}),
        "steps": {"build_env": json.dumps({"instance_type": "ml.g6.2xlarge"}), "build_env_2": json.dumps({"x": 1})},
        "instance_count": Decimal(2),
        "artifact_uri": "s3://bucket-a/m/model.tar.gz",
        "hourly_price": "1.5",
        "started_at": "2026-12-01T00:00:00Z",
        "ended_at": "2026-12-01T02:00:00Z",
        "written_by_a_newer_version": True,
    }
    record = DeploymentRecord.from_item(item)
    assert record.instance_count == 2 and record.terminal and record.artifact_uri is not None
    assert record.step("build_env") == {"instance_type": "ml.g6.2xlarge"} and record.step("build_env", 1) == {"x": 1}
    assert step_key("build_env", 1) == "build_env_2" and record.step_dict("smoke_eval") == {}
    assert record.cost_so_far() == 6.0  # 2 hours x $1.5 x 2 instances
    dumped = record.to_json()
    assert dumped["artifact_uri"] == "s3://bucket-a/m/model.tar.gz" and dumped["written_by_a_newer_version"] is True
    json.dumps(dumped)  # plain JSON: no Decimal, no Artifact


def test_every_request_field_reaches_the_steps_as_given() -> None:
    """A new request field needs no code in normalize: every field not given a stack default there
    passes through unchanged."""
    from modeldrop.contracts.models import NormalizedRequest
    from modeldrop.pipeline.config import DefaultsSettings
    from modeldrop.pipeline.deployment.steps import normalize

    raw = {
        "artifact_uri": "s3://bucket-a/m/model.tar.gz",
        "instance_count": 3,
        "max_hourly_price": 9.5,
        "quota_wait_minutes": 5,
        "max_model_len": 8192,
        "engine_env": {"SM_VLLM_ENABLE_CHUNKED_PREFILL": ""},
        "engine_settings": {"gpu_memory_utilization": 0.8},
        "force_plan": True,
    }
    defaults = DefaultsSettings(allow_force_plan=True, max_instance_count=3)
    req = normalize(raw, "run-1", defaults, "arn:aws:states:us-east-1:1:execution:sm:run-1", 0)
    assert set(DeploymentRequest.model_fields) <= set(NormalizedRequest.model_fields)
    given = DeploymentRequest.model_validate(raw)
    redefined = set(NormalizedRequest.model_fields) - set(DeploymentRequest.model_fields) | {
        "engine", "instance_type", "instance_types", "ttl_hours", "max_hourly_price"
    }  # fmt: skip
    for name in set(DeploymentRequest.model_fields) - redefined:
        assert getattr(req, name) == getattr(given, name), name
    assert req.engine == "vllm" and req.instance_count == 3 and req.quota_wait_seconds == 300
