"""The emulator's S3 keeps large object bodies on disk, end to end, with moto's answers unchanged.

Against plain moto, completing the multipart upload below builds the whole object in a bytearray
and every read of it (GetObject, CopyObject, a version listing) copies it into memory again; the
tracemalloc bounds here fail there. (The 2 GB run-local figure is `make bench-run-local`'s.)
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from modeldrop.local.emulator import moto_shims
from modeldrop.local.emulator.s3 import file_backed as file_backed_s3
from modeldrop.local.scenarios.inputs import upload_config

# Twelve times file_backed_s3.LARGE, forty-eight 8 MB parts: large enough that what the upload
# holds while parts are in flight (moto copies each request body five times, ~120-145 MB however
# large the object) stays well under half of it, while building the object in memory does not.
SIZE = 384 * 1024 * 1024


@pytest.fixture()
def s3(tmp_path: Path) -> Any:
    moto_shims.install()
    with mock_aws():
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="artifacts-x")
        yield client


def _object(tmp_path: Path, size: int = SIZE) -> tuple[Path, str]:
    path = tmp_path / "weights.bin"
    block = os.urandom(4 * 1024 * 1024)
    with path.open("wb") as fh:
        for _ in range(size // len(block)):
            fh.write(block)
    return path, _md5(path)


def _md5(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def _peak_python_bytes(action: Any) -> int:
    tracemalloc.start()
    try:
        action()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_large_object_round_trips_without_being_held_in_memory(tmp_path: Path) -> None:
    # In a process of its own: tracemalloc counts every thread's allocations, and a thread another
    # test left in this worker (an execution, an endpoint server) would be counted as the upload's.
    script = (
        "import json, runpy, sys; from pathlib import Path;"
        "m = runpy.run_path(sys.argv[1]); print(json.dumps(m['_round_trip'](Path(sys.argv[2]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, __file__, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert peak["upload"] < SIZE / 2, f"the upload held {peak['upload'] >> 20} MB of a {SIZE >> 20} MB object"
    assert peak["copy"] < SIZE / 4, f"the copy held {peak['copy'] >> 20} MB"
    assert peak["read"] < SIZE / 4, f"a streamed read held {peak['read'] >> 20} MB"
    assert peak["listing"] < SIZE / 4, f"a version listing held {peak['listing'] >> 20} MB"


def _round_trip(tmp_path: Path) -> dict[str, int]:
    """Upload, copy, read and list a large object; checks what moto answers and returns each peak."""
    moto_shims.install()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="artifacts-x")
        return _measure(s3, tmp_path)


def _measure(s3: Any, tmp_path: Path) -> dict[str, int]:
    path, digest = _object(tmp_path)
    peak = {  # as run-local uploads: what it reads ahead and has in flight is the rest
        "upload": _peak_python_bytes(
            lambda: s3.upload_file(str(path), "artifacts-x", "run/model.tar.gz", Config=upload_config())
        )
    }
    peak["copy"] = _peak_python_bytes(
        lambda: s3.copy_object(
            Bucket="artifacts-x",
            Key="served/model.tar.gz",
            CopySource={"Bucket": "artifacts-x", "Key": "run/model.tar.gz"},
        )
    )

    def read_all() -> None:
        body = s3.get_object(Bucket="artifacts-x", Key="served/model.tar.gz")["Body"]
        h = hashlib.md5()
        while chunk := body.read(1024 * 1024):
            h.update(chunk)
        assert h.hexdigest() == digest

    peak["read"] = _peak_python_bytes(read_all)
    peak["listing"] = _peak_python_bytes(lambda: s3.list_object_versions(Bucket="artifacts-x"))
    # What moto answers is unchanged: sizes, ranges, a multi-threaded ranged download, the checksum.
    head = s3.head_object(Bucket="artifacts-x", Key="served/model.tar.gz")
    assert head["ContentLength"] == SIZE
    ranged = s3.get_object(Bucket="artifacts-x", Key="run/model.tar.gz", Range="bytes=1000-1999")["Body"].read()
    with path.open("rb") as fh:
        fh.seek(1000)
        assert ranged == fh.read(1000)
    s3.download_file("artifacts-x", "served/model.tar.gz", str(tmp_path / "back.bin"))
    assert _md5(tmp_path / "back.bin") == digest
    checked = s3.get_object(Bucket="artifacts-x", Key="served/model.tar.gz", ChecksumMode="ENABLED")["Body"]
    while checked.read(8 * 1024 * 1024):  # botocore validates the composite checksum as it reads
        pass
    return peak


def test_small_objects_keep_moto_behaviour_and_large_ones_read_as_a_map(s3: Any, tmp_path: Path) -> None:
    from moto.s3.models import s3_backends

    s3.put_object(Bucket="artifacts-x", Key="record.json", Body=b'{"a": 1}')
    path, _digest = _object(tmp_path, 2 * file_backed_s3.LARGE)
    s3.upload_file(str(path), "artifacts-x", "big.bin")
    keys = s3_backends["123456789012"]["aws"].buckets["artifacts-x"].keys
    assert keys["record.json"].value == b'{"a": 1}'
    assert isinstance(keys["big.bin"].value, mmap.mmap) and len(keys["big.bin"].value) == path.stat().st_size
    assert keys["big.bin"].size >= file_backed_s3.LARGE
