"""The validation report of a LoRA adapter: its own files and headers, then the fit to its base."""

from __future__ import annotations

from typing import Any

from modeldrop.checkpoint.adapters.adapter_companions import base_name_findings, tokenizer_findings
from modeldrop.checkpoint.adapters.adapter_rules import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterSummary,
    finding,
    judge,
    layout_findings,
)
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.chat.bounded_child import ChildRefused, run_bounded
from modeldrop.checkpoint.chat.side_files import load_json
from modeldrop.checkpoint.headers.safetensors_header import TensorInfo
from modeldrop.checkpoint.validation_report import KvShared, ValidationReport
from modeldrop.contracts.models import AdapterInfo, Finding
from modeldrop.contracts.text import printable

GIB = 1024**3
ADAPTERS_DIR = "adapters"  # beside the base's files: where LMI looks, and where the vLLM/SGLang env points
MODEL_DIR = "/opt/ml/model"


def adapter_info(report: ValidationReport, name: str, version: str | None, report_uri: str | None) -> AdapterInfo:
    """What the plan (LoRA slots and buffers) and the eval (the adapter's name) need of the report."""
    summary = report.adapter
    return AdapterInfo(
        name=name,
        path=f"{MODEL_DIR}/{ADAPTERS_DIR}/{name}",
        max_rank=(summary.max_rank if summary and summary.max_rank else 0),
        modules=summary.modules if summary else 0,
        bytes=summary.bytes if summary else 0,
        features=summary.features if summary else 0,
        report_uri=report_uri,
        version=version,
    )


def _tensors(scan: ArtifactScan, only: str | None = None) -> dict[str, TensorInfo]:
    """The tensors of ONLY, or of every shard at the root (what an engine loads of a base)."""
    tensors: dict[str, TensorInfo] = {}
    for rel, header in sorted(scan.headers.items()):
        if rel == only or (only is None and "/" not in rel):
            tensors.update(header.tensors)
    return tensors


# What an adapter's report says of the model it runs in: its base's own words.
_FROM_BASE = (
    "architecture",
    "model_type",
    "vocab_size",
    "num_hidden_layers",
    "max_position_embeddings",
    "torch_dtype",
    "layer_types",
    "sliding_window",
    "num_key_value_heads",
    "head_dim",
    "has_tokenizer",
    "has_chat_template",
    "has_generation_config",
    "kv_shared",
    "modalities",
)
_NO_BASE: dict[str, Any] = {
    **dict.fromkeys(_FROM_BASE),
    "has_tokenizer": False,
    "has_chat_template": False,
    "has_generation_config": False,
    "kv_shared": KvShared(),
    "modalities": [],
}


def validate_adapter(
    scan: ArtifactScan, base: ArtifactScan | None, base_report: ValidationReport | None
) -> ValidationReport:
    """ValidationReport of the adapter in SCAN against BASE, whose own report is BASE_REPORT (BASE is
    None when no base was named, or when an archive rule refused it before any file was read)."""
    findings: list[Finding] = list(layout_findings(scan))
    config = load_json(scan, ADAPTER_CONFIG, findings) or {}
    for rel, err in sorted(scan.header_errors.items()):
        code = scan.header_error_codes.get(rel, "HEADER_INVALID")
        findings.append(finding(code, "error", f"{rel}: {err}", "re-save the adapter with PEFT's save_pretrained"))
    findings += _base_findings(base_report)
    tensors = _tensors(scan, ADAPTER_WEIGHTS)
    summary = AdapterSummary()
    if config and ADAPTER_WEIGHTS in scan.headers:
        rules, summary = _judged(scan, base, config, tensors)
        findings += rules
    summary.base = base_report.source if base_report is not None else None
    dtypes: dict[str, int] = {}
    for t in tensors.values():
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
    weights = sum(dtypes.values())
    inherited = base_report.model_dump(include=set(_FROM_BASE)) if base_report is not None else _NO_BASE
    return ValidationReport(
        **inherited,
        deployable=not any(f.severity == "error" for f in findings),
        source=scan.source,
        format=scan.format,
        tensor_count=len(tensors),
        shard_count=1 if ADAPTER_WEIGHTS in scan.files else 0,
        total_bytes=sum(scan.files.values()),
        weights_bytes=weights,
        weights_gib=round(weights / GIB, 4),
        parameters=sum(_count(t) for t in tensors.values()),
        dtypes=dict(sorted(dtypes.items())),
        findings=[f.model_copy(update={"message": printable(f.message)}) for f in findings],
        requests=scan.requests + (base.requests if base is not None else 0),
        adapter=summary,
    )


def _judged(
    scan: ArtifactScan, base: ArtifactScan | None, config: dict[str, Any], tensors: dict[str, TensorInfo]
) -> tuple[list[Finding], AdapterSummary]:
    """The adapter's rules against its base (only those about the adapter itself without one), and
    with a base its tokenizer and the base's name."""
    base_config = (load_json(base, "config.json", []) or {}) if base is not None else {}
    try:  # PEFT's target / exclude regexes come from the file: matched in a child bounded in time and memory
        rules, summary = run_bounded(
            judge, config, tensors, _tensors(base) if base is not None else {}, base_config,
            seconds=JUDGE_SECONDS, memory_bytes=JUDGE_MEMORY_BYTES,
        )  # fmt: skip
    except ChildRefused as exc:
        stopped = finding(
            "ADAPTER_CONFIG_INVALID",
            "error",
            f"matching the adapter's target_modules / exclude_modules / rank_pattern against the modules was stopped: "
            f"{exc} (a regex that backtracks: PEFT would hang loading it the same way)",
            'name the modules as a list (target_modules: ["q_proj", "v_proj"]) or a regex without nested repetition',
        )
        return [stopped], AdapterSummary()
    if base is None:
        return [f for f in rules if not f.code.startswith(_NEEDS_BASE)], summary
    text = base_config.get("text_config") if isinstance(base_config.get("text_config"), dict) else base_config
    vocab = text.get("vocab_size") if isinstance(text, dict) else None
    rules += tokenizer_findings(scan, base, vocab if isinstance(vocab, int) else None)
    rules += base_name_findings(config, base_config, base.source)
    return rules, summary


def _base_findings(base_report: ValidationReport | None) -> list[Finding]:
    """No base named, or a base that is itself refused: either is the adapter's first finding."""
    if base_report is None:
        return [
            finding(
                "ADAPTER_BASE_REQUIRED",
                "error",
                "this is a LoRA adapter: it is judged against the base it will be served on",
                "name the base: modeldrop validate ADAPTER --base BASE_DIR_OR_S3_URI",
            )
        ]
    if base_report.deployable:
        return []
    first = next(f for f in base_report.findings if f.severity == "error")
    message = f"the base {base_report.source} is itself refused: {first.code}: {first.message}"
    return [finding("ADAPTER_BASE_REFUSED", "error", message, first.hint)]


# What judging an adapter may take: a real one is judged in well under a second.
JUDGE_SECONDS = 20.0
JUDGE_MEMORY_BYTES = 1 << 30


# Without a base, only the rules about the adapter itself are judged.
_NEEDS_BASE = ("ADAPTER_TARGET_MISSING", "ADAPTER_SHAPE_MISMATCH", "ADAPTER_VOCAB_RESIZED", "ADAPTER_DTYPE")


def _count(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n
