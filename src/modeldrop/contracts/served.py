"""What is served: a prefix's objects as the state machine fans their copy out (one item per
object), and a LoRA adapter served beside its base."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CopyItem(BaseModel):
    """One object of the source prefix (its path relative to the prefix), pinned by its listed ETag."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(min_length=1, max_length=1024)
    size: int = Field(ge=0)
    etag: str = Field(min_length=1)


class CopyResult(BaseModel):
    key: str
    parts: int  # 1: one CopyObject; more: a multipart copy of that many parts, copied in parallel


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
