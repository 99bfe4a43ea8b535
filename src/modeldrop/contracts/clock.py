"""The one clock every deadline and expiry reads.

The local emulator advances it when a Wait state runs, so production wait and deadline values can
be exercised in tests without sleeping.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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
_here = threading.local()  # the virtual seconds this thread has slept (the emulator's Lambda clock)
_remaining: ContextVar[Callable[[], float] | None] = ContextVar("remaining", default=None)


def sleep(seconds: float) -> None:
    """Wait SECONDS: really on AWS; in the emulator the clock advances instead (as a Wait state does)."""
    if _virtual_sleep:
        advance(seconds)
        _here.slept = slept_here() + seconds
    else:
        time.sleep(seconds)


def slept_here() -> float:
    """The virtual seconds this thread has slept: what an emulated Lambda spent waiting."""
    return float(getattr(_here, "slept", 0.0))


@contextmanager
def budget(remaining: Callable[[], float]) -> Iterator[None]:
    """Within, time_left() is REMAINING() (a Lambda's get_remaining_time_in_millis, in seconds)."""
    token = _remaining.set(remaining)
    try:
        yield
    finally:
        _remaining.reset(token)


def time_left() -> float | None:
    """The seconds the running Lambda has left, or None outside one (the CLI: no limit)."""
    remaining = _remaining.get()
    return None if remaining is None else remaining()


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
