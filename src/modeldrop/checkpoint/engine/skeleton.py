"""A skeleton of a checkpoint the engine check reads as the checkpoint itself: its side files, and per
shard its real header followed by sparse zeros where the tensor bytes were. The probe never reads a
weight byte, so an archive or an S3 source is judged from what validation already read (its headers),
without extracting or downloading any weight."""

from __future__ import annotations

import json
from pathlib import Path

from modeldrop.checkpoint.archive.scan_result import ArtifactScan


def write_skeleton(scan: ArtifactScan, out: Path) -> Path:
    """OUT holding SCAN's side files and, per shard, its header followed by sparse zeros (no bytes written
    for the tensors: the file only claims their length)."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in scan.small_files.items():
        if "/" not in rel:
            (out / rel).write_bytes(data)
    for rel, header in scan.headers.items():
        if "/" in rel:
            continue
        entries: dict[str, object] = {"__metadata__": header.metadata} if header.metadata else {}
        for name, info in header.tensors.items():
            entries[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [info.begin, info.end]}
        raw = json.dumps(entries, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (out / rel).open("wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.truncate(8 + len(raw) + header.data_len)
    return out
