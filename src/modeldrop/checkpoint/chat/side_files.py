"""The JSON files validation reads beside the weights (config.json, the index, tokenizer_config.json),
parsed with bounds that hold on any input, and configs held to plausible sizes before any
per-layer work.

A 16 MiB side file of empty arrays builds tens of millions of Python objects when parsed whole
(460-480 MB measured); a config claiming 1.5 M layers made the KV-shared rule build 4.5 M names.
The number of JSON values a text can hold is at most the count of its `[`, `{`, `,` and `:` bytes
(plus one), counted in C before any parse: past the cap the file is refused with a finding.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.headers.header_json import _msgspec_decode
from modeldrop.contracts.models import Finding

# A 100k-tensor index is ~200k values; real configs and tokenizer configs are well under.
MAX_JSON_VALUES = 500_000

# What no real model has, with room to grow: past these the config is refused before the rules
# that work per layer or per head run.
CONFIG_BOUNDS = {
    "num_hidden_layers": 4096,
    "num_kv_shared_layers": 4096,
    "num_attention_heads": 65_536,
    "num_key_value_heads": 65_536,
    "head_dim": 65_536,
    "hidden_size": 1 << 20,
    "intermediate_size": 1 << 22,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 30,
    "sliding_window": 1 << 30,
    # Routed experts per MoE layer: the largest released models have 384 (Kimi-K2) and 512 (Qwen3-Next); a
    # million made the engine check's meta model outgrow its function (1.75 GB) before any verdict.
    "num_local_experts": 4096,
    "num_experts": 4096,
    "n_routed_experts": 4096,
    "moe_num_experts": 4096,
}
MAX_LAYER_TYPES = CONFIG_BOUNDS["num_hidden_layers"]


def value_bound(raw: bytes) -> int:
    """An upper bound on the JSON values (and keys) a text holds; bytes inside strings only raise it."""
    return raw.count(b"[") + raw.count(b"{") + raw.count(b",") + raw.count(b":") + 1


def _finding(code: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity="error", message=message, hint=hint)


def load_json(scan: ArtifactScan, name: str, findings: list[Finding]) -> dict[str, Any] | None:
    """NAME from the scan as a JSON object, or None (with a finding when it is there but refused)."""
    raw = scan.small_files.get(name)
    return None if raw is None else parse_json(name, raw, findings)


def parse_json(
    name: str, raw: bytes, findings: list[Finding], fast: Callable[[bytes], Any] | None = None
) -> dict[str, Any] | None:
    """RAW (the side file NAME) as a JSON object within the bounds, or None with a finding saying why.
    FAST, given, may read RAW first (None: it cannot say, and the standard reading stands)."""
    values = value_bound(raw)
    if values > MAX_JSON_VALUES:
        findings.append(
            _finding(
                "JSON_TOO_LARGE",
                f"{name} may hold {values:,} JSON values, over modeldrop's {MAX_JSON_VALUES:,}",
                f"re-save {name}: real ones hold thousands",
            )
        )
        return None
    encoding = _encoding_problem(raw)
    if encoding is not None:
        findings.append(
            _finding(
                "JSON_ENCODING",
                f"{name} {encoding}: transformers and PEFT read side files as UTF-8 without a byte-order mark, and "
                "refuse it",
                f"re-save {name} as UTF-8 without a BOM (save_pretrained writes it so)",
            )
        )
        return None
    value = fast(raw) if fast is not None and _msgspec_decode is not None and len(raw) > FAST_DECODE_BYTES else None
    if value is not None:
        return value
    try:
        value = _decode(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError; so is an unbounded integer
        findings.append(_finding("JSON_INVALID", f"{name} is not valid JSON: {str(exc)[:200]}", f"re-save {name}"))
        return None
    if not isinstance(value, dict):
        findings.append(_finding("JSON_INVALID", f"{name} is not a JSON object", f"re-save {name}"))
        return None
    return value


MAX_INT_DIGITS = 40  # past any size, id or count a model file holds; Python refuses 4,300 with a ValueError
_INT_BOUND = 10**MAX_INT_DIGITS
_BOMS = (
    (b"\x00\x00\xfe\xff", "is UTF-32 (big-endian, with a BOM)"),
    (b"\xff\xfe\x00\x00", "is UTF-32 (little-endian, with a BOM)"),
    (b"\xef\xbb\xbf", "starts with a UTF-8 byte-order mark"),
    (b"\xfe\xff", "is UTF-16 (big-endian, with a BOM)"),
    (b"\xff\xfe", "is UTF-16 (little-endian, with a BOM)"),
)


def _encoding_problem(raw: bytes) -> str | None:
    for bom, what in _BOMS:
        if raw.startswith(bom):
            return what
    if b"\x00" in raw[:4]:
        return "is UTF-16 or UTF-32 (NUL bytes among its first characters)"
    if raw.isascii():  # no copy: most side files, and every index, are ASCII
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"is not UTF-8 (byte {exc.start})"
    return None


def _decode(raw: bytes) -> Any:
    """RAW as the standard library reads it (integers bounded). A big file (a 150,000-tensor index is
    13 MB) is read first by msgspec, from the bytes, with no second copy as text; where msgspec refuses
    what the standard library reads (NaN, a lone surrogate, 1e400), or reads what it refuses (an
    over-long integer, deep nesting), the standard library's reading stands, errors included."""
    if _msgspec_decode is not None and len(raw) > FAST_DECODE_BYTES:
        try:
            value = _msgspec_decode(raw)
        except Exception:  # any refusal: the standard library judges
            value = _UNSURE
        if value is not _UNSURE and within_bounds(value):
            return value
    return json.loads(raw.decode("utf-8"), parse_int=_bounded_int)


FAST_DECODE_BYTES = 1 << 20
_UNSURE = object()
_MAX_DEPTH = 500  # well inside the standard library's recursion limit: deeper ones take its path


def within_bounds(value: Any) -> bool:
    """No integer past MAX_INT_DIGITS digits and no nesting deeper than _MAX_DEPTH (iteratively)."""
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            return False
        if type(item) is dict:
            stack.extend((v, depth + 1) for v in item.values() if type(v) is not str)
        elif type(item) is list:
            stack.extend((v, depth + 1) for v in item if type(v) is not str)
        elif type(item) is int and not -_INT_BOUND < item < _INT_BOUND:
            return False
    return True


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits):,} digits (at most {MAX_INT_DIGITS})")
    return int(digits)


def _sections(config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    out = [("", config)]
    for key in ("text_config", "vision_config", "audio_config"):
        section = config.get(key)
        if isinstance(section, dict):
            out.append((f"{key}.", section))
    return out


def implausible(config: dict[str, Any]) -> list[str]:
    """The config's sizes outside [0, CONFIG_BOUNDS], as `key = value` texts."""
    problems = []
    for where, section in _sections(config):
        for key, bound in CONFIG_BOUNDS.items():
            value = section.get(key)
            # Only numbers are judged: a list (per-layer sizes in some architectures) is read by no rule.
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not 0 <= value <= bound:
                problems.append(f"{where}{key} = {str(value)[:40]} (at most {bound:,})")
        layer_types = section.get("layer_types")
        if isinstance(layer_types, list) and len(layer_types) > MAX_LAYER_TYPES:
            problems.append(f"{where}layer_types has {len(layer_types):,} entries (at most {MAX_LAYER_TYPES:,})")
    return problems


def config_findings(config: dict[str, Any]) -> list[Finding]:
    problems = implausible(config)
    if not problems:
        return []
    return [
        _finding(
            "CONFIG_IMPLAUSIBLE",
            "config.json has sizes no model has: " + "; ".join(problems[:5]),
            "fix config.json (save it with save_pretrained from the trained model)",
        )
    ]
