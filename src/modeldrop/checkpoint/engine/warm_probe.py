"""A warm engine: the probe started once (`engine_probe.py --serve`) and asked again and again, so a caller
that judges many checkpoints pays vLLM's import -- nearly all of a check's cost -- once. The engine-check
Lambda starts it at init (the import runs beside the runtime's own start) and every invocation of a warm
container asks it; a cold container's first check waits for it.

It is held to the same bounds as a one-shot probe (probe_process): each question has its time bound, the
process group its memory bound, and a probe that passes either is killed and said as `failed`; the next
question starts a new one. Its stdin is the caller's pipe, so it ends with the caller.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from modeldrop.checkpoint.engine.probe_process import POLL_SECONDS, ProbeRun, _group_rss_mb, _kill_group, probe_env

PROBE = Path(__file__).with_name("engine_probe.py")


class WarmProbe:
    """One long-lived probe process for PYTHON (the engine venv's interpreter)."""

    def __init__(self, python: str) -> None:
        self.python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._err = tempfile.TemporaryFile()  # noqa: SIM115 -- held as long as the process it records
        self._lock = threading.Lock()

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        """Start the engine's import (it goes on in the background; a question waits for it)."""
        if self.alive:
            return
        self._err.seek(0)
        self._err.truncate()
        self._lines = queue.Queue()
        self._proc = subprocess.Popen([self.python, str(PROBE), "--serve"], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=self._err, env=probe_env(),
                                      start_new_session=True)  # fmt: skip
        threading.Thread(target=self._read, args=(self._proc, self._lines), daemon=True).start()

    @staticmethod
    def _read(proc: subprocess.Popen[bytes], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            lines.put(raw.decode(errors="replace"))
        lines.put(None)  # the process ended

    def ask(self, arguments: list[str], timeout: float, max_mb: int) -> ProbeRun:
        """The probe's JSON lines for ARGUMENTS (as engine_probe.py's command line takes them)."""
        with self._lock:
            self.start()
            proc = self._proc
            assert proc is not None and proc.stdin is not None
            started = time.monotonic()
            answers: list[str] = []
            peak, died = 0, None
            try:
                proc.stdin.write((json.dumps(arguments) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                died = "the warm engine had ended"
            while died is None and len(answers) < len(arguments):
                try:
                    line = self._lines.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    line = ""
                if line is None:
                    died = f"it exited with code {proc.wait()}"
                    break
                if line.startswith("{") and '"ready"' not in line[:12]:
                    answers.append(line)
                peak = max(peak, _group_rss_mb(proc.pid))
                if peak > max_mb:
                    died = f"stopped at its memory bound: {peak:,} MB across its processes, over {max_mb:,} MB"
                elif time.monotonic() - started > timeout:
                    died = f"stopped at its time bound: still running after {timeout:.0f} s"
            if died is not None:
                self.close()
            self._err.seek(0)
            stderr = self._err.read()[-20_000:].decode(errors="replace")
            return ProbeRun("".join(answers), stderr, None if died is None else -1, peak, died,
                            round(time.monotonic() - started, 2))  # fmt: skip

    def close(self) -> None:
        if self._proc is not None:
            _kill_group(self._proc)
            self._proc.wait()
            self._proc = None


_WARM: dict[str, WarmProbe] = {}


def warm_up(python: str) -> WarmProbe:
    """The warm probe for PYTHON, started now if it is not running (its import goes on in the background)."""
    warm = _WARM.get(python)
    if warm is None:
        warm = _WARM[python] = WarmProbe(python)
        atexit.register(warm.close)
    warm.start()
    return warm


def warm_probe(python: str) -> WarmProbe | None:
    """The warm probe a caller started for PYTHON (warm_up), or None: then each check starts its own."""
    return _WARM.get(python) if os.environ.get("MODELDROP_ENGINE_WARM", "1") != "0" else None
