"""What run-local deploys and how it puts it in the emulated bucket: the sample or given checkpoint
as a .tar.gz or an S3 prefix, a generated LoRA adapter on it, and the faults that shape the input
(a size S3 reports, a copy killed midway)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig


def writes_served_copy(params: Any) -> bool:
    from modeldrop.aws.s3.served_copy import SERVED_PREFIX

    return str(params.get("Key", "")).startswith(SERVED_PREFIX)


def artifact_file(artifact: Path | None, workdir: Path) -> Path:
    """A .tar.gz to drop into the bucket (the S3 starter watches *model.tar.gz), streamed, never held in memory."""
    import gzip
    import shutil

    from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

    if artifact is not None and artifact.is_file() and artifact.name.endswith((".tar.gz", ".tgz")):
        return artifact
    packed = workdir / "model.tar.gz"
    if artifact is not None and artifact.is_file():  # a plain .tar: compress it on the way
        with artifact.open("rb") as src, gzip.open(packed, "wb", compresslevel=1) as dst:
            shutil.copyfileobj(src, dst, 1024 * 1024)
    else:
        write_tar_gz(artifact or write_checkpoint(workdir / "sample"), packed)
    return packed


def adapter_request(
    stack: Any, artifact: Path | None, workdir: Path, count: int = 1, cpu: bool = False, rank: int | None = None
) -> dict[str, Any]:
    """COUNT generated PEFT adapters for the base (each its own weights), uploaded where no rule
    watches: the run starts with the first as artifact_uri, the others as `adapters` (shared mode),
    and the checkpoint (uploaded by _deploy under direct/) as their base. Ranks 8, 16, ... unless RANK."""
    from modeldrop.local.samples.adapter import write_adapter
    from modeldrop.local.samples.checkpoint import write_tar_gz

    base_config = None
    if artifact is not None and artifact.is_dir() and (artifact / "config.json").is_file():
        base_config = json.loads((artifact / "config.json").read_text())
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    uris = []
    for i in range(1, count + 1):
        name = "lora-sample" if count == 1 else f"lora-sample-{i}"
        if cpu:  # the CPU checkpoint's own adapter, whose effect on the real engine's answers is known
            from modeldrop.local.samples.cpu_checkpoint import write_cpu_adapter

            folder = write_cpu_adapter(workdir / name, r=rank or 8 * i)
        else:
            folder = write_adapter(workdir / name, base_config=base_config, r=rank or 8 * i, seed=i)
        packed = write_tar_gz(folder, workdir / f"{name}.tar.gz")
        key = f"direct/local/{stamp}/{name}/adapter.tar.gz"
        stack.client("s3").upload_file(str(packed), stack.bucket, key)
        uris.append(f"s3://{stack.bucket}/{key}")
    return {"adapter_uri": uris[0], **({"adapters": uris[1:]} if count > 1 else {})}


def upload_prefix(
    stack: Any, artifact: Path | None, workdir: Path, key: str, with_marker: bool, faults: frozenset[str] | set[str]
) -> Path:
    """The checkpoint directory as an S3 prefix (the way `modeldrop upload` leaves it); returns the
    directory. The marker goes last: the S3 starter starts the deployment from it."""
    from modeldrop.aws.s3.checkpoint_upload import upload_directory
    from modeldrop.local.samples.checkpoint import write_checkpoint

    directory = artifact if artifact is not None and artifact.is_dir() else write_checkpoint(workdir / "sample")
    if "kill-mid-copy" in faults:  # an object the Map copies as parallel parts
        directory = with_large_file(directory, workdir)

    upload_directory(stack.client("s3"), directory, stack.bucket, key, marker=with_marker, config=upload_config())
    return directory


def with_large_file(directory: Path, workdir: Path) -> Path:
    import shutil

    copy = workdir / "with-large-file"
    shutil.copytree(directory, copy)
    with (copy / "extra-weights.bin").open("wb") as fh:
        for _ in range(LARGE_FILE_MIB):
            fh.write(b"\x5a" * 1024 * 1024)
    return copy


# --fault huge-archive: the size S3 reports for the artifact (the emulator holds the small sample).
HUGE_ARCHIVE_BYTES = 140 * 10**9
# --fault kill-mid-copy: a file copied as parallel parts, and the part copies after which its Lambda dies.
LARGE_FILE_MIB = 72
KILL_AFTER_PARTS = 3


def report_size(stack: Any, size: int) -> None:
    """HeadObject on an uploaded artifact (not the served copy) reports SIZE bytes."""
    from modeldrop.local.emulator.iam.enforcement import after_call

    def grow(params: Any, result: Any) -> None:
        if not writes_served_copy(params) and str(params.get("Key", "")).endswith(".tar.gz"):
            result["ContentLength"] = size

    after_call("s3", "HeadObject", grow)


def kill_copy_after_parts(stack: Any, parts: int) -> None:
    """The CopyShard Lambda copying a large object dies (as at its timeout) after PARTS part copies:
    from then on it makes no call at all, so its own abort of the upload never runs."""
    from modeldrop.local.emulator.iam.enforcement import after_call, kill_current

    copied: list[bool] = []

    def count(params: Any, _result: Any) -> None:
        if writes_served_copy(params):
            copied.append(True)
            if len(copied) == parts:
                kill_current()

    after_call("s3", "UploadPartCopy", count)


def upload_config() -> TransferConfig:
    """How run-local uploads into the emulated S3, which runs in this process.

    Two parts in flight, and no more than two read ahead of them: more threads only hold more 8 MB
    parts, and s3transfer's default read-ahead of ten parts held 136 MB on a busy machine.
    """
    from boto3.s3.transfer import TransferConfig

    config = TransferConfig(max_concurrency=2)
    config.max_in_memory_upload_chunks = 2  # s3transfer's knob, which boto3's constructor does not take
    return config
