"""What is served: a prefix's objects as the state machine fans their copy out (one item per
object), and a LoRA adapter served beside its base."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, computed_field

# The max_lora_rank values vLLM accepts (LMI's lmi-dist is vLLM's loader; SGLang's bound is the same
# in practice): an adapter of a larger rank cannot be served.
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORA_RANK = VLLM_LORA_RANKS[-1]
_GENERIC_ARCHIVE_NAMES = ("model", "adapter", "adapter_model")


def adapter_name(location: str) -> str:
    """The name requests use for an adapter: its folder's name (or its archive's, unless that is a
    generic model/adapter.tar.gz, then the folder holding it), as a slug."""
    parts = [p for p in location.rstrip("/").split("/") if p]
    leaf = parts[-1] if parts else ""
    if leaf.endswith(".tar.gz"):
        stem = leaf[: -len(".tar.gz")]
        leaf = parts[-2] if stem in _GENERIC_ARCHIVE_NAMES and len(parts) > 1 else stem
    return re.sub(r"[^a-z0-9-]+", "-", leaf.lower()).strip("-")[:40] or "adapter"


class CopyItem(BaseModel):
    """One object of the source prefix (its path relative to the prefix), pinned by its listed ETag."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(min_length=1, max_length=1024)
    size: int = Field(ge=0)
    etag: str = Field(min_length=1)


class CopyResult(BaseModel):
    key: str
    parts: int  # 1: one CopyObject; more: a multipart copy of that many parts, copied in parallel


class CopyBatchResult(BaseModel):
    results: list[CopyResult]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def copied(self) -> int:
        return len(self.results)


class AdapterInfo(BaseModel):
    """A validated LoRA adapter as the plan and the eval need it."""

    name: str  # the name requests use (vLLM's model field, LMI's adapters list)
    path: str  # inside the container: /opt/ml/model/adapters/<name>
    max_rank: int
    modules: int
    bytes: int
    # Sum over adapted modules of in_features + out_features: LoRA buffers are this x rank x slots.
    features: int
    report_uri: str | None = None
    version: str | None = None
    artifact_url: str | None = None  # adapter_mode shared: the validated files packed as one .tar.gz
