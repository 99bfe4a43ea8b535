"""Header parsing time against the reference parser (`make bench`).

For several kinds of header (many plain tensors, a big metadata map, escaped non-ASCII names,
pretty-printed JSON, shapes with zero dims, which take the per-entry checks), time modeldrop's
`parse_header` and the reference (`safetensors.safe_open`, then every key) on the same file,
alternating, and report the median of the per-round ratios. Target (issue #13): <= 2x.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from modeldrop.checkpoint.headers.safetensors_header import parse_header, read_header_length

ROUNDS = 7


def header(kind: str, n: int) -> tuple[dict[str, object], int]:
    entries: dict[str, object] = {}
    offset = 0

    def add(name: str, dtype: str, shape: list[int], nbytes: int) -> None:
        nonlocal offset
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes

    if kind == "metadata":
        entries["__metadata__"] = {f"key.{i}": "v" * 100 for i in range(n)}
        add("w", "F32", [1], 4)
        return entries, offset
    entries["__metadata__"] = {"format": "pt"}
    for i in range(n):
        layer = f"model.layers.{i // 10}"
        if kind == "escaped":
            add(f"{layer}.\u00e9\u4e2d.{i % 10}.weight", "BF16", [2, 4], 16)
        elif kind == "zero-dims" and i % 2:
            add(f"{layer}.empty.{i % 10}", "F32", [0, 4], 0)
        else:
            add(f"{layer}.mlp.proj_{i % 10}.weight", "BF16", [2, 4], 16)
    return entries, offset


def encode(kind: str, entries: dict[str, object]) -> bytes:
    if kind == "pretty":
        return json.dumps(entries, indent=2).encode()
    if kind == "escaped":
        return json.dumps(entries, ensure_ascii=True, separators=(",", ":")).encode()
    return json.dumps(entries, separators=(",", ":")).encode()


def best(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def main() -> int:
    import safetensors

    cases = [("plain", 1_000), ("plain", 90_000), ("metadata", 50_000), ("escaped", 90_000), ("pretty", 90_000)]
    cases.append(("zero-dims", 90_000))
    print(f"{'header':>10} {'tensors':>8} {'MB':>6} {'modeldrop':>10} {'reference':>10} {'ratio':>6}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.safetensors"
        for kind, n in cases:
            entries, data = header(kind, n)
            raw = encode(kind, entries)
            raw += b" " * (-len(raw) % 8)
            blob = len(raw).to_bytes(8, "little") + raw + b"\0" * data
            path.write_bytes(blob)
            head = blob[8 : 8 + read_header_length(blob[:8], len(blob))]

            def reference() -> None:
                with safetensors.safe_open(str(path), framework="numpy") as handle:
                    for _ in handle.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                        pass

            ours, ref = [], []
            for _ in range(ROUNDS):
                ours.append(best(lambda: parse_header(head, len(blob))))  # noqa: B023 - called at once
                ref.append(best(reference))
            ratio = statistics.median(a / b for a, b in zip(ours, ref, strict=True))
            worst = max(worst, ratio)
            print(
                f"{kind:>10} {n:>8} {len(raw) / 1e6:>6.1f} {statistics.median(ours) * 1000:>8.1f}ms"
                f" {statistics.median(ref) * 1000:>8.1f}ms {ratio:>5.2f}x"
            )
    print("target: header parse <= 2x the reference ->", "met" if worst <= 2 else "NOT met")
    return 0 if worst <= 2 else 1


if __name__ == "__main__":
    sys.exit(main())
