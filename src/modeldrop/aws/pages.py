"""Every page of a listing, through the SDK's own paginator (its token names, its page sizes)."""

from __future__ import annotations

from typing import Any


def all_items(client: Any, operation: str, key: str, page_size: int | None = None, **params: Any) -> list[Any]:
    """The KEY items of every page of OPERATION (the client's method name, e.g. "list_endpoints")."""
    config = {"PageSize": page_size} if page_size else {}
    pages = client.get_paginator(operation).paginate(**params, PaginationConfig=config)
    return [item for page in pages for item in page.get(key, [])]
