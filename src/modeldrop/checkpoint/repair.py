"""Restore the tensors a fine-tune lacks from its base: one extra shard plus an updated index.

`repair(source, base, out)` never changes the source. The output has the source's shape:
a directory gives a directory, a .tar(.gz) (local or S3) gives a new archive, an S3 prefix gives a
new prefix next to the original (objects copied server-side, the new shard and index added).
Tensor bytes are read from the base without extracting it: by seek (directory), ranged GET (S3
prefix) or one streaming pass (archive), keeping only the tensors needed.
"""

from __future__ import annotations

import io
import json
import shutil
import struct
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from pydantic import BaseModel, PrivateAttr

from modeldrop.checkpoint.archive.artifact_scan import ArtifactScan, scan_source
from modeldrop.checkpoint.archive.scan_result import Readable, read_exact
from modeldrop.checkpoint.archive.tar_scan import iter_archive
from modeldrop.checkpoint.headers.safetensors_header import TensorInfo
from modeldrop.checkpoint.validation import ValidationReport, validate_scan
from modeldrop.checkpoint.weights.base_compare import MIN_SHARED_FRACTION, compare_to_base, tensor_index
from modeldrop.contracts.artifact import is_archive, is_compressed
from modeldrop.contracts.errors import CheckpointUnreadable, RequestInvalid
from modeldrop.contracts.s3uri import S3Uri, parse_s3_uri

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

INDEX = "model.safetensors.index.json"
RESTORED_SHARD = "model-restored-from-base.safetensors"
MAX_RESTORED_BYTES = 4 * 1024**3  # held in memory while the shard is written
_SKIP_CHUNK = 1024 * 1024


class RepairResult(BaseModel):
    source: str
    base: str | None
    out: str
    restored: list[str]
    restored_bytes: int
    shard: str | None
    report: ValidationReport
    # The quantization_config block dropped from config.json (a merge's stale one), when asked to.
    dropped_quantization_config: dict[str, Any] | None = None
    # The output as it was read for the report (never serialized).
    _scan: Any = PrivateAttr(default=None)

    @property
    def scan(self) -> Any:
        return self._scan


@dataclass(frozen=True)
class _Wanted:
    shard: str
    info: TensorInfo
    data_start: int  # offset of the data section in the shard file


def _kind(location: str) -> str:
    if location.startswith("s3://"):
        return "s3-prefix" if location.endswith("/") else "s3-archive"
    if is_archive(location):
        return "archive"
    return "directory"


def encode_safetensors(tensors: dict[str, tuple[TensorInfo, bytes]], metadata: dict[str, str]) -> bytes:
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name in sorted(tensors):
        info, data = tensors[name]
        header[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(tensors[n][1] for n in sorted(tensors))


def updated_index(scan: ArtifactScan, new_tensors: dict[str, int], shard: str) -> bytes:
    """The fine-tune's index with the restored tensors mapped to the new shard (one is made if absent)."""
    present = tensor_index(scan)
    raw = scan.small_files.get(INDEX)
    if raw is not None:
        index = json.loads(raw)
    else:
        index = {"metadata": {}, "weight_map": {n: rel for n, (rel, _i) in present.items()}}
    weight_map: dict[str, str] = index.setdefault("weight_map", {})
    for name in new_tensors:
        weight_map[name] = shard
    metadata = index.setdefault("metadata", {})
    total = sum(info.nbytes for _rel, info in present.values()) + sum(new_tensors.values())
    metadata["total_size"] = total
    index["weight_map"] = dict(sorted(weight_map.items()))
    return (json.dumps(index, indent=2) + "\n").encode()


# ---- reading tensor bytes from the base ------------------------------------------------------
def _wanted(base: ArtifactScan, found: dict[str, tuple[str, TensorInfo]], names: list[str]) -> dict[str, _Wanted]:
    return {n: _Wanted(found[n][0], found[n][1], 8 + base.headers[found[n][0]].header_len) for n in names if n in found}


def _read_from_directory(root: Path, wanted: dict[str, _Wanted]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, w in wanted.items():
        with (root / w.shard).open("rb") as fh:
            fh.seek(w.data_start + w.info.begin)
            out[name] = fh.read(w.info.nbytes)
    return out


def _read_from_prefix(s3: S3Client, uri: S3Uri, wanted: dict[str, _Wanted]) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, w in wanted.items():
        start = w.data_start + w.info.begin
        rng = f"bytes={start}-{start + w.info.nbytes - 1}"
        out[name] = s3.get_object(Bucket=uri.bucket, Key=uri.key + w.shard, Range=rng)["Body"].read()
    return out


def _skip(stream: Readable, n: int) -> None:
    while n > 0:
        chunk = stream.read(min(n, _SKIP_CHUNK))
        if not chunk:
            raise CheckpointUnreadable("base archive ends inside a shard")
        n -= len(chunk)


def _read_from_archive(raw: IO[bytes], compressed: bool, wanted: dict[str, _Wanted]) -> dict[str, bytes]:
    by_shard: dict[str, list[tuple[str, _Wanted]]] = {}
    for name, w in wanted.items():
        by_shard.setdefault(w.shard, []).append((name, w))
    out: dict[str, bytes] = {}
    for member, reader in iter_archive(raw, compressed):
        if member.is_dir or member.path not in by_shard:
            continue
        position = 0
        for name, w in sorted(by_shard[member.path], key=lambda item: item[1].info.begin):
            start = w.data_start + w.info.begin
            _skip(reader, start - position)
            out[name] = read_exact(reader, w.info.nbytes)
            position = start + w.info.nbytes
    return out


def _read_base_tensors(
    base: str, scan: ArtifactScan, names: list[str], s3: S3Client
) -> dict[str, tuple[TensorInfo, bytes]]:
    """name -> (its header entry in the base, its bytes)."""
    wanted = _wanted(scan, tensor_index(scan), names)
    kind = _kind(base)
    if kind == "directory":
        data = _read_from_directory(Path(base), wanted)
    elif kind == "s3-prefix":
        data = _read_from_prefix(s3, parse_s3_uri(base), wanted)
    elif kind == "s3-archive":
        uri = parse_s3_uri(base)
        body = cast(IO[bytes], s3.get_object(Bucket=uri.bucket, Key=uri.key)["Body"])
        data = _read_from_archive(body, is_compressed(base), wanted)
    else:
        with Path(base).open("rb") as fh:
            data = _read_from_archive(fh, is_compressed(base), wanted)
    short = [n for n in names if len(data.get(n, b"")) != wanted[n].info.nbytes]
    if short:
        raise CheckpointUnreadable(f"could not read {len(short)} tensors from the base, e.g. {short[0]}")
    return {n: (wanted[n].info, data[n]) for n in names}


# ---- writing the repaired artifact -----------------------------------------------------------
def _write_directory(source: Path, out: Path, extra: dict[str, bytes]) -> None:
    if out.exists() and any(out.iterdir()):
        raise RequestInvalid(f"{out} exists and is not empty", "choose a new --out directory")
    shutil.copytree(source, out, dirs_exist_ok=True)
    for rel, data in extra.items():
        (out / rel).write_bytes(data)


def _copy_archive(
    raw: IO[bytes], compressed_in: bool, dest: IO[bytes], compressed_out: bool, extra: dict[str, bytes]
) -> None:
    """Stream the source archive into a new one, replacing or adding the `extra` members."""
    sink: IO[bytes] = dest
    if compressed_out:
        try:
            from isal import igzip

            sink = igzip.IGzipFile(fileobj=dest, mode="wb", compresslevel=1)  # type: ignore[assignment]
        except ImportError:  # pragma: no cover - where isal is absent
            import gzip

            sink = gzip.GzipFile(fileobj=dest, mode="wb", compresslevel=1)  # type: ignore[assignment]
    try:
        with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as dst:
            for member, reader in iter_archive(raw, compressed_in):
                if member.path in extra:
                    continue
                info = tarfile.TarInfo(member.path)
                info.type = tarfile.DIRTYPE if member.is_dir else tarfile.REGTYPE
                info.mode = 0o755 if member.is_dir else 0o644
                info.size = 0 if member.is_dir else member.size
                dst.addfile(info, None if member.is_dir else cast(IO[bytes], reader))
            for rel, data in extra.items():
                info = tarfile.TarInfo(rel)
                info.size = len(data)
                info.mode = 0o644
                dst.addfile(info, io.BytesIO(data))
    finally:
        if sink is not dest:
            sink.close()


def _write_archive(source: str, out: str, s3: S3Client, extra: dict[str, bytes]) -> None:
    compressed_in = is_compressed(source)
    compressed_out = is_compressed(out)
    with tempfile.TemporaryFile() if out.startswith("s3://") else Path(out).open("xb") as dest:
        if source.startswith("s3://"):
            uri = parse_s3_uri(source)
            _copy_archive(
                cast(IO[bytes], s3.get_object(Bucket=uri.bucket, Key=uri.key)["Body"]),
                compressed_in,
                dest,
                compressed_out,
                extra,
            )
        else:
            with Path(source).open("rb") as raw:
                _copy_archive(raw, compressed_in, dest, compressed_out, extra)
        if out.startswith("s3://"):
            dest.seek(0)
            target = parse_s3_uri(out)
            s3.upload_fileobj(dest, target.bucket, target.key)


def _write_prefix(s3: S3Client, source: S3Uri, out: S3Uri, extra: dict[str, bytes]) -> None:
    if out.bucket == source.bucket and out.key.startswith(source.key):
        raise RequestInvalid(f"--out {out} is inside the source prefix", "write the repaired copy under a new prefix")
    if s3.list_objects_v2(Bucket=out.bucket, Prefix=out.key, MaxKeys=1).get("KeyCount"):
        raise RequestInvalid(f"{out} already holds objects", "choose a new --out prefix")
    for key in _keys(s3, source):
        rel = key[len(source.key) :]
        if rel in extra or not rel:
            continue
        # Managed copy: server-side, multipart for shards past 5 GB.
        s3.copy({"Bucket": source.bucket, "Key": key}, out.bucket, out.key + rel)
    # The index goes last: a prefix watcher sees a complete checkpoint or none.
    for rel in sorted(extra, key=lambda r: r == INDEX):
        s3.put_object(Bucket=out.bucket, Key=out.key + rel, Body=extra[rel])


def _keys(s3: S3Client, uri: S3Uri) -> Iterator[str]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=uri.bucket, Prefix=uri.key):
        for obj in page.get("Contents", []):
            yield obj["Key"]


def repair(
    source: str, base: str | None, out: str, s3: S3Client | None = None, drop_stale_quantization: bool = False
) -> RepairResult:
    """A copy of SOURCE at OUT with the tensors it lacks restored from BASE, and (DROP_STALE_QUANTIZATION)
    config.json without the quantization_config its dense weights no longer match."""
    if base is None and not drop_stale_quantization:
        raise RequestInvalid("nothing to repair with", "pass --base BASE, or --drop-stale-quantization")
    kinds = (_kind(source), _kind(out))
    allowed = {
        ("directory", "directory"),
        ("archive", "archive"),
        ("archive", "s3-archive"),
        ("s3-archive", "s3-archive"),
        ("s3-archive", "archive"),
        ("s3-prefix", "s3-prefix"),
    }
    if kinds not in allowed:
        raise RequestInvalid(
            f"cannot write a {kinds[0]} source as a {kinds[1]}",
            "--out has the source's shape: a directory, a .tar(.gz) path or s3:// key, or an s3:// prefix ending in /",
        )
    if s3 is None and any(k.startswith("s3") for k in (*kinds, *([_kind(base)] if base else []))):
        import boto3

        s3 = boto3.client("s3")
    # None only when no location is in S3, and then no helper below reads it.
    aws = cast("S3Client", s3)
    fine_scan = scan_source(source, s3)
    extra: dict[str, bytes] = {}
    restored: dict[str, tuple[TensorInfo, bytes]] = {}
    dropped = _drop_stale_quantization(fine_scan, source) if drop_stale_quantization else None
    if dropped is not None:
        extra["config.json"] = dropped[1]
    if base is not None:
        restored = _restore(fine_scan, base, source, aws)
        extra[RESTORED_SHARD] = encode_safetensors(restored, {"format": "pt", "modeldrop": f"restored from {base}"})
        extra[INDEX] = updated_index(fine_scan, {n: i.nbytes for n, (i, _d) in restored.items()}, RESTORED_SHARD)
    if kinds == ("directory", "directory"):
        _write_directory(Path(source), Path(out), extra)
    elif kinds == ("s3-prefix", "s3-prefix"):
        _write_prefix(aws, parse_s3_uri(source), parse_s3_uri(out), extra)
    else:
        try:
            _write_archive(source, out, aws, extra)
        except FileExistsError:
            raise RequestInvalid(f"{out} exists", "choose a new --out path") from None
    written = scan_source(out, s3)
    report = validate_scan(written)
    result = RepairResult(
        source=source,
        base=base,
        out=out,
        restored=sorted(restored),
        restored_bytes=sum(info.nbytes for info, _data in restored.values()),
        shard=RESTORED_SHARD if restored else None,
        report=report,
        dropped_quantization_config=dropped[0] if dropped is not None else None,
    )
    result._scan = written  # what the engine check judges an archive or S3 output from: not read again
    return result


def _restore(fine_scan: ArtifactScan, base: str, source: str, aws: S3Client) -> dict[str, tuple[TensorInfo, bytes]]:
    """The tensors SOURCE lacks, read from BASE."""
    base_scan = scan_source(base, aws)
    comparison = compare_to_base(fine_scan, base_scan)
    if comparison.base_tensor_count == 0 or comparison.shared_fraction < MIN_SHARED_FRACTION:
        raise RequestInvalid(
            f"{base} does not look like the base of {source}: {comparison.shared_tensor_count} of "
            f"{comparison.base_tensor_count} tensor names in common",
            "pass the checkpoint this model was fine-tuned from, saved with the same tensor naming",
        )
    if not comparison.missing:
        raise RequestInvalid(f"{source} lacks no tensor of {base}: nothing to repair", "")
    if comparison.missing_bytes > MAX_RESTORED_BYTES:
        raise RequestInvalid(f"{comparison.missing_bytes:,} bytes to restore: more than this tool holds in memory", "")
    if RESTORED_SHARD in fine_scan.files:
        raise RequestInvalid(f"{source} already has {RESTORED_SHARD}: it was repaired before", "")
    return _read_base_tensors(base, base_scan, comparison.missing, aws)


def _drop_stale_quantization(scan: ArtifactScan, source: str) -> tuple[dict[str, Any], bytes]:
    """config.json without quantization_config, when validation finds it stale (dense weights under a
    quantized method's block: vLLM picks its loader from that block and finds no packed tensor)."""
    if not any(f.code == "QUANT_CONFIG_STALE" for f in validate_scan(scan).findings):
        raise RequestInvalid(
            f"{source}'s quantization_config is not stale (or there is none): nothing to drop",
            "drop it only when the weights are dense (a merged or dequantized model)",
        )
    config = json.loads(scan.small_files["config.json"])
    block = config.pop("quantization_config")
    text = config.get("text_config")
    if isinstance(text, dict):
        text.pop("quantization_config", None)
    return block, json.dumps(config, indent=2).encode()
