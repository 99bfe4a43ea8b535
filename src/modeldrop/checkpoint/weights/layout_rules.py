"""Which files the engines load as weights, judged the way they read a model directory.

vLLM and transformers load the root `*.safetensors` files, or, when there is a root
`model.safetensors.index.json`, exactly the files its weight_map names (vLLM drops root shards the
index does not name). Nothing in a subfolder is loaded: a checkpoint whose only shards are in
one loads no weight at all, and a stale `old/model.safetensors` beside the real shards is
ignored by every engine (a warning here, never a refusal).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.contracts.models import Finding
from modeldrop.contracts.text import printable

INDEX = "model.safetensors.index.json"


@dataclass
class Layout:
    weights: list[str]  # the shards the engines load, in name order
    findings: list[Finding] = field(default_factory=list)


def _error(code: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity="error", message=message, hint=hint)


def _shards(scan: ArtifactScan) -> list[str]:
    return sorted({*scan.headers, *scan.header_errors})


def _usable_map(index: dict[str, Any], findings: list[Finding]) -> dict[str, str] | None:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        findings.append(_error("INDEX_INVALID", f"{INDEX} has no weight_map object", "re-save the model"))
        return None
    if not weight_map:
        findings.append(
            _error("INDEX_INVALID", f"{INDEX} maps no tensor: the engines would load no weight", "re-save the model")
        )
        return None
    bad = [k for k, v in weight_map.items() if not isinstance(v, str)]
    if bad:
        findings.append(
            _error(
                "INDEX_INVALID",
                f"{INDEX} maps {len(bad)} tensor(s) to a non-string (e.g. {printable(str(bad[0]))[:80]})",
                "re-save the model so the index names a shard file for every tensor",
            )
        )
        return None
    nested = sorted({v for v in weight_map.values() if "/" in v or v in ("", ".", "..")})
    if nested:
        findings.append(
            _error(
                "INDEX_INVALID",
                f"{INDEX} names shard(s) outside the model's root, which the engines do not load: "
                + ", ".join(printable(v) for v in nested[:3]),
                "keep every shard at the root beside the index (save_pretrained does)",
            )
        )
        return None
    shards: dict[str, str] = {}
    for tensor, shard in weight_map.items():  # one string per shard, not one per tensor (12 MB at 150k)
        weight_map[tensor] = shards.setdefault(shard, shard)
    return weight_map


def layout(scan: ArtifactScan, index: dict[str, Any] | None, index_present: bool) -> Layout:
    """The weights set, and the layout's findings (INDEX_* for the index's own faults). An index
    that is there but unreadable (JSON_INVALID) leaves the root shards as the weights."""
    findings: list[Finding] = []
    shards = _shards(scan)
    root = [s for s in shards if "/" not in s]
    weight_map = _usable_map(index, findings) if index is not None else None
    weights = sorted(set(weight_map.values())) if weight_map is not None else root
    if not root and shards:
        findings.append(
            _error(
                "WEIGHTS_IN_SUBFOLDER",
                f"the only .safetensors shards are in subfolders ({', '.join(printable(s) for s in shards[:3])}): "
                "the engines load weights from the model's root only",
                "put the model's files at the archive's or prefix's root (tar -czf model.tar.gz -C MODEL_DIR .)",
            )
        )
        weights = []
    elif not index_present and len(root) > 1:
        findings.append(
            _error(
                "INDEX_MISSING",
                f"{len(root)} shards but no {INDEX}",
                "save with save_pretrained so the index is written",
            )
        )
    findings += _ignored_files(scan, shards, weights)
    if weight_map is not None:  # judged here, so the index's map is not held beside the tensor table
        findings += index_mismatches(weights, weight_map, scan)
    return Layout(weights, findings)


def _ignored_files(scan: ArtifactScan, shards: list[str], weights: list[str]) -> list[Finding]:
    """Shards no engine loads, what a weights glob meets that is no weights file, and subfolder files."""
    findings: list[Finding] = []
    unused = [s for s in shards if s not in weights]
    if unused and weights:
        findings.append(
            Finding(
                code="UNUSED_WEIGHTS",
                severity="warning",
                message=f"{len(unused)} .safetensors file(s) no engine loads, ignored: "
                + ", ".join(printable(s) for s in unused[:3]),
                hint="remove them to save upload time, or name them in the index if they hold weights",
            )
        )
    findings += _not_weights(scan)
    nested = [f for f in scan.files if "/" in f and f not in unused]
    if nested:
        findings.append(
            Finding(
                code="SUBFOLDER_FILES_IGNORED",
                severity="info",
                message=f"{len(nested)} file(s) in subfolders are not read by the engines: "
                + ", ".join(printable(f) for f in sorted(nested)[:3]),
                hint="nothing to do unless one of them was meant to be at the root",
            )
        )
    return findings


def _not_weights(scan: ArtifactScan) -> list[Finding]:
    """What a `*.safetensors` glob meets that is not a weights file: a directory named like one (vLLM
    lists it and its load fails), and dot-files (skipped by the glob, so never weights)."""
    out: list[Finding] = []
    folders = set(scan.dirs) | {f.split("/", 1)[0] for f in scan.files if "/" in f}
    named_like_shards = sorted(d for d in folders if "/" not in d and d.endswith(".safetensors"))
    if named_like_shards:
        out.append(
            _error(
                "WEIGHTS_NOT_A_FILE",
                "directory named like a weights file at the model's root: "
                + ", ".join(printable(d) for d in named_like_shards[:3])
                + " (vLLM's *.safetensors glob lists it, and loading it fails)",
                "rename or remove the directory; weights are regular files",
            )
        )
    bundled = sorted(f for f in scan.files if f.startswith("adapters/"))
    if bundled:
        out.append(
            Finding(
                code="ADAPTERS_FOLDER_NOT_SERVED",
                severity="warning",
                message=f"the checkpoint's own adapters/ folder ({len(bundled)} file(s), e.g. {printable(bundled[0])}) "
                "is not served: LMI would load every adapter in it at start, unvalidated",
                hint="deploy adapters as adapters (modeldrop deploy ADAPTER --base BASE), which validates each",
            )
        )
    hidden = sorted(f for f in scan.files if f.rsplit("/", 1)[-1].startswith(".") and f.endswith(".safetensors"))
    if hidden:
        out.append(
            Finding(
                code="HIDDEN_FILES_IGNORED",
                severity="warning",
                message=f"{len(hidden)} dot-file(s) named like weights, which no engine loads (macOS AppleDouble "
                "`._` files among them): " + ", ".join(printable(f) for f in hidden[:3]),
                hint="nothing to do unless one holds weights; COPYFILE_DISABLE=1 tar ... on macOS leaves them out",
            )
        )
    return out


def index_mismatches(weights: list[str], weight_map: dict[str, str], scan: ArtifactScan) -> list[Finding]:
    """Where the index and its shards disagree (each way), with a few examples. A tensor is in the shard
    the index names when that shard's header has it (a copy in another shard too is DUPLICATE_TENSOR's)."""
    problems: list[str] = []
    for shard in weights:
        if shard not in scan.headers and shard not in scan.header_errors:
            problems.append(f"shard {printable(shard)} is mapped but missing")
    for tensor, shard in weight_map.items():
        header = scan.headers.get(shard)
        if header is not None and tensor not in header.tensors:
            problems.append(f"{printable(tensor)} is mapped to {printable(shard)} but not in it")
        if len(problems) > 5:
            break
    for shard in weights:
        header = scan.headers.get(shard)
        for tensor in header.tensors if header is not None and len(problems) <= 5 else ():
            if tensor not in weight_map:
                problems.append(f"{printable(tensor)} in {printable(shard)} is not in the index")
            if len(problems) > 5:
                break
    if not problems:
        return []
    return [
        _error(
            "INDEX_MISMATCH",
            "index and shards disagree: " + "; ".join(problems[:5]) + ("; ..." if len(problems) > 5 else ""),
            "re-save the model so the index and shards are written together",
        )
    ]
