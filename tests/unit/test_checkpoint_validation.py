"""Header parsing, artifact reading and checkpoint findings on real safetensors and tar files."""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import tarfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modeldrop.checkpoint.archive.artifact_scan import scan_local, scan_source, scan_tar_stream
from modeldrop.checkpoint.headers.safetensors_header import HeaderError, parse_header, read_header_length
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable
from modeldrop.local.samples.checkpoint import TINY_CONFIG, safetensors_bytes, tar_gz_bytes, write_checkpoint


def _parse(blob: bytes) -> None:
    n = read_header_length(blob[:8], len(blob))
    parse_header(blob[8 : 8 + n], len(blob))


def _raw(header: dict, data_len: int) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data_len


def test_valid_file_parses() -> None:
    blob = safetensors_bytes({"a": ("BF16", [2, 3]), "b": ("F32", [4])}, {"format": "pt"})
    n = read_header_length(blob, len(blob))
    header = parse_header(blob[8 : 8 + n], len(blob))
    assert set(header.tensors) == {"a", "b"} and header.metadata == {"format": "pt"}


@pytest.mark.parametrize(
    ("header", "data_len", "message"),
    [
        (
            {
                "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                "b": {"dtype": "BF16", "shape": [2], "data_offsets": [2, 6]},
            },
            6,
            "overlaps",
        ),
        (
            {
                "a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                "b": {"dtype": "BF16", "shape": [2], "data_offsets": [6, 10]},
            },
            10,
            "gap",
        ),
        ({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, 8, "cover 4 bytes but the data section is 8"),
        ({"a": {"dtype": "BF17", "shape": [2], "data_offsets": [0, 4]}}, 4, "unknown dtype"),
        ({"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 4]}}, 4, "needs 6 bytes but spans 4"),
        ({"a": {"dtype": "BF16", "shape": [-1], "data_offsets": [0, 4]}}, 4, "from 0 to 2"),
        ({"a": {"dtype": "BF16", "shape": [2], "data_offsets": [4, 0]}}, 4, "before begin"),
        ({"__metadata__": {"k": 1}}, 0, "__metadata__"),
    ],
)
def test_strict_rules(header: dict, data_len: int, message: str) -> None:
    with pytest.raises(HeaderError, match=message):
        _parse(_raw(header, data_len))


def test_duplicate_keys_header_length_and_json() -> None:
    entry = b'{"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}'
    raw = b'{"a": ' + entry + b', "a": ' + entry + b"}"
    with pytest.raises(HeaderError, match="duplicate key"):
        _parse(struct.pack("<Q", len(raw)) + raw + b"\0")
    with pytest.raises(HeaderError, match="past the end"):
        read_header_length(struct.pack("<Q", 500) + b"{}", 10)
    with pytest.raises(HeaderError, match="exceeds"):
        read_header_length(struct.pack("<Q", 100_000_001), 200_000_000)
    with pytest.raises(HeaderError, match="not valid JSON"):
        _parse(struct.pack("<Q", 3) + b"{x}")
    bomb = b"{" + b'"a":' * 0 + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(HeaderError):
        _parse(struct.pack("<Q", len(bomb)) + bomb)


@settings(max_examples=50, deadline=None)
@given(st.binary(min_size=0, max_size=200))
def test_random_bytes_never_crash(blob: bytes) -> None:
    with contextlib.suppress(HeaderError):
        _parse(blob)


def test_kv_shared_tensors_found_missing_in_both_namings(tmp_path: Path) -> None:
    ok = validate_scan(scan_local(str(write_checkpoint(tmp_path / "ok"))))
    assert ok.deployable and ok.kv_shared.expected_tensors == 6 and ok.kv_shared.missing == []
    # vLLM 0.26-0.29 register k/v projections and k_norm on the shared layers: their tensors are needed.
    from modeldrop.contracts.engine_target import EngineVersion

    old = EngineVersion("vllm", "0.26.0", "image tag 0.26.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.1")
    bad = validate_scan(scan_local(str(write_checkpoint(tmp_path / "bad", drop_kv_shared=True))), target=old)
    assert not bad.deployable
    assert sorted(bad.kv_shared.missing)[0] == "model.layers.4.self_attn.k_norm.weight"
    # From 0.30 (the default image's 0.31 among them) the shared layers build only q_proj: nothing is missing.
    assert validate_scan(scan_local(str(tmp_path / "bad"))).deployable
    multimodal = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4",
                  "text_config": TINY_CONFIG, "vision_config": {"model_type": "gemma4_vision"}}  # fmt: skip
    from modeldrop.local.samples import checkpoint as sample_checkpoint

    d = tmp_path / "multimodal"
    d.mkdir()
    prefix = "model.language_model.layers."
    tensors = sample_checkpoint.tiny_gemma4_tensors(TINY_CONFIG, prefix=prefix, drop_kv_shared=True)
    (d / "model.safetensors").write_bytes(safetensors_bytes(tensors))
    (d / "config.json").write_text(json.dumps(multimodal))
    report = validate_scan(scan_local(str(d)), target=old)
    assert len(report.kv_shared.missing) == 6 and report.kv_shared.missing[0].startswith(f"{prefix}4.")


def test_e4b_arithmetic_54_missing() -> None:
    from modeldrop.checkpoint.weights.architecture_rules import KV_SHARED_RULES, expected_kv_tensors

    assert len(expected_kv_tensors(KV_SHARED_RULES[0], "model.language_model.layers.", 42, 18, None, False)) == 54
    assert len(expected_kv_tensors(KV_SHARED_RULES[0], "model.language_model.layers.", 35, 20, None, False)) == 60


def test_tar_gz_streams_and_matches_directory(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "c")
    archive = tmp_path / "model.tar.gz"
    archive.write_bytes(tar_gz_bytes(d))
    from_dir, from_tar = validate_scan(scan_local(str(d))), validate_scan(scan_local(str(archive)))
    assert from_tar.tensor_count == from_dir.tensor_count == 107
    assert from_tar.parameters == from_dir.parameters and from_tar.format == "tar.gz"


def _tar_with(member: tarfile.TarInfo, data: bytes = b"") -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    buf.seek(0)
    return buf


@pytest.mark.parametrize(
    ("kind", "code"),
    [
        ("symlink", "ARCHIVE_LINK"),
        ("hardlink", "ARCHIVE_LINK"),
        ("abs", "ARCHIVE_ABSOLUTE_PATH"),
        ("dotdot", "ARCHIVE_PATH_ESCAPE"),
        ("fifo", "ARCHIVE_SPECIAL_FILE"),
    ],
)
def test_hostile_members_are_refused(kind: str, code: str) -> None:
    info = tarfile.TarInfo("config.json")
    if kind == "symlink":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    elif kind == "hardlink":
        info.type, info.linkname = tarfile.LNKTYPE, "other"
    elif kind == "abs":
        info.name = "/etc/cron.d/x"
    elif kind == "dotdot":
        info.name = "../../x"
    else:
        info.type = tarfile.FIFOTYPE
    with pytest.raises(CheckpointRefused) as refused:
        scan_tar_stream(_tar_with(info), "t", compressed=False)
    assert refused.value.code == code


def test_corrupt_and_truncated_archives(tmp_path: Path) -> None:
    good = tar_gz_bytes(write_checkpoint(tmp_path / "c"))
    with pytest.raises(CheckpointUnreadable, match=r"gzip|truncated"):
        scan_tar_stream(io.BytesIO(good[: len(good) // 2]), "t", compressed=True)
    corrupt = bytearray(good)
    corrupt[200:260] = b"\x00" * 60
    with pytest.raises(CheckpointUnreadable):
        scan_tar_stream(io.BytesIO(bytes(corrupt)), "t", compressed=True)
    with pytest.raises(CheckpointUnreadable, match=r"gzip|not a tar"):
        scan_tar_stream(io.BytesIO(b"this is not a model at all" * 10), "t", compressed=True)


def test_local_archives_parallel_path_trusts_only_a_matching_trailer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Local .tar.gz files go through rapidgzip, which stops quietly at a cut end: the trailer decides."""
    import gzip
    import tarfile

    from modeldrop.checkpoint.archive import tar_scan as artifact_scan

    d = write_checkpoint(tmp_path / "c")
    # The sample's weights compress far better than real ones do: parallel inflate is not for it.
    (tmp_path / "zeros.tar.gz").write_bytes(tar_gz_bytes(d))
    assert artifact_scan._scan_with_rapidgzip(tmp_path / "zeros.tar.gz") is None
    (d / "extra-weights.bin").write_bytes(os.urandom(4 << 20))  # weights-like: gzip saves nothing
    good = tar_gz_bytes(d)
    (tmp_path / "good.tar.gz").write_bytes(good)
    assert artifact_scan._scan_with_rapidgzip(tmp_path / "good.tar.gz") is not None
    assert validate_scan(scan_local(str(tmp_path / "good.tar.gz"))).deployable
    # Cut exactly before the 8-byte trailer: every tar member is intact, the gzip stream is not.
    (tmp_path / "cut.tar.gz").write_bytes(good[:-8])
    assert artifact_scan._scan_with_rapidgzip(tmp_path / "cut.tar.gz") is None
    with pytest.raises(CheckpointUnreadable, match=r"truncated|gzip"):
        scan_local(str(tmp_path / "cut.tar.gz"))
    # A valid multi-member gzip (as bgzip or a concatenation writes it) still validates.
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for p in sorted(d.iterdir()):
            tar.add(p, arcname=p.name)
    data = raw.getvalue()
    half = len(data) // 2
    (tmp_path / "multi.tar.gz").write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    # Inflated once: the trailer (the last member's size) already tells it is not one weights-like
    # member, so the parallel inflater is not tried first.
    scans: list[str] = []  # "parallel" (rapidgzip) or "sequential", one entry per inflate
    real_scan = artifact_scan.scan_tar
    monkeypatch.setattr(
        artifact_scan,
        "scan_tar",
        lambda src, *a: (
            scans.append("parallel" if isinstance(src, artifact_scan._Parallel) else "sequential") or real_scan(src, *a)
        ),
    )
    assert validate_scan(scan_local(str(tmp_path / "multi.tar.gz"))).deployable
    assert scans == ["sequential"]
    # A small first member and a weights-like last one pass the trailer gate; the first member's
    # end shows within its first 64 KiB, so only the sequential reader (every member checked) reads it.
    (tmp_path / "appended.tar.gz").write_bytes(gzip.compress(data[:1024]) + gzip.compress(data[1024:]))
    scans.clear()
    assert validate_scan(scan_local(str(tmp_path / "appended.tar.gz"))).deployable
    assert scans == ["sequential"]
    cut = (tmp_path / "appended.tar.gz").read_bytes()
    (tmp_path / "appended-cut.tar.gz").write_bytes(cut[: len(cut) - 4096])
    assert artifact_scan._scan_with_rapidgzip(tmp_path / "appended-cut.tar.gz") is None
    with pytest.raises(CheckpointUnreadable, match=r"truncated|gzip"):
        scan_local(str(tmp_path / "appended-cut.tar.gz"))


def test_a_bomb_behind_a_lying_trailer_is_stopped_at_the_inflaters_memory_bound(tmp_path: Path) -> None:
    """A 1 MB zero bomb whose trailer claims a weights-like size passes the gate; the watchdog
    kills the decoder (it reached 432 MB unwatched) and the sequential inflater refuses the file."""
    import subprocess
    import sys
    import zlib

    from modeldrop.checkpoint.archive import parallel_inflate

    info = tarfile.TarInfo("model.safetensors")
    info.size = 1 << 30
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing
    body = bytearray(deflate.compress(info.tobuf(format=tarfile.GNU_FORMAT)))
    zeros = bytes(1 << 20)
    for _ in range(info.size >> 20):
        body += deflate.compress(zeros)
    body += deflate.compress(bytes(1024)) + deflate.flush()  # the end-of-archive blocks
    body[-4:] = int(len(body) * 1.2).to_bytes(4, "little")  # the trailer lies: 1.2x the file
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(bytes(body))
    script = (
        "import json, resource, sys; from pathlib import Path;"
        "from modeldrop.checkpoint.archive import tar_scan as a;"
        "fast = a._scan_with_rapidgzip(Path(sys.argv[1]));"
        "print(json.dumps([fast is None, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024]))"
    )
    done = subprocess.run([sys.executable, "-c", script, str(bomb)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    declined, child_peak = json.loads(done.stdout.strip().splitlines()[-1])
    assert declined
    assert child_peak < parallel_inflate.MAX_CHILD_RSS + (32 << 20), f"the decoder held {child_peak >> 20} MB"
    with pytest.raises(CheckpointUnreadable, match=r"gzip|truncated"):
        scan_local(str(bomb))


def test_a_member_refused_mid_archive_stops_the_parallel_decoder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeldrop.checkpoint.archive import parallel_inflate

    d = write_checkpoint(tmp_path / "c")
    (d / "extra-weights.bin").write_bytes(os.urandom(8 << 20))  # weights-like, so the parallel path takes it
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for p in sorted(d.iterdir()):
            tar.add(p, arcname=p.name)
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
        tar.add(d / "extra-weights.bin", arcname="more-weights.bin")
    (tmp_path / "linked.tar.gz").write_bytes(raw.getvalue())
    started: list[parallel_inflate.ParallelInflate] = []
    real = parallel_inflate.ParallelInflate

    def recording(*args: object) -> parallel_inflate.ParallelInflate:
        started.append(real(*args))  # type: ignore[arg-type]
        return started[-1]

    monkeypatch.setattr(parallel_inflate, "ParallelInflate", recording)
    with pytest.raises(CheckpointRefused, match="symlink") as refused:
        scan_local(str(tmp_path / "linked.tar.gz"))
    assert refused.value.code == "ARCHIVE_LINK"
    # The parallel pass stops at the link, and the sequential reader (whose verdict on a cut stream
    # is the one that counts) refuses it again; the decoder was stopped and reaped.
    assert len(started) == 1
    assert started[0]._proc.returncode is not None


def test_not_a_model_is_refused_with_findings(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("hello")
    report = validate_scan(scan_local(str(tmp_path)))
    codes = {f.code for f in report.findings}
    assert not report.deployable and {"CONFIG_MISSING", "NO_SAFETENSORS", "TOKENIZER_MISSING"} <= codes


def test_index_disagreement(tmp_path: Path) -> None:
    d = write_checkpoint(tmp_path / "c")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.extra.weight"] = "model-00009-of-00009.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    report = validate_scan(scan_local(str(d)))
    assert any(f.code == "INDEX_MISMATCH" and "missing" in f.message for f in report.findings)


def test_s3_prefix_reads_only_headers(tmp_path: Path) -> None:
    import boto3
    from moto import mock_aws

    d = write_checkpoint(tmp_path / "c", shards=3)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="bkt")
        for p in d.iterdir():
            s3.put_object(Bucket="bkt", Key=f"run/{p.name}", Body=p.read_bytes())
        scan = scan_source("s3://bkt/run/", s3)
        small = len(scan.small_files)
        assert len(scan.headers) == 3
        assert scan.requests - small <= 2 * 3
        assert validate_scan(scan).deployable


def test_unreadable_s3_sources_are_named_not_raised() -> None:
    import boto3
    from moto import mock_aws

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        for uri in ("s3://no-such-bucket/run/", "s3://no-such-bucket/run/model.tar.gz"):
            with pytest.raises(CheckpointUnreadable, match=f"cannot read {uri}: NoSuchBucket"):
                scan_source(uri, s3)
