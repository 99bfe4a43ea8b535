"""`modeldrop run-local DIR` on a generated multi-GB checkpoint directory: wall time and peak RSS
(`make bench-run-local`, default 2 GB; cached in .bench/). Target (issue #16): succeeds, RSS <= 1 GB.

The directory is one bf16-like shard (random mantissas, a narrow exponent band) plus the sample's
tokenizer files and a Llama config, so validation, packing, the emulated S3, the hosting's
extraction and the smoke eval all see real sizes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from bench_validate import BENCH, ROW, bf16_block, shard_header  # noqa: E402

GB = 1000**3


def generate(directory: Path, total: int) -> None:
    from modeldrop.local.samples.checkpoint import write_checkpoint

    small = write_checkpoint(BENCH / "small-files")
    tmp = directory.with_suffix(".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (small / name).exists():
            shutil.copy(small / name, tmp / name)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "torch_dtype": "bfloat16",
    }
    (tmp / "config.json").write_text(json.dumps(config))
    data = total // ROW * ROW
    block = bf16_block()
    with (tmp / "model.safetensors").open("wb") as fh:
        fh.write(shard_header(0, data, 4))
        left = data
        while left:
            n = min(left, len(block))
            fh.write(block[:n])
            left -= n
    tmp.rename(directory)


def main(gb: float) -> int:
    directory = BENCH / f"run-local-{gb:g}GB"
    if not directory.exists():
        started = time.perf_counter()
        generate(directory, int(gb * GB))
        print(f"  (generated {directory.name} in {time.perf_counter() - started:.1f}s)", file=sys.stderr)
    started = time.perf_counter()
    with open(os.devnull, "wb") as null:
        proc = subprocess.Popen(
            [sys.executable, "-m", "modeldrop", "run-local", str(directory), "--json"],
            stdout=subprocess.PIPE,
            stderr=null,
            cwd=ROOT,
        )
        out = proc.stdout.read() if proc.stdout else b""
        _pid, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    rss = usage.ru_maxrss // 1024
    result = json.loads(out or b"{}")
    ok = result.get("status") == "succeeded" and result.get("leftover_resources") == [] and rss <= 1024
    print(f"{'size':>6} {'status':>10} {'wall':>8} {'peak RSS':>9}  leftover")
    print(f"{gb:>5g}G {result.get('status', '?'):>10} {seconds:>7.1f}s {rss:>6} MB  {result.get('leftover_resources')}")
    if result.get("error"):
        print(f"  {result['error']}: {result.get('cause')}")
    print(
        "target: succeeds with peak RSS <= 1 GB ->",
        "met" if ok and os.waitstatus_to_exitcode(status) == 0 else "NOT met",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 2.0))
