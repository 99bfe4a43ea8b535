"""modeldrop's archive reader against GNU tar's extraction, the reference for what SageMaker's
`tar -xzf` leaves: a committed corpus of known disagreements, and a seeded mutator of tar and gzip
headers. The rule: modeldrop never accepts an archive whose tree, as GNU tar extracts it (whatever
its exit code), differs from the tree modeldrop judged (same paths, same bytes).
"""

from __future__ import annotations

import io
import json
import os
from collections import Counter
from pathlib import Path

import pytest
from conftest import ROOT
from tar_mutator import case, gnu_tar, judge, seeds

from modeldrop.checkpoint.tar_scan import scan_tar_stream
from modeldrop.contracts.errors import CheckpointRefused

CORPUS = ROOT / "tests" / "fixtures" / "tar-corpus"
EXPECTED: dict[str, str | None] = json.loads((CORPUS / "expected.json").read_text())
# CI's budget; `make fuzz-tar` runs more.
CASES = int(os.environ.get("MODELDROP_TAR_FUZZ_CASES", "400"))
needs_gnu_tar = pytest.mark.skipif(not gnu_tar(), reason="GNU tar is the reference and is not installed")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_case_gets_its_verdict(name: str) -> None:
    data = (CORPUS / name).read_bytes()
    compressed = name.endswith(".gz")
    code = EXPECTED[name]
    if code is None:
        scan_tar_stream(io.BytesIO(data), name, compressed)
    else:
        with pytest.raises(CheckpointRefused) as refused:
            scan_tar_stream(io.BytesIO(data), name, compressed)
        assert refused.value.code == code


@needs_gnu_tar
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_case_agrees_with_gnu_tar(name: str, tmp_path: Path) -> None:
    verdict, detail = judge((CORPUS / name).read_bytes(), name.endswith(".gz"), tmp_path / "case")
    assert verdict == ("agree" if EXPECTED[name] is None else "refused"), detail


@needs_gnu_tar
def test_archives_written_by_gnu_tar_and_tarfile_in_every_format_pass(tmp_path: Path) -> None:
    import gzip

    bases = seeds(tmp_path)
    assert len(bases) == 7
    for data in bases:
        for blob, compressed in ((data, False), (gzip.compress(data), True)):
            verdict, detail = judge(blob, compressed, tmp_path / "case")
            assert verdict == "agree", detail


@needs_gnu_tar
def test_mutated_archives_are_never_judged_other_than_gnu_tar_extracts_them(tmp_path: Path) -> None:
    bases = seeds(tmp_path)
    verdicts: Counter[str] = Counter()
    wrong = []
    for seed in range(CASES):
        data, compressed = case(seed, bases)
        verdict, detail = judge(data, compressed, tmp_path / "case")
        verdicts[verdict] += 1
        if verdict == "DIFFER":
            wrong.append((seed, detail[:400]))
    assert not wrong, wrong[:5]
    assert verdicts["agree"] > CASES // 20, verdicts  # the mutator still makes archives worth comparing
