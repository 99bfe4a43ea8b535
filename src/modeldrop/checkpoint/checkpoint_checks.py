"""The checks a checkpoint is held to, each a function of what was gathered from its scan once
(`_Checkpoint`): config, layout, shards, KV-shared tensors, weights against config.json, companions,
remote code and the base. validation.validate_scan runs them in CHECKS order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.chat.chat_contract import ChatContract, chat_contract, template_source
from modeldrop.checkpoint.chat.side_files import config_findings, implausible, parse_json
from modeldrop.checkpoint.headers.safetensors_header import TensorView
from modeldrop.checkpoint.validation_report import KvShared
from modeldrop.checkpoint.weights.architecture_rules import (
    KV_SHARED_FIXED_IN,
    expected_kv_tensors,
    kv_shared_tensors_needed,
    layer_prefix,
    rule_for,
)
from modeldrop.checkpoint.weights.base_compare import BaseComparison, base_findings
from modeldrop.checkpoint.weights.config_rules import (
    added_tokens_findings,
    config_type_findings,
    generation_findings,
    other_model_findings,
    special_token_findings,
    tokenizer_json_findings,
)
from modeldrop.checkpoint.weights.layout_rules import Layout
from modeldrop.checkpoint.weights.quant_rules import architecture_findings, quant_findings, rope_findings
from modeldrop.checkpoint.weights.tower_rules import tower_findings
from modeldrop.checkpoint.weights.weight_rules import weight_findings
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.models import Finding

GIB = 1024**3
# At the root, where AutoTokenizer looks (a tokenizer only in a subfolder loads nowhere).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def _text_field(config: dict[str, Any], key: str) -> Any:
    text = config.get("text_config")
    if isinstance(text, dict) and key in text:
        return text[key]
    return config.get(key)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


HEADER_HINTS = {
    "HEADER_INVALID": "the shard is corrupt, truncated or not a safetensors file; re-save and re-upload it",
    # Stricter than the reference parser, on purpose (docs/validation.md: "Validation rules stricter than safetensors").
    "HEADER_DUPLICATE_KEY": "a key appears twice, so loaders may disagree on which one counts; re-save the shard",
    "HEADER_TOO_LARGE": "split the checkpoint into more shards (save_pretrained(max_shard_size=...))",
    "TENSORS_TOO_MANY": "no released model has this many tensors: check that the directory holds one model, saved "
    "once (no stray copies of its shards)",
}


@dataclass
class _Checkpoint:
    """What the checks read, gathered once from the scan."""

    scan: ArtifactScan
    config: dict[str, Any]
    config_parsed: bool  # config.json was there and is a JSON object
    tensors: dict[str, str]  # tensor name -> the shard it is in (the first, when in two)
    duplicates: list[tuple[str, str, str]]  # (tensor, first shard, second shard)
    kv: KvShared
    kv_rule: bool  # the architecture has a KV-sharing rule and the config and shards can be held to it
    target: EngineVersion  # the engine (and version) of the image that will serve
    comparison: BaseComparison | None
    layout: Layout
    tokenizer_config: dict[str, Any] | None
    findings: list[Finding] = field(default_factory=list)
    chat: ChatContract | None = None  # set by _chat_contract when the checkpoint has a tokenizer

    def text_field(self, key: str) -> Any:
        return _text_field(self.config, key)

    @property
    def architecture(self) -> str | None:
        names = self.config.get("architectures")
        return names[0] if isinstance(names, list) and names and isinstance(names[0], str) else None

    @property
    def model_type(self) -> str | None:
        value = self.config.get("model_type")
        return value if isinstance(value, str) else None

    @property
    def has_tokenizer(self) -> bool:
        return any(f in TOKENIZER_FILES for f in self.scan.files)

    @property
    def has_chat_template(self) -> bool:
        return template_source(self.tokenizer_config or {}, self.scan.small_files) is not None


def _finding(code: str, severity: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity=severity, message=message, hint=hint)  # type: ignore[arg-type]


def _config_missing(c: _Checkpoint) -> Iterable[Finding]:
    if not c.config_parsed and "config.json" not in c.scan.small_files:
        yield _finding(
            "CONFIG_MISSING",
            "error",
            "no config.json at the artifact root",
            "save the model with save_pretrained into the root of the archive or prefix",
        )


def _header_errors(c: _Checkpoint) -> Iterable[Finding]:
    said: set[str] = set()
    for rel, err in sorted(c.scan.header_errors.items()):
        if rel not in c.layout.weights:
            continue  # a file no engine loads (UNUSED_WEIGHTS says so)
        code = c.scan.header_error_codes.get(rel, "HEADER_INVALID")
        if code == "TENSORS_TOO_MANY" and code in said:
            continue  # one finding for the checkpoint, not one per shard left unread
        said.add(code)
        yield _finding(code, "error", f"{rel}: {err}", HEADER_HINTS.get(code, HEADER_HINTS["HEADER_INVALID"]))


def _duplicate_tensors(c: _Checkpoint) -> Iterable[Finding]:
    for name, first, rel in c.duplicates:
        yield _finding(
            "DUPLICATE_TENSOR",
            "warning",
            f"tensor {name} is in both {first} and {rel}: the engine loads both and keeps whichever it reads last",
            "remove the stale shard",
        )


def _no_safetensors(c: _Checkpoint) -> Iterable[Finding]:
    if c.scan.headers or c.scan.header_errors:
        return
    legacy = sorted(f for f in c.scan.files if f.endswith((".bin", ".pt", ".pth", ".gguf")))
    yield _finding(
        "NO_SAFETENSORS",
        "error",
        "no .safetensors weights found" + (f" (found {', '.join(legacy[:3])})" if legacy else ""),
        "convert to safetensors (save_pretrained(safe_serialization=True))"
        if legacy
        else "upload the model's *.safetensors shards",
    )


def _no_tensors(c: _Checkpoint) -> Iterable[Finding]:
    loaded_errors = any(rel in c.layout.weights for rel in c.scan.header_errors)
    empty = [rel for rel in c.layout.weights if (h := c.scan.headers.get(rel)) is not None and not h.tensors]
    if c.layout.weights and not c.tensors and not loaded_errors:
        # Valid safetensors, but a model with no weight: the engine would serve uninitialised memory or stop.
        yield _finding(
            "NO_TENSORS",
            "error",
            f"the loaded shards ({', '.join(c.layout.weights[:3])}) hold no tensor: the engines would load no weight",
            "save the trained model's weights (save_pretrained) and upload them",
        )
    elif empty:
        yield _finding(
            "WEIGHTS_FILE_EMPTY",
            "error",
            f"{', '.join(empty[:3])} {'holds' if len(empty) == 1 else 'hold'} no tensor beside shards that do: "
            "no save writes an empty shard, so one was cut or replaced",
            "re-save the model (save_pretrained) and upload every shard it writes",
        )


def _layout(c: _Checkpoint) -> Iterable[Finding]:
    yield from c.layout.findings


def _config_bounds(c: _Checkpoint) -> Iterable[Finding]:
    return config_findings(c.config)


def _mixed_halves(c: _Checkpoint) -> Iterable[Finding]:
    """F16 beside BF16 in a dense checkpoint: no save writes both, but the engines cast every tensor to the
    served dtype as they load it, and a real vLLM load serves the same tokens (the golden's fp16-shard case):
    worth a look (a shard saved from another copy), not a refusal."""
    halves = sorted({c.scan.headers[rel].tensors[name].dtype for name, rel in c.tensors.items()} & {"F16", "BF16"})
    if len(halves) == 2 and not isinstance(c.config.get("quantization_config"), dict):
        odd = min(halves, key=lambda d: sum(1 for n, r in c.tensors.items() if c.scan.headers[r].tensors[n].dtype == d))
        names = sorted(n for n, r in c.tensors.items() if c.scan.headers[r].tensors[n].dtype == odd)
        yield _finding(
            "WEIGHTS_DTYPE_MIXED",
            "warning",
            f"{len(names)} tensor(s) are {odd} among {'BF16' if odd == 'F16' else 'F16'} weights "
            f"({', '.join(names[:3])}): the engine casts them to the served dtype, but no save writes both, so "
            "a shard may come from another copy of the model",
            "check every shard came from the same save; re-save in one dtype (model.to(torch.bfloat16)"
            ".save_pretrained(DIR)) to be sure",
        )


def _side_file_types(c: _Checkpoint) -> Iterable[Finding]:
    """What transformers' strict config, the tokenizers library and the engine's stop set refuse."""
    yield from config_type_findings(c.config)
    raw = c.scan.small_files.get("generation_config.json")
    generation = parse_json("generation_config.json", raw, []) if raw is not None else None
    yield from generation_findings(generation)
    yield from special_token_findings(c.tokenizer_config)
    yield from added_tokens_findings(c.tokenizer_config)
    yield from tokenizer_json_findings(c.scan.small_files.get("tokenizer.json"))
    if "added_tokens.json" in c.scan.small_files:  # the slow-tokenizer path reads it, and refuses it broken
        refused: list[Finding] = []
        parse_json("added_tokens.json", c.scan.small_files["added_tokens.json"], refused)
        yield from refused


def _config_incomplete(c: _Checkpoint) -> Iterable[Finding]:
    if c.architecture is None and c.config_parsed:
        yield _finding(
            "CONFIG_INCOMPLETE",
            "error",
            'config.json names no architecture ("architectures": [...]): the engines cannot pick a model class'
            + ("" if c.model_type else ", and it has no model_type either"),
            "save the model with save_pretrained, which writes architectures and model_type",
        )


def _kv_shared_tensors(c: _Checkpoint) -> Iterable[Finding]:
    kv = c.kv
    layers, shared = kv.num_hidden_layers or 0, kv.num_kv_shared_layers
    if not c.kv_rule:
        return
    if shared > layers:
        yield _finding(
            "CONFIG_INVALID",
            "error",
            f"num_kv_shared_layers {shared} exceeds num_hidden_layers {layers}",
            "fix config.json",
        )
    elif kv.missing and not kv_shared_tensors_needed(c.target):
        yield _finding(
            "KV_SHARED_TENSORS_ABSENT",
            "info",
            f"{len(kv.missing)} KV-shared tensors are absent (layers {layers - shared}-{layers - 1}), as "
            f"transformers saves them; {c.target.describe()} builds only q_proj on shared layers and loads it",
            f"nothing to do for this engine; `modeldrop repair` restores them for vLLM before {KV_SHARED_FIXED_IN}",
        )
    elif kv.missing:
        yield _finding(
            "KV_SHARED_TENSORS_MISSING",
            "error",
            f"{len(kv.missing)} of {kv.expected_tensors} KV-shared tensors are missing "
            f"(layers {layers - shared}-{layers - 1}; e.g. {kv.missing[0]}): {c.target.describe()} fails with "
            "'Following weights were not initialized from checkpoint'",
            f"`modeldrop repair {c.scan.source} --base BASE --out DEST` copies them from the base "
            "checkpoint into an extra shard and the index; they are unused in the forward pass, "
            f"so restoring them is harmless (or serve it with a vLLM {KV_SHARED_FIXED_IN}+ image)",
        )


def _weights_against_config(c: _Checkpoint) -> Iterable[Finding]:
    if not c.config_parsed or not c.tensors or c.scan.header_errors or implausible(c.config):
        return []
    shapes = TensorView(c.scan.headers, c.tensors, lambda info: info.shape)
    layers, shared = c.kv.num_hidden_layers or 0, c.kv.num_kv_shared_layers
    skip = frozenset(range(layers - shared, layers)) if c.kv_rule and 0 < shared <= layers else frozenset()
    return [*weight_findings(c.config, shapes, skip), *tower_findings(c.config, c.tensors)]


def _chat_contract(c: _Checkpoint) -> Iterable[Finding]:
    if not c.has_tokenizer or ("tokenizer_config.json" in c.scan.small_files and c.tokenizer_config is None):
        return []  # TOKENIZER_MISSING, or a tokenizer_config.json refused by its own finding
    c.chat, findings = chat_contract(c.config, c.tokenizer_config, c.scan.small_files)
    return findings


# What a deployable checkpoint has beside its weights: (present?, code, severity, message, hint).
PRESENCE: tuple[tuple[Callable[[_Checkpoint], bool], str, str, str, str], ...] = (
    (
        lambda c: c.has_tokenizer,
        "TOKENIZER_MISSING",
        "error",
        "no tokenizer files at the model's root (tokenizer.json / tokenizer.model / tokenizer_config.json), "
        "where AutoTokenizer and the engines look",
        "save the tokenizer next to the model: tokenizer.save_pretrained(DIR)",
    ),
    (
        lambda c: c.has_chat_template,
        "CHAT_TEMPLATE_MISSING",
        "warning",
        "no chat template: /v1/chat/completions requests will be rejected",
        "save the processor/tokenizer with its chat template (chat_template.jinja)",
    ),
    (
        lambda c: "generation_config.json" in c.scan.files,
        "GENERATION_CONFIG_MISSING",
        "info",
        "no generation_config.json: the engine uses its own sampling defaults",
        "save model.generation_config with the model",
    ),
)


def _companions(c: _Checkpoint) -> Iterable[Finding]:
    for present, code, severity, message, hint in PRESENCE:
        if not present(c):
            yield _finding(code, severity, message, hint)


def _remote_code(c: _Checkpoint) -> Iterable[Finding]:
    """Code shipped in the checkpoint runs only with trust_remote_code, which a stack refuses unless
    its owner allowed it: say what is there, so that nobody turns it on without knowing."""
    code = sorted(f for f in c.scan.files if f.endswith(".py"))
    auto_map = c.config.get("auto_map")
    if not code and not auto_map:
        return
    parts = []
    if isinstance(auto_map, dict) and auto_map:
        parts.append("config.json maps " + ", ".join(sorted(str(k) for k in auto_map)[:4]) + " to its own classes")
    elif auto_map:
        parts.append("config.json has an auto_map")
    if code:
        parts.append(f"{len(code)} Python file(s) ({', '.join(code[:3])})")
    yield _finding(
        "REMOTE_CODE",
        "warning",
        "the checkpoint ships its own modelling code: " + "; ".join(parts),
        "engines ignore it unless trust_remote_code is set, which runs it with the SageMaker execution role and "
        "needs the stack's AllowTrustRemoteCode; prefer an architecture the engine implements",
    )


def _other_models(c: _Checkpoint) -> Iterable[Finding]:
    return other_model_findings(c.config)


def _quantization(c: _Checkpoint) -> Iterable[Finding]:
    if not c.config_parsed or c.scan.header_errors:
        return []
    headers = TensorView(c.scan.headers, c.tensors, lambda info: (info.dtype, info.shape))
    side = any(name in c.scan.small_files for name in ("quantize_config.json", "quant_config.json"))
    found = quant_findings(c.config, headers, side, c.target) + rope_findings(c.config, c.target)
    return found + architecture_findings(c.config, c.target)


def _base(c: _Checkpoint) -> Iterable[Finding]:
    return base_findings(c.comparison, c.scan.source) if c.comparison is not None else []


# Run in this order; each reads the gathered checkpoint and yields its findings.
CHECKS: tuple[Callable[[_Checkpoint], Iterable[Finding]], ...] = (
    _config_missing,
    _header_errors,
    _duplicate_tensors,
    _no_safetensors,
    _layout,
    _no_tensors,
    _config_incomplete,
    _config_bounds,
    _side_file_types,
    _mixed_halves,
    _kv_shared_tensors,
    _weights_against_config,
    _quantization,
    _companions,
    _chat_contract,
    _remote_code,
    _other_models,
    _base,
)


def _tensor_table(
    scan: ArtifactScan, weights: list[str]
) -> tuple[dict[str, str], list[tuple[str, str, str]], Counter[str], int]:
    """Each tensor's shard, the tensors found twice, bytes per dtype, and the parameter count, over
    the shards the engines load."""
    tensors: dict[str, str] = {}
    duplicates: list[tuple[str, str, str]] = []
    dtypes: Counter[str] = Counter()
    params = 0
    for rel in weights:
        header = scan.headers.get(rel)
        if header is None:
            continue
        for name, info in header.tensors.items():
            if name in tensors:
                duplicates.append((name, tensors[name], rel))
                continue
            tensors[name] = rel
            dtypes[info.dtype] += info.nbytes
            params += info.numel
    return tensors, duplicates, dtypes, params


def _kv_shared(config: dict[str, Any], tensors: dict[str, str]) -> tuple[KvShared, bool]:
    """Which KV-shared tensors the architecture's rule expects, which of them are missing, and
    whether the rule applies at all."""
    num_layers = _int_or_none(_text_field(config, "num_hidden_layers"))
    shared = _int_or_none(_text_field(config, "num_kv_shared_layers")) or 0
    kv = KvShared(num_hidden_layers=num_layers, num_kv_shared_layers=shared)
    rule = rule_for(config.get("model_type") if isinstance(config.get("model_type"), str) else None)
    rule = rule or rule_for(_text_field(config, "model_type"))
    # A config with implausible sizes gets CONFIG_IMPLAUSIBLE, never per-layer work on them.
    applies = bool(rule and num_layers and shared > 0 and tensors) and not implausible(config)
    if rule and num_layers and applies and shared <= num_layers:
        expected = expected_kv_tensors(
            rule,
            layer_prefix(set(tensors)),
            num_layers,
            shared,
            _layer_types(config),
            bool(_text_field(config, "attention_k_eq_v")),
        )
        kv.expected_tensors = len(expected)
        kv.missing = [n for n in expected if n not in tensors]
    return kv, applies


def _layer_types(config: dict[str, Any]) -> list[str] | None:
    value = _text_field(config, "layer_types")
    return [str(x) for x in value] if isinstance(value, list) else None


# A media encoder's config, or the token that stands for its input in the prompt.
MEDIA = {
    "image": ("vision_config", "image_token_id", "image_token_index"),
    "audio": ("audio_config", "audio_token_id"),
}


def _modalities(config: dict[str, Any]) -> list[str]:
    return [
        m
        for m, (encoder, *tokens) in MEDIA.items()
        if isinstance(config.get(encoder), dict) or any(config.get(t) is not None for t in tokens)
    ]
