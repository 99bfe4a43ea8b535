"""The one clock every deadline and expiry reads.

The local emulator advances it when a Wait state runs, so production wait and deadline values can
be exercised in tests without sleeping.
"""

from __future__ import annotations

import threading
import time
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


_virtual_sleep = False


def sleep(seconds: float) -> None:
    """Wait SECONDS: really on AWS; in the emulator the clock advances instead (as a Wait state does)."""
    if _virtual_sleep:
        advance(seconds)
    else:
        time.sleep(seconds)


def use_virtual_sleep(virtual: bool = True) -> None:
    global _virtual_sleep
    _virtual_sleep = virtual


def reset() -> None:
    global _offset
    with _lock:
        _offset = timedelta(0)


def iso(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC)
