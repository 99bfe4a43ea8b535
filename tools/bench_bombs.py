"""Peak memory of `modeldrop validate --json` on inputs built to exhaust it, for the whole process
tree (the validator and any inflater it starts), sampled from /proc every 5 ms.

Kinds: a 32 MiB safetensors header of empty arrays in an extra field; the same with the tensor
key spelled with a JSON escape (540k tensors); 16 MiB side files (config, tokenizer config,
index) of empty arrays; a config claiming 1.5 M KV-shared layers; each as a directory and as a
.tar.gz. Usage: bench_bombs.py [--src DIR] (DIR: another checkout's src/, for a before/after).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "gemma4-text-dense"
LIMIT_MB = 256


def _tree_rss(pid: int) -> int:
    """Resident bytes of PID and every descendant."""
    total, todo = 0, [pid]
    page = os.sysconf("SC_PAGE_SIZE")
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm", "rb") as fh:
                total += int(fh.read().split()[1]) * page
            with open(f"/proc/{p}/task/{p}/children", "rb") as fh:
                todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return total


def run(path: Path, src: Path) -> tuple[int, float, float]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "modeldrop", "validate", str(path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    peak = 0
    while proc.poll() is None:
        peak = max(peak, _tree_rss(proc.pid))
        time.sleep(0.005)
    out, err = proc.communicate()
    if b"Traceback" in out + err:
        print(f"  TRACEBACK in {path.name}: {err.decode()[-400:]}")
    return proc.returncode, peak / 1e6, time.monotonic() - started


def _header(extra_bytes: int, escaped_tensors: int = 0) -> bytes:
    if escaped_tensors:
        entries = [f'"t{i}":{{"dtype":"F32","shape":[0],"data\\u005foffsets":[0,0]}}' for i in range(escaped_tensors)]
        body = "{" + ",".join(entries) + "}"
        return body.encode()
    filler = ",".join(["[]"] * (extra_bytes // 3))
    return ('{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":[' + filler + "]}}").encode()


def _shard(header: bytes, data: int = 4) -> bytes:
    return struct.pack("<Q", len(header)) + header + bytes(data)


def _pack(d: Path, archive: Path) -> None:
    with (
        open(archive, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w") as tar,
    ):
        tar.add(d, arcname=".")


def build(work: Path) -> dict[str, Path]:
    cases: dict[str, Path] = {}

    def model(name: str, files: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
        d = work / name
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(FIXTURE, d)
        for rel in drop:
            (d / rel).unlink(missing_ok=True)
        for rel, data in files.items():
            (d / rel).write_bytes(data)
        cases[name] = d
        _pack(d, work / f"{name}.tar.gz")
        cases[f"{name}.tar.gz"] = work / f"{name}.tar.gz"

    lone_shard = ("model.safetensors.index.json", *(p.name for p in FIXTURE.glob("*.safetensors")))
    empty_arrays = b'{"a": [' + b",".join([b"[]"] * (16 * 1024 * 1024 // 3 - 10)) + b"]}"
    model("header-bomb", {"model.safetensors": _shard(_header(32 * 1024 * 1024 - 200))}, lone_shard)
    model("escaped-key-bomb", {"model.safetensors": _shard(_header(0, 540_000), 0)}, lone_shard)
    config = json.loads((FIXTURE / "config.json").read_text())
    text = config.get("text_config", config)
    text.update(num_hidden_layers=1_500_000, num_kv_shared_layers=1_499_000)
    model("config-layers-bomb", {"config.json": json.dumps(config).encode()})
    model("side-file-bomb", {"config.json": empty_arrays})
    model("tokenizer-config-bomb", {"tokenizer_config.json": empty_arrays})
    model("index-bomb", {"model.safetensors.index.json": empty_arrays})
    return cases


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--src", type=Path, default=ROOT / "src")
    args = parser.parse_args()
    work = ROOT / ".bench" / "bombs"
    work.mkdir(parents=True, exist_ok=True)
    cases = build(work)
    print(f"{'case':32} {'exit':>4} {'peak MB':>8} {'seconds':>8}")
    worst = 0.0
    for name, path in cases.items():
        code, peak, seconds = run(path, args.src)
        worst = max(worst, peak)
        print(f"{name:32} {code:>4} {peak:8.0f} {seconds:8.1f}")
    print(f"worst peak: {worst:.0f} MB (bound {LIMIT_MB} MB)")
    return 0 if worst <= LIMIT_MB else 1


if __name__ == "__main__":
    sys.exit(main())
