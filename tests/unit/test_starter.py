"""The S3 starter's key rules and the ids it derives, as pure functions."""

from __future__ import annotations

import pytest

from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import deployment_id_for, resource_name_for
from modeldrop.pipeline.deployment.starter import classify_key, execution_name, parse_marker


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("a/model.tar.gz", "archive"),
        ("model.tar.gz", "archive"),
        ("a/modeldrop.json", "marker"),
        ("a/model.tar.gz.tmp", None),
        ("a/config.json", None),
        ("a/my-modeldrop.json", None),
    ],
)
def test_key_classification(key: str, kind: str | None) -> None:
    assert classify_key(key) == kind


def test_execution_name_is_deterministic_per_version() -> None:
    assert execution_name("b", "k", "v1") == execution_name("b", "k", "v1")
    assert execution_name("b", "k", "v1") != execution_name("b", "k", "v2")
    assert len(execution_name("b", "k" * 500, None)) <= 80


def test_marker_overrides_are_checked() -> None:
    assert parse_marker(b"{}", "u") == {}
    with pytest.raises(RequestInvalid, match="empty"):  # not JSON: the schema's verdict, with the fix
        parse_marker(b"", "u")
    assert parse_marker(b'{"engine": "lmi"}', "u") == {"engine": "lmi"}
    with pytest.raises(RequestInvalid, match="unknown override"):
        parse_marker(b'{"role_arn": "x"}', "u")
    with pytest.raises(RequestInvalid, match="not valid JSON"):
        parse_marker(b"{", "u")


def test_ids_fit_sagemaker_names_and_never_collide() -> None:
    started = 1_764_648_445_400
    long = deployment_id_for("Pipeline Run #42 for Gemma-4 E4B with a very long description", started)
    assert len(resource_name_for("modeldrop-longest-pr", long)) <= 63
    # A name that is not a slug, and an execution named exactly what that name's id looked like.
    slugged = deployment_id_for("Train_Run_1", started)
    assert deployment_id_for(slugged, started) != slugged
    # A name reused after Step Functions' 90-day window: another start, another id.
    assert deployment_id_for("run-7", started) != deployment_id_for("run-7", started + 90 * 86_400_000)
    assert deployment_id_for("run-7", started).startswith("run-7-")


def test_a_marker_key_typo_is_refused_with_its_close_match() -> None:
    from modeldrop.pipeline.deployment.starter import parse_marker

    with pytest.raises(RequestInvalid, match="'instnce_type': did you mean 'instance_type'"):
        parse_marker(b'{"instnce_type": "ml.g6.2xlarge"}', "s3://b/run/modeldrop.json")
