"""The served copy is exactly the pinned version, whatever the key holds now, and goes away whole."""

from __future__ import annotations

import itertools
import os
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from modeldrop.aws.s3 import served_copy
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable


@pytest.fixture
def s3() -> Any:
    from modeldrop.local.emulator.s3 import shims as s3_shims

    s3_shims.install()  # S3's copy preconditions, which moto ignores
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="bucket-x")
        client.put_bucket_versioning(Bucket="bucket-x", VersioningConfiguration={"Status": "Enabled"})
        yield client


@pytest.mark.parametrize("multipart", [False, True])
def test_a_copy_is_pinned_to_the_listed_etag(s3: Any, monkeypatch: Any, multipart: bool) -> None:
    if multipart:  # parallel part copies, on small parts
        monkeypatch.setattr(served_copy, "MULTIPART_FROM", 6 * 1024 * 1024)
        monkeypatch.setattr(served_copy, "MIN_PART", 5 * 1024 * 1024)
    data = os.urandom(17 * 1024 * 1024)
    etag = s3.put_object(Bucket="bucket-x", Key="p/model.safetensors", Body=data)["ETag"]
    parts = served_copy.copy_pinned(s3, "bucket-x", "p/model.safetensors", etag, "modeldrop-served/d/m", len(data))
    assert parts == (4 if multipart else 1)
    assert s3.get_object(Bucket="bucket-x", Key="modeldrop-served/d/m")["Body"].read() == data
    # Re-uploaded since it was listed: S3 refuses the copy (PreconditionFailed), nothing is left half-made.
    s3.put_object(Bucket="bucket-x", Key="p/model.safetensors", Body=b"a corrupt re-upload" * 10**6)
    with pytest.raises(ClientError, match="PreconditionFailed"):
        served_copy.copy_pinned(s3, "bucket-x", "p/model.safetensors", etag, "modeldrop-served/d/n", len(data))
    assert s3.list_multipart_uploads(Bucket="bucket-x").get("Uploads", []) == []
    deleted = served_copy.delete_served(s3, "bucket-x", "d")
    assert deleted == ["s3://bucket-x/modeldrop-served/d/m"]
    assert "Versions" not in s3.list_object_versions(Bucket="bucket-x", Prefix="modeldrop-served/")


def test_a_prefix_that_changed_since_it_was_pinned_is_refused(s3: Any) -> None:
    from modeldrop.aws.s3.artifact_version import artifact_facts

    s3.put_object(Bucket="bucket-x", Key="p/config.json", Body=b"{}")
    facts = artifact_facts(s3, Artifact.parse("s3://bucket-x/p/"))
    items = served_copy.copy_items(facts.objects, Artifact.parse("s3://bucket-x/p/"))
    served = Artifact.parse("s3://bucket-x/modeldrop-served/dep-2/")
    s3.copy_object(Bucket="bucket-x", Key="modeldrop-served/dep-2/config.json", CopySource="bucket-x/p/config.json")
    served_copy.served_matches(s3, Artifact.parse("s3://bucket-x/p/"), facts.version, served, items)
    s3.put_object(Bucket="bucket-x", Key="p/config.json", Body=b'{"changed": true}')
    with pytest.raises(CheckpointUnreadable, match="changed while it was being deployed"):
        served_copy.served_matches(s3, Artifact.parse("s3://bucket-x/p/"), facts.version, served, items)


def test_a_served_copy_missing_an_object_is_refused(s3: Any) -> None:
    s3.put_object(Bucket="bucket-x", Key="p/a.safetensors", Body=b"x")
    s3.put_object(Bucket="bucket-x", Key="p/config.json", Body=b"{}")
    facts_items = [
        served_copy.CopyItem(key="a.safetensors", size=1, etag="e"),
        served_copy.CopyItem(key="config.json", size=2, etag="e"),
    ]
    s3.put_object(Bucket="bucket-x", Key="modeldrop-served/d/config.json", Body=b"{}")
    with pytest.raises(CheckpointUnreadable, match=r"missing \['a.safetensors'\]"):
        served_copy.served_matches(
            s3,
            Artifact.parse("s3://bucket-x/p/"),
            None,
            Artifact.parse("s3://bucket-x/modeldrop-served/d/"),
            facts_items,
        )


def test_an_archive_is_served_as_the_members_its_validation_read(s3: Any, monkeypatch: Any, tmp_path: Any) -> None:
    """The validating pass writes each member as it reads it: large members as multipart uploads."""
    import io
    import tarfile

    from modeldrop.aws.s3 import served_writer
    from modeldrop.checkpoint.validation import validate_archive_stream
    from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

    monkeypatch.setattr(served_writer, "PART_BYTES", 5 * 1024 * 1024)
    checkpoint = write_checkpoint(tmp_path / "ck")
    (checkpoint / "big.bin").write_bytes(os.urandom(12 * 1024 * 1024 + 7))
    packed = write_tar_gz(checkpoint, tmp_path / "model.tar.gz")
    served = Artifact.parse("s3://bucket-x/modeldrop-served/d/")
    with served_writer.ServedPrefixWriter(s3, served) as writer, packed.open("rb") as raw:
        scan, report = validate_archive_stream(raw, "s3://bucket-x/a/model.tar.gz", writer)
    assert report.format == "tar.gz" and scan is not None and set(scan.files) == {p.name for p in checkpoint.iterdir()}
    listed = {
        o["Key"]: o["Size"] for o in s3.list_objects_v2(Bucket="bucket-x", Prefix="modeldrop-served/d/")["Contents"]
    }
    expected = {f"modeldrop-served/d/{p.name}": p.stat().st_size for p in checkpoint.iterdir()}
    assert listed == expected
    for path in checkpoint.iterdir():
        body = s3.get_object(Bucket="bucket-x", Key=f"modeldrop-served/d/{path.name}")["Body"].read()
        assert body == path.read_bytes(), path.name
    # Each part carried its CRC-32 (S3's own checksum of the big member is over those parts).
    head = s3.head_object(Bucket="bucket-x", Key="modeldrop-served/d/big.bin", ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32"), head
    import zlib

    assert (
        served_writer.crc32_checksum(b"abc")
        == __import__("base64").b64encode(zlib.crc32(b"abc").to_bytes(4, "big")).decode()
    )
    # A stream cut inside the big member: the pass fails, and no upload is left open.
    cut = packed.read_bytes()[: packed.stat().st_size * 3 // 4]
    other = Artifact.parse("s3://bucket-x/modeldrop-served/e/")
    with pytest.raises(CheckpointUnreadable), served_writer.ServedPrefixWriter(s3, other) as writer:
        validate_archive_stream(io.BytesIO(cut), "s3://bucket-x/a/model.tar.gz", writer)
    assert s3.list_multipart_uploads(Bucket="bucket-x").get("Uploads", []) == []
    assert tarfile.is_tarfile(packed)


def test_an_open_upload_reports_when_it_was_initiated(s3: Any) -> None:
    """moto answers 2010-11-10 for every upload; the reaper judges an orphan upload by its age."""
    from datetime import UTC, datetime, timedelta

    s3.create_multipart_upload(Bucket="bucket-x", Key="modeldrop-served/d/a")
    s3.create_multipart_upload(Bucket="bucket-x", Key="modeldrop-served/e/b")
    uploads = s3.list_multipart_uploads(Bucket="bucket-x", Prefix="modeldrop-served/e/")["Uploads"]
    assert [u["Key"] for u in uploads] == ["modeldrop-served/e/b"]
    assert abs(uploads[0]["Initiated"] - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_prefix_whose_file_list_would_not_fit_the_execution_state_is_refused() -> None:
    """The Map's items travel in the execution's state (256 KiB): 200 files of 1,000-byte names are
    under the count limit and still too many bytes."""
    from modeldrop.contracts.errors import ArchiveTooLarge
    from modeldrop.pipeline.deployment.register_steps import check_size

    prefix = Artifact.parse("s3://bucket-x/p/")
    few = [{"key": f"model-{i}.safetensors", "size": 1, "etag": '"e"'} for i in range(10)]
    check_size(prefix, 10, few, 40)
    long = [{"key": f"{i:04d}" + "x" * 996, "size": 1, "etag": '"e"'} for i in range(200)]
    with pytest.raises(ArchiveTooLarge, match="200 files"):
        check_size(prefix, 200, long, 40)
    with pytest.raises(CheckpointUnreadable, match="only its marker"):
        check_size(prefix, 0, [], 40)


def test_copy_batches_are_contiguous_balanced_and_bounded() -> None:
    from modeldrop.aws.s3.served_copy import MAX_COPY_BATCHES, copy_batches
    from modeldrop.contracts.served import CopyItem

    shards = [CopyItem(key=f"model-{i:05d}.safetensors", size=5_000_000_000, etag="e") for i in range(30)]
    small = [CopyItem(key=f"extra/{i}.json", size=100, etag="e") for i in range(970)]
    ordered, ranges = copy_batches([*small, *shards])
    assert sorted(i.key for i in ordered) == sorted(i.key for i in [*small, *shards])
    assert len(ranges) == MAX_COPY_BATCHES and ranges[0][0] == 0 and ranges[-1][1] == len(ordered)
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ranges))
    # No batch holds two of the large shards while another holds none: a batch takes as long as its bytes.
    loads = [sum(i.size for i in ordered[a:b]) for a, b in ranges]
    assert max(loads) == 5_000_000_000 + max(0, max(loads) - 5_000_000_000)
    assert sum(1 for load in loads if load >= 5_000_000_000) == 30
    few = [CopyItem(key=f"{i}", size=i, etag="e") for i in range(3)]
    assert copy_batches(few)[1] == [(0, 1), (1, 2), (2, 3)] and copy_batches([]) == ([], [])


def test_parts_go_with_their_crc32_header_and_an_unsigned_payload_over_tls() -> None:
    """Over TLS with a checksum S3 verifies, the body is not SHA-256 hashed for the signature (what
    botocore does for checksums it adds itself); the header tells the signer where ours is."""
    import boto3
    from botocore.awsrequest import AWSResponse

    from modeldrop.aws.s3 import served_writer

    class _Raw:
        def stream(self, **_kwargs: Any) -> Any:
            return iter([b""])

    seen: dict[str, Any] = {}

    def answer(request: Any, **_kwargs: Any) -> AWSResponse:
        seen.update(request.headers)
        return AWSResponse(request.url, 200, {"ETag": '"e"'}, _Raw())

    s3 = boto3.client(
        "s3", region_name="us-east-1", endpoint_url="https://s3.example.test", aws_access_key_id="a",
        aws_secret_access_key="b",
    )  # fmt: skip
    s3.meta.events.register("before-send.s3.UploadPart", answer)
    writer = served_writer.ServedPrefixWriter(s3, Artifact.parse("s3://bucket-x/modeldrop-served/d/"))
    with writer:
        writer.slots.acquire()
        part = writer.upload_part("modeldrop-served/d/x", "u", 1, b"abc" * 1000)
    assert part["ChecksumCRC32"] == served_writer.crc32_checksum(b"abc" * 1000)
    headers = {k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in seen.items()}
    assert headers["x-amz-checksum-crc32"] == part["ChecksumCRC32"]
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
