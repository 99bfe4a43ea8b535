"""Run a function in a forked child held to a wall-clock and an address-space bound.

A chat template is a program from the artifact. The render tracer (chat_template_render) stops
templates that loop or grow strings through the paths it sees, but a sandbox global that loops in
Python the tracer does not follow (`lipsum(999999, false, 999999, 1000000)`) or a chain of filters each
multiplying a string (`|replace` ten times over: 1 GB, then an uncaught MemoryError) runs inside calls
it cannot measure in advance. In a child the work is bounded whatever its path: past the seconds it
is killed, past the bytes its allocation fails there, and the parent says which.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import resource
import select
import signal
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class ChildRefused(RuntimeError):
    """The child ran past its time or memory, or died."""


def _address_space() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _child(write: int, memory_bytes: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    try:
        limit = _address_space() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            payload = pickle.dumps(("ok", fn(*args)))
        except MemoryError:
            payload = pickle.dumps(("memory", None))
        except Exception as exc:  # raised again in the parent, as if FN had run there
            payload = pickle.dumps(("error", exc if _picklable(exc) else RuntimeError(f"{type(exc).__name__}: {exc}")))
        view = memoryview(payload)
        while view:
            view = view[os.write(write, view[: 1 << 16]) :]
    finally:
        os._exit(0)


def _picklable(exc: BaseException) -> bool:
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # any failure to round-trip means: send its text instead
        return False
    return True


def run_bounded(fn: Callable[..., T], *args: Any, seconds: float, memory_bytes: int) -> T:
    """FN(*ARGS) in a forked child; ChildRefused past SECONDS or MEMORY_BYTES over the parent's size.
    Without fork (or /proc) it runs here, under the tracer's bounds only."""
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/statm"):
        return fn(*args)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        os.close(read)
        _child(write, memory_bytes, fn, args)
    os.close(write)
    chunks: list[bytes] = []
    deadline = time.monotonic() + seconds
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChildRefused(f"it ran past {seconds:g} s")
            ready, _, _ = select.select([read], [], [], left)
            if ready:
                chunk = os.read(read, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not chunks:
        raise ChildRefused("it ended the renderer (killed, or out of memory in C)")
    kind, value = pickle.loads(b"".join(chunks))
    if kind == "memory":
        raise ChildRefused(f"it needed more than {memory_bytes >> 20} MiB")
    if kind == "error":
        raise value
    result: T = value
    return result
