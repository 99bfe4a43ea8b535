"""The served copy is exactly the pinned version, whatever the key holds now, and goes away whole."""

from __future__ import annotations

import os
from typing import Any

import boto3
import pytest
from moto import mock_aws

from modeldrop.aws import served_copy
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable


@pytest.fixture
def s3() -> Any:
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bucket-x")
        client.put_bucket_versioning(Bucket="bucket-x", VersioningConfiguration={"Status": "Enabled"})
        yield client


@pytest.mark.parametrize("multipart", [False, True])
def test_the_copy_is_the_pinned_version_after_a_reupload(s3: Any, monkeypatch: Any, multipart: bool) -> None:
    if multipart:  # the >5 GiB path, on small parts
        monkeypatch.setattr(served_copy, "MAX_SINGLE_COPY", 6 * 1024 * 1024)
        monkeypatch.setattr(served_copy, "PART_BYTES", 5 * 1024 * 1024)
    data = os.urandom(17 * 1024 * 1024)
    version = s3.put_object(Bucket="bucket-x", Key="a/model.tar.gz", Body=data)["VersionId"]
    s3.put_object(Bucket="bucket-x", Key="a/model.tar.gz", Body=b"a corrupt re-upload")
    uri = str(served_copy.copy_pinned(s3, Artifact.parse("s3://bucket-x/a/model.tar.gz"), version, "dep-1"))
    assert uri == "s3://bucket-x/modeldrop-served/dep-1/model.tar.gz"
    assert s3.get_object(Bucket="bucket-x", Key="modeldrop-served/dep-1/model.tar.gz")["Body"].read() == data
    assert served_copy.delete_served(s3, "bucket-x", "dep-1") == [uri]
    assert "Versions" not in s3.list_object_versions(Bucket="bucket-x", Prefix="modeldrop-served/")


def test_a_prefix_that_changed_since_it_was_pinned_is_refused(s3: Any) -> None:
    from modeldrop.aws.artifact_version import artifact_identity

    s3.put_object(Bucket="bucket-x", Key="p/config.json", Body=b"{}")
    _identity, version = artifact_identity(s3, Artifact.parse("s3://bucket-x/p/"))
    s3.put_object(Bucket="bucket-x", Key="p/config.json", Body=b'{"changed": true}')
    with pytest.raises(CheckpointUnreadable, match="changed while it was being deployed"):
        served_copy.copy_pinned(s3, Artifact.parse("s3://bucket-x/p/"), version, "dep-2")
    assert "Versions" not in s3.list_object_versions(Bucket="bucket-x", Prefix="modeldrop-served/")
