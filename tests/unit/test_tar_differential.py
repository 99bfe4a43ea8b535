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

from modeldrop.checkpoint.archive.tar_scan import scan_tar_stream
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
    assert len(bases) >= 7
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


@needs_gnu_tar
@pytest.mark.parametrize("frame", range(9))
@pytest.mark.parametrize("key", [b"path", b"size", b"GNU.sparse.name"])
def test_pax_framings_are_judged_as_gnu_tar_extracts_them(tmp_path: Path, frame: int, key: bytes) -> None:
    """The issue's smuggling: two blanks before `path=` made GNU tar overwrite model.safetensors while
    modeldrop read an unknown keyword ` path`. Every framing either agrees with GNU tar or is refused."""
    from tar_mutator import member, pax_framed

    value = b"model.safetensors" if key != b"size" else b"3"
    data = pax_framed(key, value, frame) + member(b"model.safetensors", b"corrupt") + bytes(1024)
    base = seeds(tmp_path)[0]
    blob = base[: end_of_archive_of(base)] + data
    verdict, detail = judge(blob, False, tmp_path / "case")
    assert verdict in ("agree", "refused"), detail
    if frame in (0, 1, 2, 3, 7):
        assert verdict == "refused" and ("TAR_PAX_WHITESPACE" in detail or "TAR_PAX_INVALID" in detail), detail


def end_of_archive_of(data: bytes) -> int:
    from tar_mutator import end_of_archive

    return end_of_archive(data)


@needs_gnu_tar
def test_archives_written_by_bsdtar_and_pigz_agree_with_gnu_tar(tmp_path: Path) -> None:
    import shutil
    import subprocess

    if not (shutil.which("bsdtar") and shutil.which("pigz")):
        pytest.skip("bsdtar and pigz are installed by .ci/run (libarchive-tools, pigz)")
    bases = seeds(tmp_path)
    assert len(bases) >= 11, "bsdtar's five formats join GNU tar's four and tarfile's three"
    for data in bases:
        for flags in ([], ["-1"], ["-9"], ["-11"], ["--rsyncable"], ["-i"], ["-b", "32"], ["-N"], ["-T"]):
            gz = subprocess.run(["pigz", "-c", *flags], input=data, capture_output=True, check=True).stdout
            verdict, detail = judge(gz, True, tmp_path / "case")
            assert verdict == "agree", (flags, detail)


def test_negative_base256_mtime_as_gnu_tar_writes_it_is_accepted(tmp_path: Path) -> None:
    """GNU tar and tarfile write dates before 1970 in base-256 with the sign bit: a real archive."""
    import tarfile

    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    os.utime(model / "config.json", (-86400 * 365 * 10**5, -86400 * 365 * 10**5))  # far before 1970
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        tar.add(model / "config.json", arcname="config.json")
    assert b"\xff" in buf.getvalue()[136:148]
    scan_tar_stream(io.BytesIO(buf.getvalue()), "old.tar", False)


@pytest.mark.parametrize(
    ("records", "code"),
    [
        ([(b"path", b"/".join([b"a"] * 3000))], "TAR_NAME_TOO_LONG"),  # 5,999 bytes: past PATH_MAX
        ([(b"path", b"d" * 256)], "TAR_NAME_TOO_LONG"),  # one part past NAME_MAX
        ([(b"comment", b"")] * 257, "TAR_LONG_RECORD"),  # more records than any writer makes
        ([(b"mtime", b"12x")], "TAR_PAX_INVALID"),  # GNU tar: "Malformed extended header: invalid mtime"
        ([(b"uid", b"4294967296")], "TAR_PAX_INVALID"),  # past uid_t: GNU tar reports it and exits 2
        ([(b"size", b"-1")], "TAR_PAX_INVALID"),
    ],
)
def test_pax_values_and_names_gnu_tar_cannot_use_are_refused_before_any_path_work(
    records: list[tuple[bytes, bytes]], code: str
) -> None:
    from tar_mutator import member, pax

    data = pax(records) + member(b"config.json", b"{}") + bytes(1024)
    with pytest.raises(CheckpointRefused) as refused:
        scan_tar_stream(io.BytesIO(data), "bounds.tar", False)
    assert refused.value.code == code


def test_pax_records_in_total_are_bounded_per_archive() -> None:
    from tar_mutator import member, pax

    header = pax([(b"comment", b"x" * 60_000)])
    data = b"".join(header + member(b"f%03d" % i, b"") for i in range(150)) + bytes(1024)
    with pytest.raises(CheckpointRefused) as refused:
        scan_tar_stream(io.BytesIO(data), "many.tar", False)
    assert refused.value.code == "TAR_LONG_RECORD" and "8388608" in refused.value.message


def test_valid_pax_times_and_a_nul_padded_header_are_read_as_both_readers_read_them() -> None:
    from tar_mutator import _framed, member

    body = _framed(b" mtime=-1234567890.123456\n") + b"\x00" * 20  # tarfile and GNU tar stop at the NUL
    data = member(b"PaxHeader", body, b"x") + member(b"config.json", b"{}") + bytes(1024)
    scan = scan_tar_stream(io.BytesIO(data), "ok.tar", False)
    assert list(scan.files) == ["config.json"]
