"""Differential test of the header parser against the reference implementation (`safetensors`).

The rule: modeldrop never accepts a file the reference refuses; it refuses one the reference
accepts only by a documented stricter rule (its own finding code); it never raises anything but
HeaderError. Cases: a committed regression corpus plus a seeded mutator (tests/unit/header_mutator.py).
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT
from header_mutator import cases

from modeldrop.checkpoint.headers import header_json
from modeldrop.checkpoint.headers.safetensors_header import HeaderError, parse_header, read_header_length

safetensors = pytest.importorskip("safetensors")

STRICTER = {"HEADER_DUPLICATE_KEY", "HEADER_TOO_LARGE"}  # documented in the README
CORPUS = ROOT / "tests" / "fixtures" / "safetensors_headers.jsonl"
MUTATED_CASES = int(os.environ.get("MODELDROP_HEADER_CASES", "3000"))


def reference_accepts(blob: bytes, directory: str) -> bool:
    path = Path(directory) / "case.safetensors"
    path.write_bytes(blob)
    try:
        with safetensors.safe_open(str(path), framework="numpy") as handle:
            for key in handle.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                handle.get_slice(key).get_shape()
    except Exception:
        return False
    return True


def ours(blob: bytes) -> str | None:
    """None when modeldrop accepts the file, else the finding code (only HeaderError may escape)."""
    try:
        n = read_header_length(blob[:8], len(blob))
        parse_header(blob[8 : 8 + n], len(blob))
    except HeaderError as exc:
        return exc.code
    return None


def judge(blobs: list[bytes]) -> Counter[str]:
    tally: Counter[str] = Counter()
    disagreements = []
    with tempfile.TemporaryDirectory() as directory:
        for blob in blobs:
            ref = reference_accepts(blob, directory)
            code = ours(blob)  # anything but HeaderError fails the test right here
            if ref and code is None:
                tally["both accept"] += 1
            elif not ref and code is not None:
                tally["both refuse"] += 1
            elif ref and code in STRICTER:
                tally[f"stricter: {code}"] += 1
            else:
                disagreements.append((ref, code, blob[:300]))
    assert disagreements == [], disagreements[:5]
    return tally


def test_the_regression_corpus_agrees_with_the_reference() -> None:
    blobs = [base64.b64decode(json.loads(line)["file"]) for line in CORPUS.read_text().splitlines() if line]
    tally = judge(blobs)
    assert tally["both refuse"] >= 10 and tally["both accept"] >= 5, tally


@pytest.mark.parametrize("parser", ["msgspec", "stdlib"])
def test_mutated_headers_agree_with_the_reference(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Both fast parsers: msgspec (the dependency) and the standard library's (its fallback)."""
    if parser == "stdlib":
        monkeypatch.setattr(header_json, "_msgspec_decode", None)
    tally = judge(cases(seed=20261201, count=MUTATED_CASES))
    print(dict(tally))
    # The mutator must reach both sides of the line, or the test proves little.
    assert tally["both refuse"] > MUTATED_CASES // 4 and tally["both accept"] > MUTATED_CASES // 10, tally


def test_the_dtype_table_is_the_references() -> None:
    """The reference's error for an unknown dtype lists every variant it knows."""
    from modeldrop.checkpoint.headers.safetensors_header import DTYPE_BITS

    header = b'{"a":{"dtype":"NOPE","shape":[],"data_offsets":[0,0]}}'
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.safetensors"
        path.write_bytes(len(header).to_bytes(8, "little") + header)
        with pytest.raises(Exception) as info:
            safetensors.safe_open(str(path), framework="numpy")
    listed = set(str(info.value).split("expected one of ", 1)[1].replace("`", "").replace(" ", "").split(",")[:64])
    listed = {name.split("at")[0] for name in listed}
    assert set(DTYPE_BITS) == listed, set(DTYPE_BITS) ^ listed
