"""Checkpoint validation: turn an ArtifactScan into a report with findings and fixes."""

from __future__ import annotations

import enum
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from modeldrop.checkpoint.adapters.adapter_rules import is_adapter
from modeldrop.checkpoint.archive.artifact_scan import scan_source
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.archive.tar_scan import MemberSink, scan_tar_stream
from modeldrop.checkpoint.chat.side_files import load_json, parse_json, within_bounds
from modeldrop.checkpoint.validation_report import ValidationReport
from modeldrop.checkpoint.weights.base_compare import compare_to_base
from modeldrop.checkpoint.weights.hybrid_layers import hybrid_layout
from modeldrop.checkpoint.weights.layout_rules import INDEX, layout
from modeldrop.checkpoint.weights.model_dims import kv_dims
from modeldrop.contracts.artifact import is_compressed
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.errors import CheckpointRefused
from modeldrop.contracts.models import Finding
from modeldrop.contracts.text import printable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

from modeldrop.checkpoint.checkpoint_checks import (
    CHECKS,
    GIB,
    HEADER_HINTS,
    _Checkpoint,
    _int_or_none,
    _kv_shared,
    _layer_types,
    _modalities,
    _tensor_table,
)

__all__ = ["HEADER_HINTS", "ValidationReport", "validate_scan", "validate_source"]


def load_index(scan: ArtifactScan, findings: list[Finding]) -> dict[str, Any] | None:
    """The index as parse_json reads it. A big one (150,000 tensors: 13 MB) is read first with its shard
    names typed as the shards the scan holds, so that each is one object, not one per tensor (12 MB
    less at the peak of validating such a checkpoint); anything else takes parse_json's reading."""
    raw = scan.small_files.get(INDEX)
    if raw is None:
        return None
    shards = sorted({*scan.headers, *scan.header_errors})
    return parse_json(INDEX, raw, findings, fast=lambda data: _typed_index(data, shards))


def _typed_index(raw: bytes, shards: list[str]) -> dict[str, Any] | None:
    try:
        import msgspec
    except ImportError:  # pragma: no cover - a dependency
        return None
    shard = enum.Enum("Shard", {f"s{i}": name for i, name in enumerate(shards)})  # type: ignore[misc]

    typed = msgspec.defstruct("Index", [("weight_map", dict[str, shard]), ("metadata", Any, None)])
    try:
        index: Any = msgspec.json.Decoder(typed).decode(raw)
    except (msgspec.DecodeError, ValueError):
        return None  # not this plain shape (or a shard the scan lacks): parse_json judges
    if not within_bounds(index.metadata):
        return None
    weight_map: dict[str, Any] = index.weight_map
    for tensor, member in weight_map.items():
        weight_map[tensor] = member.value
    return {"metadata": index.metadata, "weight_map": weight_map}


def validate_scan(
    scan: ArtifactScan, base: ArtifactScan | None = None, target: EngineVersion | None = None
) -> ValidationReport:
    """Judge SCAN for TARGET's engine (the stack's default image when None, as the report says)."""
    findings: list[Finding] = []
    given = target is not None
    target = target or default_target()
    judged_for = target.describe() if given else f"the default image: {target.describe()}"
    config = load_json(scan, "config.json", findings)  # JSON_INVALID first, as before any check
    files = layout(scan, load_index(scan, findings), INDEX in scan.small_files)
    tensors, duplicates, dtypes, params = _tensor_table(scan, files.weights)
    kv, kv_rule = _kv_shared(config or {}, tensors)
    c = _Checkpoint(
        scan=scan,
        config=config or {},
        config_parsed=config is not None,
        tensors=tensors,
        duplicates=duplicates,
        kv=kv,
        kv_rule=kv_rule,
        target=target,
        comparison=compare_to_base(scan, base) if base is not None else None,
        layout=files,
        tokenizer_config=load_json(scan, "tokenizer_config.json", findings),
        findings=findings,
    )
    for check in CHECKS:
        c.findings.extend(check(c))
    weights_bytes = sum(dtypes.values())
    dims = kv_dims(c.config)
    hybrid = hybrid_layout(c.config)
    return ValidationReport(
        judged_for=judged_for,
        modalities=_modalities(c.config),
        deployable=not any(f.severity == "error" for f in c.findings),
        source=scan.source,
        format=scan.format,
        architecture=c.architecture,
        model_type=c.model_type,
        tensor_count=len(tensors),
        shard_count=len(files.weights),
        total_bytes=sum(scan.files.values()),
        weights_bytes=weights_bytes,
        weights_gib=round(weights_bytes / GIB, 4),
        parameters=params,
        dtypes=dict(sorted(dtypes.items())),
        vocab_size=_int_or_none(c.text_field("vocab_size")),
        num_hidden_layers=c.kv.num_hidden_layers or dims.num_layers,
        max_position_embeddings=_int_or_none(c.text_field("max_position_embeddings")),
        torch_dtype=next((v for v in (c.text_field("torch_dtype"), c.text_field("dtype")) if isinstance(v, str)), None),
        layer_types=hybrid.layer_types if hybrid else _layer_types(c.config),
        recurrent_state_bytes_per_sequence=hybrid.state_bytes_per_sequence if hybrid else 0,
        sliding_window=_int_or_none(c.text_field("sliding_window")),
        num_key_value_heads=dims.kv_heads,
        head_dim=dims.head_dim,
        kv_latent=dims.latent,
        kv_per_layer=[list(d) for d in dims.per_layer] if dims.per_layer else None,
        has_tokenizer=c.has_tokenizer,
        has_chat_template=c.has_chat_template,
        has_generation_config="generation_config.json" in scan.files,
        kv_shared=c.kv,
        # Names in messages come from the artifact: escaped here, once, for every reader of the report.
        findings=[f.model_copy(update={"message": printable(f.message)}) for f in c.findings],
        base=c.comparison,
        chat_contract=c.chat,
        requests=scan.requests + (base.requests if base is not None else 0),
    )


def refused_report(source: str, fmt: str, exc: CheckpointRefused) -> ValidationReport:
    """The report of an artifact refused by an archive rule before any file of the model was judged:
    nothing counted, and the rule's finding alone."""
    empty = validate_scan(ArtifactScan(source=printable(source), format=fmt))
    finding = Finding(
        code=exc.code or "ARCHIVE_REFUSED", severity="error", message=printable(exc.message), hint=exc.hint
    )
    return empty.model_copy(update={"deployable": False, "findings": [finding]})


def _format_of(source: str) -> str:
    if source.endswith("/") and source.startswith("s3://"):
        return "s3-prefix"
    if not source.startswith("s3://") and Path(source).is_dir():
        return "directory"
    return "tar.gz" if is_compressed(source) else "tar"


# A judged artifact: its scan (None when an archive rule refused it before any file was read) and report.
Judged = tuple[ArtifactScan | None, ValidationReport]


def default_target() -> EngineVersion:
    """The engine of the stack's default image (vLLM's DLC), which judges a checkpoint no plan names."""
    from modeldrop.serving.engine_options import engine_version

    return engine_version("vllm")


def judge_source(source: str, s3: S3Client | None = None, target: EngineVersion | None = None) -> Judged:
    """Scan and judge SOURCE as a checkpoint: an archive refused by a rule is a report with its
    finding (exit 1), bytes that cannot be read raise CheckpointUnreadable (exit 2)."""
    try:
        scan = scan_source(source, s3)
    except CheckpointRefused as exc:
        if exc.code is None:
            raise
        return None, refused_report(source, _format_of(source), exc)
    return scan, validate_scan(scan, target=target)


def validate_source(
    source: str, base: str | None = None, s3: S3Client | None = None, target: EngineVersion | None = None
) -> ValidationReport:
    """Scan and judge SOURCE (and BASE): a checkpoint, or a LoRA adapter judged against BASE."""
    return validate_with_base(source, base, s3, target)[0]


def validate_with_base(
    source: str, base: str | None = None, s3: S3Client | None = None, target: EngineVersion | None = None
) -> tuple[ValidationReport, ValidationReport | None]:
    """(SOURCE's report, BASE's own report when SOURCE is an adapter judged against it). A checkpoint
    with a BASE is compared with it (every tensor of the base it lacks); a base is read once."""
    report, base_report, _scan, _base_scan = validate_with_scans(source, base, s3, target)
    return report, base_report


def validate_with_scans(
    source: str, base: str | None = None, s3: S3Client | None = None, target: EngineVersion | None = None
) -> tuple[ValidationReport, ValidationReport | None, ArtifactScan | None, ArtifactScan | None]:
    """validate_with_base's reports and what was read to make them (SOURCE's scan, and BASE's when SOURCE
    is an adapter): the engine check judges an archive or an S3 source from these, reading nothing again."""
    try:
        scan = scan_source(source, s3)
    except CheckpointRefused as exc:
        if exc.code is None:
            raise
        return refused_report(source, _format_of(source), exc), None, None, None
    if not is_adapter(scan):
        return validate_scan(scan, scan_source(base, s3) if base else None, target), None, scan, None
    from modeldrop.checkpoint.adapter_validation import validate_adapter

    if base is None:
        return validate_adapter(scan, None, None), None, scan, None
    base_scan, base_report = judge_source(base, s3)
    return validate_adapter(scan, base_scan, base_report), base_report, scan, base_scan


def validate_archive_stream(
    raw: IO[bytes], source: str, sink: MemberSink | None = None, target: EngineVersion | None = None
) -> Judged:
    """Validate a tar(.gz) read once from RAW, writing each served member to SINK as it is read."""
    compressed = is_compressed(source)
    try:
        scan = scan_tar_stream(raw, printable(source), compressed, sink)
    except CheckpointRefused as exc:
        if exc.code is None:
            raise
        return None, refused_report(source, "tar.gz" if compressed else "tar", exc)
    return scan, validate_scan(scan, target=target)
