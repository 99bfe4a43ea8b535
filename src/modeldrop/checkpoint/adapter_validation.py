"""The validation report of a LoRA adapter: its own files and headers, then the fit to its base."""

from __future__ import annotations

from typing import Any

from modeldrop.checkpoint.adapter_rules import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    AdapterSummary,
    base_name_findings,
    finding,
    judge,
    layout_findings,
    tokenizer_findings,
)
from modeldrop.checkpoint.safetensors_header import TensorInfo
from modeldrop.checkpoint.scan_result import ArtifactScan
from modeldrop.checkpoint.side_files import load_json
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


def validate_adapter(
    scan: ArtifactScan, base: ArtifactScan | None, base_report: ValidationReport | None
) -> ValidationReport:
    """ValidationReport of the adapter in SCAN against BASE (whose own report is BASE_REPORT)."""
    findings: list[Finding] = list(layout_findings(scan))
    config = load_json(scan, ADAPTER_CONFIG, findings) or {}
    for rel, err in sorted(scan.header_errors.items()):
        code = scan.header_error_codes.get(rel, "HEADER_INVALID")
        findings.append(finding(code, "error", f"{rel}: {err}", "re-save the adapter with PEFT's save_pretrained"))
    tensors = _tensors(scan, ADAPTER_WEIGHTS)
    summary = AdapterSummary()
    if base is None or base_report is None:
        findings.append(
            finding(
                "ADAPTER_BASE_REQUIRED",
                "error",
                "this is a LoRA adapter: it is judged against the base it will be served on",
                "name the base: modeldrop validate ADAPTER --base BASE_DIR_OR_S3_URI",
            )
        )
        base_config: dict[str, Any] = {}
    else:
        base_config = load_json(base, "config.json", []) or {}
        if not base_report.deployable:
            first = next(f for f in base_report.findings if f.severity == "error")
            findings.append(
                finding(
                    "ADAPTER_BASE_REFUSED",
                    "error",
                    f"the base {base_report.source} is itself refused: {first.code}: {first.message}",
                    first.hint,
                )
            )
    if config and ADAPTER_WEIGHTS in scan.headers:
        rules, summary = judge(config, tensors, _tensors(base) if base is not None else {}, base_config)
        findings += rules if base is not None else [f for f in rules if not f.code.startswith(_NEEDS_BASE)]
        if base is not None:
            text = base_config.get("text_config") if isinstance(base_config.get("text_config"), dict) else base_config
            vocab = text.get("vocab_size") if isinstance(text, dict) else None
            findings += tokenizer_findings(scan, base, vocab if isinstance(vocab, int) else None)
            findings += base_name_findings(config, base_config, base.source)
    summary.base = base_report.source if base_report is not None else None
    weights = sum(t.nbytes for t in tensors.values())
    dtypes: dict[str, int] = {}
    for t in tensors.values():
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
    ref = base_report
    return ValidationReport(
        deployable=not any(f.severity == "error" for f in findings),
        source=scan.source,
        format=scan.format,
        architecture=ref.architecture if ref else None,
        model_type=ref.model_type if ref else None,
        tensor_count=len(tensors),
        shard_count=1 if ADAPTER_WEIGHTS in scan.files else 0,
        total_bytes=sum(scan.files.values()),
        weights_bytes=weights,
        weights_gib=round(weights / GIB, 4),
        parameters=sum(_count(t) for t in tensors.values()),
        dtypes=dict(sorted(dtypes.items())),
        vocab_size=ref.vocab_size if ref else None,
        num_hidden_layers=ref.num_hidden_layers if ref else None,
        max_position_embeddings=ref.max_position_embeddings if ref else None,
        torch_dtype=ref.torch_dtype if ref else None,
        layer_types=ref.layer_types if ref else None,
        sliding_window=ref.sliding_window if ref else None,
        num_key_value_heads=ref.num_key_value_heads if ref else None,
        head_dim=ref.head_dim if ref else None,
        has_tokenizer=ref.has_tokenizer if ref else False,
        has_chat_template=ref.has_chat_template if ref else False,
        has_generation_config=ref.has_generation_config if ref else False,
        kv_shared=ref.kv_shared if ref else KvShared(),
        findings=[f.model_copy(update={"message": printable(f.message)}) for f in findings],
        requests=scan.requests + (base.requests if base is not None else 0),
        modalities=ref.modalities if ref else [],
        adapter=summary,
    )


# Without a base, only the rules about the adapter itself are judged.
_NEEDS_BASE = ("ADAPTER_TARGET_MISSING", "ADAPTER_SHAPE_MISMATCH", "ADAPTER_VOCAB_RESIZED", "ADAPTER_DTYPE")


def _count(t: TensorInfo) -> int:
    n = 1
    for d in t.shape:
        n *= d
    return n
