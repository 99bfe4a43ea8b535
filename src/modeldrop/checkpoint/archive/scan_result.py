"""What validation reads from an artifact (ArtifactScan), and how one file of it is read.

Only a few small files are read whole (config.json, the index, tokenizer_config.json) and only
each shard's header; every other file counts by size alone, so memory stays bounded whatever
an artifact holds.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from modeldrop.checkpoint.archive.archive_rules import archive_refused
from modeldrop.checkpoint.headers.header_json import MAX_TOTAL_HEADER_BYTES
from modeldrop.checkpoint.headers.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    parse_header,
    read_header_length,
)
from modeldrop.contracts.errors import CheckpointUnreadable
from modeldrop.contracts.text import printable

# The only files validation reads, at the artifact's root (the chat contract's among them).
READ_FILES = frozenset(
    (
        "config.json",
        "model.safetensors.index.json",
        "tokenizer_config.json",
        "adapter_config.json",
        "generation_config.json",
        "chat_template.jinja",
        "chat_template.json",
        "special_tokens_map.json",
        "added_tokens.json",
    )
)
MAX_READ_FILE_BYTES = 16 * 1024 * 1024
# Read when at most this size (Gemma's tokenizer.json is 33 MB): the chat contract looks tokens up
# in them; a larger one is left unread and the vocabulary is not judged.
OPTIONAL_READS = {"tokenizer.json": 64 * 1024 * 1024, "tokenizer.model": MAX_READ_FILE_BYTES}


def is_read(rel: str, size: int) -> bool:
    """Whether validation reads REL whole (a required read past its size is refused)."""
    if rel in READ_FILES:
        check_read_size(rel, size)
        return True
    return size <= OPTIONAL_READS.get(rel, -1)


@dataclass
class ArtifactScan:
    source: str
    format: str
    # Keys are paths relative to the artifact's root; raw bytes that are not UTF-8 stay distinct
    # (surrogate-escaped) and are escaped only where shown.
    files: dict[str, int] = field(default_factory=dict)
    # Directories the artifact names itself (tar directory members, folders, S3 `x/` placeholders);
    # every file's parents are directories too.
    dirs: set[str] = field(default_factory=set)
    small_files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    header_errors: dict[str, str] = field(default_factory=dict)
    # The finding code of each header error (HEADER_INVALID, or a documented stricter rule's code).
    header_error_codes: dict[str, str] = field(default_factory=dict)
    requests: int = 0
    # The header bytes read so far (or, where every shard's length was read first, all of them declared).
    header_bytes: int = 0


class Readable(Protocol):
    def read(self, n: int) -> bytes: ...


def read_exact(stream: Readable, n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def scan_member(scan: ArtifactScan, rel: str, size: int, stream: Readable) -> None:
    """Count one file, and read what validation needs of it from STREAM (positioned at its start)."""
    scan.files[rel] = size
    base = posixpath.basename(rel)
    if base.endswith(".safetensors"):

        def header() -> bytes:
            n = read_header_length(read_exact(stream, 8), size)
            raw = read_exact(stream, n)
            if len(raw) != n:
                raise HeaderError("file ends inside the header")
            return raw

        add_header(scan, rel, size, header)
    elif is_read(rel, size):
        data = read_exact(stream, size)
        if len(data) != size:
            raise CheckpointUnreadable(f"{rel}: file is truncated ({len(data)} of {size} bytes)")
        scan.small_files[rel] = data


def add_header(scan: ArtifactScan, rel: str, size: int, read: Callable[[], bytes]) -> None:
    """Parse one shard's header into the scan, or record why it is refused (with its finding code)."""
    if posixpath.basename(rel).startswith("."):
        return  # vLLM's `*.safetensors` glob skips dot-files (macOS `._x` AppleDouble files among them)
    try:
        raw = read()
        if scan.header_bytes + len(raw) > MAX_TOTAL_HEADER_BYTES:
            scan.header_errors[rel] = (
                f"not read: the checkpoint's safetensors headers add up to over {MAX_TOTAL_HEADER_BYTES >> 20} MiB "
                "(about 250,000 tensors; DeepSeek-V3 has 92,000), past what modeldrop judges"
            )
            scan.header_error_codes[rel] = "TENSORS_TOO_MANY"
            return
        scan.header_bytes += len(raw)
        scan.headers[rel] = parse_header(raw, size)
    except HeaderError as exc:
        scan.header_errors[rel] = str(exc)
        scan.header_error_codes[rel] = exc.code


def check_read_size(rel: str, size: int) -> None:
    if size > MAX_READ_FILE_BYTES:
        raise archive_refused(
            "FILE_TOO_LARGE",
            f"{printable(rel)} is {size} bytes, over the {MAX_READ_FILE_BYTES} modeldrop reads "
            "(real ones are kilobytes)",
        )
