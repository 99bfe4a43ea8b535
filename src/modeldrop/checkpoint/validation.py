"""Checkpoint validation: turn an ArtifactScan into a report with findings and fixes."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from modeldrop.checkpoint.architecture_rules import expected_kv_tensors, layer_prefix, rule_for
from modeldrop.checkpoint.artifact_scan import ArtifactScan
from modeldrop.checkpoint.base_compare import BaseComparison, base_findings, compare_to_base
from modeldrop.contracts.models import Finding, ValidationSummary

GIB = 1024**3
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


class KvShared(BaseModel):
    num_hidden_layers: int | None = None
    num_kv_shared_layers: int = 0
    expected_tensors: int = 0
    missing: list[str] = Field(default_factory=list)


class ValidationReport(BaseModel):
    deployable: bool
    source: str
    format: str
    architecture: str | None
    model_type: str | None
    tensor_count: int
    shard_count: int
    total_bytes: int
    weights_bytes: int
    weights_gib: float
    parameters: int
    dtypes: dict[str, int]
    vocab_size: int | None
    num_hidden_layers: int | None
    max_position_embeddings: int | None
    torch_dtype: str | None
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    has_tokenizer: bool
    has_chat_template: bool
    has_generation_config: bool
    kv_shared: KvShared
    findings: list[Finding]
    base: BaseComparison | None = None
    requests: int = 0
    # Media the model takes besides text (its config has a vision_config / audio_config).
    modalities: list[str] = Field(default_factory=list)

    def summary(self, report_uri: str | None = None) -> ValidationSummary:
        """The state-sized part: every ValidationSummary field this report shares, plus the few it derives."""
        shared = self.model_dump(include=set(ValidationSummary.model_fields) & set(type(self).model_fields))
        shared["findings"] = [f for f in self.findings if f.severity != "info"][:20]
        return ValidationSummary(
            **shared, num_kv_shared_layers=self.kv_shared.num_kv_shared_layers, report_uri=report_uri
        )


def _json(scan: ArtifactScan, name: str, findings: list[Finding]) -> dict[str, Any] | None:
    raw = scan.small_files.get(name)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        findings.append(
            Finding(
                code="JSON_INVALID",
                severity="error",
                message=f"{name} is not valid JSON: {exc}",
                hint=f"re-save {name}",
            )
        )
        return None
    if not isinstance(value, dict):
        findings.append(
            Finding(
                code="JSON_INVALID", severity="error", message=f"{name} is not a JSON object", hint=f"re-save {name}"
            )
        )
        return None
    return value


def _text_field(config: dict[str, Any], key: str) -> Any:
    text = config.get("text_config")
    if isinstance(text, dict) and key in text:
        return text[key]
    return config.get(key)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


HEADER_HINTS = {
    "HEADER_INVALID": "the shard is corrupt, truncated or not a safetensors file; re-save and re-upload it",
    # Stricter than the reference parser, on purpose (README: "Validation rules stricter than safetensors").
    "HEADER_DUPLICATE_KEY": "a key appears twice, so loaders may disagree on which one counts; re-save the shard",
    "HEADER_TOO_LARGE": "split the checkpoint into more shards (save_pretrained(max_shard_size=...))",
}


def validate_scan(scan: ArtifactScan, base: ArtifactScan | None = None) -> ValidationReport:
    findings: list[Finding] = []
    config = _json(scan, "config.json", findings)
    if config is None and "config.json" not in scan.small_files:
        findings.append(
            Finding(
                code="CONFIG_MISSING",
                severity="error",
                message="no config.json at the artifact root",
                hint="save the model with save_pretrained into the root of the archive or prefix",
            )
        )
    config = config or {}

    for rel, err in sorted(scan.header_errors.items()):
        code = scan.header_error_codes.get(rel, "HEADER_INVALID")
        findings.append(
            Finding(
                code=code,
                severity="error",
                message=f"{rel}: {err}",
                hint=HEADER_HINTS.get(code, HEADER_HINTS["HEADER_INVALID"]),
            )
        )

    tensors: dict[str, str] = {}
    dtypes: Counter[str] = Counter()
    params = 0
    for rel, header in sorted(scan.headers.items()):
        for name, info in header.tensors.items():
            if name in tensors:
                findings.append(
                    Finding(
                        code="DUPLICATE_TENSOR",
                        severity="error",
                        message=f"tensor {name} is in both {tensors[name]} and {rel}",
                        hint="remove the stale shard",
                    )
                )
                continue
            tensors[name] = rel
            dtypes[info.dtype] += info.nbytes
            params += info.numel
    weights_bytes = sum(dtypes.values())

    if not scan.headers and not scan.header_errors:
        legacy = [f for f in scan.files if f.endswith((".bin", ".pt", ".pth", ".gguf"))]
        hint = (
            "convert to safetensors (save_pretrained(safe_serialization=True))"
            if legacy
            else "upload the model's *.safetensors shards"
        )
        findings.append(
            Finding(
                code="NO_SAFETENSORS",
                severity="error",
                message="no .safetensors weights found"
                + (f" (found {', '.join(sorted(legacy)[:3])})" if legacy else ""),
                hint=hint,
            )
        )

    _check_index(scan, tensors, findings)

    architectures = config.get("architectures")
    architecture = (
        architectures[0]
        if isinstance(architectures, list) and architectures and isinstance(architectures[0], str)
        else None
    )
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    if (
        architecture is None
        and "config.json" in scan.small_files
        and not any(f.code == "JSON_INVALID" for f in findings)
    ):
        findings.append(
            Finding(
                code="CONFIG_INCOMPLETE",
                severity="error",
                message='config.json names no architecture ("architectures": [...]): the engines cannot pick a '
                "model class" + ("" if model_type else ", and it has no model_type either"),
                hint="save the model with save_pretrained, which writes architectures and model_type",
            )
        )
    num_layers = _int_or_none(_text_field(config, "num_hidden_layers"))
    kv_shared_layers = _int_or_none(_text_field(config, "num_kv_shared_layers")) or 0
    layer_types = _text_field(config, "layer_types")
    layer_types = [str(x) for x in layer_types] if isinstance(layer_types, list) else None
    kv = KvShared(num_hidden_layers=num_layers, num_kv_shared_layers=kv_shared_layers)
    rule = rule_for(model_type) or rule_for(_text_field(config, "model_type"))
    if rule and num_layers and kv_shared_layers > 0 and tensors:
        if kv_shared_layers > num_layers:
            findings.append(
                Finding(
                    code="CONFIG_INVALID",
                    severity="error",
                    message=f"num_kv_shared_layers {kv_shared_layers} exceeds num_hidden_layers {num_layers}",
                    hint="fix config.json",
                )
            )
        else:
            expected = expected_kv_tensors(
                rule,
                layer_prefix(set(tensors)),
                num_layers,
                kv_shared_layers,
                layer_types,
                bool(_text_field(config, "attention_k_eq_v")),
            )
            kv.expected_tensors = len(expected)
            kv.missing = [n for n in expected if n not in tensors]
            if kv.missing:
                first = num_layers - kv_shared_layers
                findings.append(
                    Finding(
                        code="KV_SHARED_TENSORS_MISSING",
                        severity="error",
                        message=(
                            f"{len(kv.missing)} of {len(expected)} KV-shared tensors are missing "
                            f"(layers {first}-{num_layers - 1}; e.g. {kv.missing[0]}): vLLM fails with "
                            "'Following weights were not initialized from checkpoint'"
                        ),
                        hint=(
                            f"`modeldrop repair {scan.source} --base BASE --out DEST` copies them from the base "
                            "checkpoint into an extra shard and the index; they are unused in the forward pass, "
                            "so restoring them is harmless"
                        ),
                    )
                )

    has_tokenizer = any(f.rsplit("/", 1)[-1] in TOKENIZER_FILES for f in scan.files)
    tok_cfg = _json(scan, "tokenizer_config.json", []) or {}
    has_template = (
        "chat_template.jinja" in scan.files or "chat_template.json" in scan.files or bool(tok_cfg.get("chat_template"))
    )
    if not has_tokenizer:
        findings.append(
            Finding(
                code="TOKENIZER_MISSING",
                severity="error",
                message="no tokenizer files (tokenizer.json / tokenizer.model / tokenizer_config.json)",
                hint="save the tokenizer next to the model: tokenizer.save_pretrained(DIR)",
            )
        )
    if not has_template:
        findings.append(
            Finding(
                code="CHAT_TEMPLATE_MISSING",
                severity="warning",
                message="no chat template: /v1/chat/completions requests will be rejected",
                hint="save the processor/tokenizer with its chat template (chat_template.jinja)",
            )
        )
    has_gen = "generation_config.json" in scan.files
    if not has_gen:
        findings.append(
            Finding(
                code="GENERATION_CONFIG_MISSING",
                severity="info",
                message="no generation_config.json: the engine uses its own sampling defaults",
                hint="save model.generation_config with the model",
            )
        )

    comparison = compare_to_base(scan, base) if base is not None else None
    if comparison is not None:
        findings += base_findings(comparison, scan.source)
    total_bytes = sum(scan.files.values())
    # A media encoder's config, or the token that stands for its input in the prompt.
    media = {
        "image": ("vision_config", "image_token_id", "image_token_index"),
        "audio": ("audio_config", "audio_token_id"),
    }
    modalities = [
        m
        for m, (encoder, *tokens) in media.items()
        if isinstance(config.get(encoder), dict) or any(config.get(t) is not None for t in tokens)
    ]
    return ValidationReport(
        modalities=modalities,
        deployable=not any(f.severity == "error" for f in findings),
        source=scan.source,
        format=scan.format,
        architecture=architecture,
        model_type=model_type,
        tensor_count=len(tensors),
        shard_count=len(scan.headers) + len(scan.header_errors),
        total_bytes=total_bytes,
        weights_bytes=weights_bytes,
        weights_gib=round(weights_bytes / GIB, 4),
        parameters=params,
        dtypes=dict(sorted(dtypes.items())),
        vocab_size=_int_or_none(_text_field(config, "vocab_size")),
        num_hidden_layers=num_layers,
        max_position_embeddings=_int_or_none(_text_field(config, "max_position_embeddings")),
        torch_dtype=_text_field(config, "torch_dtype") or _text_field(config, "dtype"),
        layer_types=layer_types,
        sliding_window=_int_or_none(_text_field(config, "sliding_window")),
        num_key_value_heads=_int_or_none(_text_field(config, "num_key_value_heads")),
        head_dim=_int_or_none(_text_field(config, "head_dim")),
        has_tokenizer=has_tokenizer,
        has_chat_template=has_template,
        has_generation_config=has_gen,
        kv_shared=kv,
        findings=findings,
        base=comparison,
        requests=scan.requests + (base.requests if base is not None else 0),
    )


def _check_index(scan: ArtifactScan, tensors: dict[str, str], findings: list[Finding]) -> None:
    name = "model.safetensors.index.json"
    if name not in scan.small_files:
        if len(scan.headers) > 1:
            findings.append(
                Finding(
                    code="INDEX_MISSING",
                    severity="error",
                    message=f"{len(scan.headers)} shards but no {name}",
                    hint="save with save_pretrained so the index is written",
                )
            )
        return
    index = _json(scan, name, findings)
    if index is None:
        return
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict):
        findings.append(
            Finding(
                code="INDEX_INVALID",
                severity="error",
                message=f"{name} has no weight_map object",
                hint="re-save the model",
            )
        )
        return
    problems: list[str] = []
    for shard in sorted(set(weight_map.values())):
        if shard not in scan.headers and shard not in scan.header_errors:
            problems.append(f"shard {shard} is mapped but missing")
    for tensor, shard in weight_map.items():
        if shard in scan.headers and tensors.get(tensor) != shard:
            problems.append(f"{tensor} is mapped to {shard} but not in it")
    for tensor, shard in tensors.items():
        if tensor not in weight_map:
            problems.append(f"{tensor} in {shard} is not in the index")
    if problems:
        findings.append(
            Finding(
                code="INDEX_MISMATCH",
                severity="error",
                message=f"index and shards disagree ({len(problems)}): " + "; ".join(problems[:5]),
                hint="re-save the model so the index and shards are written together",
            )
        )
