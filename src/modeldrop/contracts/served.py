"""The served copy of a prefix, as the state machine fans it out: one item per object."""

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
