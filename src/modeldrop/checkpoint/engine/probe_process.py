"""The engine probe as a process the caller holds: offline, with a minimal environment, under a time and a
memory bound below the function's own, and its death said as such (never read as a verdict).

Why bounds of its own: a Lambda killed at its memory size takes the whole step with it, and the review
saw a probe outgrow the function (1M experts: 1.75 GB and 72 s) and end as `undetermined`, letting the
deployment go on. The probe and the second vLLM process it may start (the model-info inspection of a
first-seen architecture) are one process group: the bound is on their summed resident memory, read from
/proc, and the whole group is killed when it is passed.

Why offline: a config.json can name another model (`speculators_config`), and vLLM then fetches it from
the Hub. The probe judges the checkpoint it was given and nothing else: HF_HUB_OFFLINE, no credentials
(on Lambda the role's keys are in the environment), and the probe itself refuses any connection beyond
loopback (engine_probe.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MAX_MB_ENV = "MODELDROP_ENGINE_CHECK_MAX_MB"
# Locally, and on a function whose size is not known: well under the image function's 3,008 MB.
DEFAULT_MAX_MB = 2_560
# On Lambda: the function's memory less what its own Python, the scan and the skeleton hold.
FUNCTION_HEADROOM_MB = 448
POLL_SECONDS = 0.1
# What the engine needs of the caller's environment; nothing else passes (no AWS_*, no tokens).
PASSED = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "XDG_CACHE_HOME", "HF_HOME", "OMP_NUM_THREADS")
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_HOST_IP": "127.0.0.1",
    "TOKENIZERS_PARALLELISM": "false",
}


def memory_bound_mb() -> int:
    """The probe's bound: MODELDROP_ENGINE_CHECK_MAX_MB, else the function's memory less its headroom."""
    if os.environ.get(MAX_MB_ENV, "").isdigit():
        return max(int(os.environ[MAX_MB_ENV]), 1)
    function_mb = os.environ.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "")
    if function_mb.isdigit():
        return max(int(function_mb) - FUNCTION_HEADROOM_MB, 256)
    return DEFAULT_MAX_MB


def probe_env() -> dict[str, str]:
    """The probe's environment: what the engine needs, offline, and nothing of the caller's secrets."""
    env = {k: v for k, v in os.environ.items() if k in PASSED or (k.startswith("VLLM_") and "TOKEN" not in k)}
    env.setdefault("PATH", "/usr/bin:/bin")
    env.update(OFFLINE)
    return env


@dataclass
class ProbeRun:
    stdout: str
    stderr: str
    returncode: int | None
    peak_mb: int = 0  # the process group's summed resident memory at its largest
    died: str | None = None  # why the probe ended without answering for every directory, in words
    seconds: float = 0.0


def _group_rss_mb(group: int) -> int:
    """Resident memory summed over every process of GROUP (the probe and what it started)."""
    total_kb = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) != group:  # pgrp, after state and ppid
                continue
            for line in Path(entry.path, "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kb += int(line.split()[1])
                    break
        except (OSError, IndexError, ValueError):
            continue  # it ended while being read
    return total_kb // 1024


def run_probe(argv: list[str], timeout: float, max_mb: int | None = None) -> ProbeRun:
    """ARGV run in a session of its own, killed as a group past TIMEOUT seconds or MAX_MB summed."""
    bound = max_mb if max_mb is not None else memory_bound_mb()
    started = time.monotonic()
    with (
        open(os.devnull, "rb") as stdin,
        tempfile.TemporaryFile() as out,  # files, not pipes: a full pipe would stall the probe
        tempfile.TemporaryFile() as err,
        subprocess.Popen(argv, stdin=stdin, stdout=out, stderr=err, env=probe_env(), start_new_session=True) as proc,
    ):
        peak, died = 0, None
        while proc.poll() is None:
            peak = max(peak, _group_rss_mb(proc.pid))
            elapsed = time.monotonic() - started
            if peak > bound:
                died = f"stopped at its memory bound: {peak:,} MB across its processes, over {bound:,} MB"
            elif elapsed > timeout:
                died = f"stopped at its time bound: still running after {timeout:.0f} s"
            if died:
                _kill_group(proc)
                break
            time.sleep(POLL_SECONDS)
        proc.wait()
        _kill_group(proc)  # whatever it started and left behind
        out.seek(0)
        err.seek(0)
        run = ProbeRun(out.read().decode(errors="replace"), err.read().decode(errors="replace"), proc.returncode,
                       peak, died, round(time.monotonic() - started, 2))  # fmt: skip
    if run.died is None and run.returncode is not None and run.returncode < 0:
        name = signal.Signals(-run.returncode).name if -run.returncode in signal.valid_signals() else "a signal"
        killed = " (the kernel's out-of-memory killer sends SIGKILL)" if run.returncode == -signal.SIGKILL else ""
        run.died = f"killed by {name}{killed} at {run.peak_mb:,} MB"
    return run


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
