"""Stopping a local run cleanly on Ctrl-C, SIGTERM or SIGHUP, wherever the signal lands.

Python raises KeyboardInterrupt at whatever bytecode is running, and an exception raised inside a
finalizer (a generator closed by the garbage collector, a `__del__`) is printed and swallowed, so
the run would go on as if nothing happened. The handler therefore also records the signal, and the
run checks the record at each poll (`raise_if_interrupted`). Cleanup runs `deferred()`: a second
signal during it is recorded, not raised, so it cannot cut the cleanup short.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_pending: int | None = None
_deferred = 0


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal; `exit_code` is the shell's 128 + signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.still_running: list[str] = []

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    global _pending
    if _pending is None:
        _pending = signum
    if not _deferred:
        raise Interrupted(signum)


def raise_if_interrupted() -> None:
    """Raise the recorded signal if one arrived (even one whose exception was swallowed)."""
    if _pending is not None and not _deferred:
        raise Interrupted(_pending)


@contextmanager
def handled() -> Iterator[None]:
    """Turn the stop signals into `Interrupted` for the duration (main thread only).

    A SIGINT inherited as ignored stays ignored: that is how a shell without job control starts a
    background job, so that Ctrl-C at the terminal stops only the foreground one.
    """
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _pending = None
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig, previous in saved.items():
        if not (sig == signal.SIGINT and previous == signal.SIG_IGN):
            signal.signal(sig, _on_signal)
    try:
        yield
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def deferred() -> Iterator[None]:
    """Record, do not raise, stop signals while cleaning up."""
    global _deferred
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
