"""The one clock every deadline and expiry reads.

The local emulator advances it when a Wait state runs, so production wait and deadline values can
be exercised in tests without sleeping.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

_lock = threading.Lock()
_offset = timedelta(0)


def utcnow() -> datetime:
    with _lock:
        return datetime.now(UTC) + _offset


def advance(seconds: float) -> None:
    global _offset
    with _lock:
        _offset += timedelta(seconds=seconds)


def reset() -> None:
    global _offset
    with _lock:
        _offset = timedelta(0)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
