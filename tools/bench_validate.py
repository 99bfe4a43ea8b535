"""Validation throughput and memory on large generated .tar.gz checkpoints (`make bench`).

For each size (GB, default 0.5 2 4) a checkpoint of bf16-like shards is generated once under
.bench/ (random mantissas, exponents in a narrow band: gzip shrinks it about as little as real
weights). Then, on the same file:
  - `gzip -dc FILE > /dev/null`: the baseline;
  - `modeldrop validate FILE --json` in a fresh process: wall time, and the peak RSS of that process
    plus that of its parallel inflater (a child process), summed: an upper bound of the pair's;
  - the same with the stdlib inflater forced, to show what rapidgzip / python-isal buy.
Results are printed as throughput, the ratio to gzip -dc, and peak RSS. Targets (issue #3):
validate >= 2.5x faster than gzip -dc; peak RSS <= 128 MB and flat across sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / ".bench"
GB = 1000**3
SHARD_BYTES = 1024**3
ROW = 4096 * 2  # one bf16 row of 4096 values

STDLIB = (
    "import gzip, sys, modeldrop.checkpoint.archive.artifact_scan as a;"
    "a.decompressor = lambda raw, c: gzip.GzipFile(fileobj=raw, mode='rb') if c else raw;"
    "a._scan_with_rapidgzip = lambda path: None;"
    "from modeldrop.cli import main; sys.argv = ['modeldrop'] + sys.argv[1:]; main()"
)


# Two kinds of data, since the inflater's memory depends on them: `bf16` (one tensor per shard,
# gzip saves ~8 %, like freshly trained weights) and `bf16-20` (hundreds of tensors per shard,
# gzip saves ~20 %, like fine-tunes with many small or low-entropy tensors).
KINDS = {"bf16": (20, 0xFF, 1), "bf16-20": (6, 0x7F, 300)}


def bf16_block(size: int = 4 * 1024 * 1024, exponents: int = 20, mantissa: int = 0xFF) -> bytes:
    block = bytearray(os.urandom(size))
    # Little-endian bf16: the high byte holds sign + 7 exponent bits; a narrow band of exponents
    # (and, for bf16-20, a constant top mantissa bit) sets how much gzip can save.
    table = bytes((0x36 + (b % exponents)) | (b & 0x80) for b in range(256))
    block[1::2] = bytes(block[1::2]).translate(table)
    if mantissa != 0xFF:
        block[0::2] = bytes(b & mantissa for b in block[0::2])
    return bytes(block)


class _Stream:
    """`size` bytes of bf16-like data, produced on demand."""

    def __init__(self, prefix: bytes, size: int, block: bytes) -> None:
        self.prefix, self.remaining, self.block, self.offset = prefix, size, block, 0

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            n = len(self.prefix) + self.remaining
        out = bytearray(self.prefix[:n])
        self.prefix = self.prefix[len(out) :]
        want = min(n - len(out), self.remaining)
        self.remaining -= want
        while want:
            take = min(want, len(self.block) - self.offset)
            out += self.block[self.offset : self.offset + take]
            self.offset = (self.offset + take) % len(self.block)
            want -= take
        return bytes(out)


def shard_header(index: int, data_bytes: int, tensors: int = 1) -> bytes:
    rows = data_bytes // ROW
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    per, offset = rows // tensors, 0
    for t in range(tensors):
        n = per if t < tensors - 1 else rows - per * (tensors - 1)
        header[f"model.layers.{index}.block.{t}.weight"] = {
            "dtype": "BF16",
            "shape": [n, 4096],
            "data_offsets": [offset, offset + n * ROW],
        }
        offset += n * ROW
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def generate(path: Path, total: int, kind: str = "bf16") -> None:
    from isal import igzip

    from modeldrop.local.samples.checkpoint import write_checkpoint

    small = write_checkpoint(BENCH / "small-files")
    shards = max(1, -(-total // SHARD_BYTES))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": shards,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
    }
    (small / "config.json").write_text(json.dumps(config))
    exponents, mantissa, tensors = KINDS[kind]
    block = bf16_block(exponents=exponents, mantissa=mantissa)
    per = (total // shards) // ROW * ROW
    tmp = path.with_suffix(".partial")
    with (
        tmp.open("wb") as raw,
        igzip.IGzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            tar.add(small / name, arcname=name)
        weight_map = {}
        for i in range(shards):
            name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            head = shard_header(i, per, tensors)
            info = tarfile.TarInfo(name)
            info.size = len(head) + per
            tar.addfile(info, _Stream(head, per, block))  # type: ignore[arg-type]
            weight_map.update({f"model.layers.{i}.block.{t}.weight": name for t in range(tensors)})
        index = json.dumps({"metadata": {}, "weight_map": weight_map}).encode()
        info = tarfile.TarInfo("model.safetensors.index.json")
        info.size = len(index)
        tar.addfile(info, _BytesIO(index))
    tmp.rename(path)


class _BytesIO:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, n: int = -1) -> bytes:
        out, self.data = (self.data, b"") if n < 0 else (self.data[:n], self.data[n:])
        return out


# Runs the CLI and, as it exits, writes its own peak RSS plus its largest child's to argv[1]
# (wait4 alone gives the larger of the two, not what both held at once).
MEASURED = (
    "import atexit, resource, sys;"
    "out = sys.argv.pop(1);"
    "peak = lambda who: resource.getrusage(who).ru_maxrss;"
    "atexit.register(lambda: open(out, 'w').write(str(peak(resource.RUSAGE_SELF) + peak(resource.RUSAGE_CHILDREN))));"
    "from modeldrop.cli import main; sys.argv = ['modeldrop'] + sys.argv[1:]; main()"
)


def run(cmd: list[str], stdout: IO[bytes] | int) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in MB of that process, exit code)."""
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=stdout, stderr=subprocess.DEVNULL, cwd=ROOT)
    _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    return seconds, usage.ru_maxrss // 1024, os.waitstatus_to_exitcode(status)


def run_validate(path: Path, stdout: IO[bytes] | int) -> tuple[float, int, int]:
    """`modeldrop validate PATH --json`: (wall seconds, its peak RSS plus its inflater's in MB, exit code)."""
    peak_file = BENCH / "validate-peak-kb"
    seconds, _rss, code = run([sys.executable, "-c", MEASURED, str(peak_file), "validate", str(path), "--json"], stdout)
    return seconds, int(peak_file.read_text()) // 1024, code


def main(sizes: list[float]) -> int:
    BENCH.mkdir(exist_ok=True)
    heads = (("kind", 8), ("size", 8), ("file MB", 8), ("gzip -dc", 10), ("validate", 10), ("ratio", 7))
    heads += (("GB/s", 6), ("RSS MB", 7))
    print(" ".join(f"{h:>{w}}" for h, w in heads) + "   stdlib inflate")
    ok = True
    for kind in KINDS:
        for gb in sizes:
            path = BENCH / f"ckpt-{kind}-{gb:g}GB.tar.gz"
            if not path.exists():
                t = time.perf_counter()
                generate(path, int(gb * GB), kind)
                print(f"  (generated {path.name} in {time.perf_counter() - t:.1f}s)", file=sys.stderr)
            size_mb = path.stat().st_size / 1e6
            with open(os.devnull, "wb") as null:
                gzip_s, _, _ = run(["gzip", "-dc", str(path)], null)
                val_s, rss, code = run_validate(path, null)
                std_s, std_rss, _ = run([sys.executable, "-c", STDLIB, "validate", str(path), "--json"], null)
            ratio = gzip_s / val_s
            ok = ok and code == 0 and ratio >= 2.5 and rss <= 128
            print(
                f"{kind:>8} {gb:>6g}GB {size_mb:>8.0f} {gzip_s:>9.2f}s {val_s:>9.2f}s {ratio:>6.2f}x {gb / val_s:>6.2f}"
                f" {rss:>7}   {std_s:.2f}s ({gzip_s / std_s:.2f}x, {std_rss} MB)"
                + ("" if code == 0 else f"  [validate exit {code}]")
            )
    print("targets: ratio >= 2.5x, RSS <= 128 MB and flat ->", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main([float(a) for a in sys.argv[1:]] or [0.5, 2.0, 4.0]))
