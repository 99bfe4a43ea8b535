"""What an adapter brings beside its LoRA tensors, against its base: its own tokenizer (the engines
serve the base's) and the base it says it was trained on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from modeldrop.checkpoint.adapters.adapter_rules import finding
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.contracts.models import Finding


def tokenizer_findings(adapter: ArtifactScan, base: ArtifactScan, base_vocab: int | None) -> Iterable[Finding]:
    """The adapter's own tokenizer, when it ships one: the engines serve the base's, so it must agree."""
    import json

    raw = adapter.small_files.get("tokenizer_config.json")
    if raw is None:
        return
    try:
        config = json.loads(raw)
    except (ValueError, RecursionError):
        return
    added = config.get("added_tokens_decoder") if isinstance(config, dict) else None
    ids = [int(k) for k in added if str(k).isdigit()] if isinstance(added, dict) else []
    if base_vocab and ids and max(ids) >= base_vocab:
        yield finding(
            "ADAPTER_TOKENIZER_MISMATCH",
            "error",
            f"the adapter's tokenizer adds token id {max(ids)}, past the base's vocabulary of {base_vocab}: the "
            "engines serve the base's tokenizer and embedding",
            "train without adding tokens, or merge the adapter into a resized base and deploy that checkpoint",
        )
    elif adapter.files.get("tokenizer.json") not in (None, base.files.get("tokenizer.json")):
        yield finding(
            "ADAPTER_TOKENIZER_DIFFERS",
            "warning",
            "the adapter's tokenizer.json differs from the base's: the endpoint tokenizes with the base's",
            "drop the adapter's tokenizer files if they are the base's, or check the chat template the adapter expects",
        )


def base_name_findings(config: dict[str, Any], base_config: dict[str, Any], base_source: str) -> Iterable[Finding]:
    """base_model_name_or_path against what the base says of itself (a path differs by location only)."""
    named = config.get("base_model_name_or_path")
    own = base_config.get("_name_or_path")
    if not isinstance(named, str) or not named:
        return
    leaf = named.rstrip("/").rsplit("/", 1)[-1].lower()
    candidates = {base_source.rstrip("/").rsplit("/", 1)[-1].lower()}
    if isinstance(own, str) and own:
        candidates.add(own.rstrip("/").rsplit("/", 1)[-1].lower())
    if leaf not in candidates and isinstance(own, str) and own:
        yield finding(
            "ADAPTER_BASE_NAME",
            "warning",
            f"the adapter was trained on {named!r}, the base calls itself {own!r}",
            "check that --base is the model the adapter was trained on (the shapes above agree)",
        )
