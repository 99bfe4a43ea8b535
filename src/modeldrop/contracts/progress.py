"""Progress of long byte work (inflating, packing, uploading), for whoever listens.

The command line listens with a progress bar on a terminal; nobody listens in a Lambda, where a
report costs one context-variable read. The domain code reports bytes done (and the total when it
knows it) and never learns how, or whether, they are shown.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

Listener = Callable[[int, int | None], None]

_listener: ContextVar[Listener | None] = ContextVar("modeldrop_progress", default=None)


def report(done: int, total: int | None = None) -> None:
    listener = _listener.get()
    if listener is not None:
        listener(done, total)


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


def counter(total: int | None) -> Callable[[int], None]:
    """A callback that adds byte counts from any thread (an SDK transfer's workers, which do not
    see this context) and reports the running sum to the listener of the caller's context."""
    listener = _listener.get()
    lock = threading.Lock()
    done = 0

    def add(n: int) -> None:
        nonlocal done
        with lock:
            done += n
            current = done
        if listener is not None:
            listener(current, total)

    return add
