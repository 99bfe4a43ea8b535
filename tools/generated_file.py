"""The generators' common ending: write the generated file, or with --check say whether the committed
one is current (exit 1 when it is not, naming the command that regenerates it)."""

from __future__ import annotations

from pathlib import Path


def write_or_check(out: Path, text: str, check: bool, regenerate: str) -> int:
    if check:
        same = out.exists() and out.read_text() == text
        print(f"{out.name} is current" if same else f"{out.name} differs: run {regenerate}")
        return 0 if same else 1
    out.write_text(text)
    print(f"wrote {out} ({len(text):,} bytes)")
    return 0
