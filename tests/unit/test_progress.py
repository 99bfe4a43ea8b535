"""Progress reports from long byte work: inflating (both inflaters), packing, counting from threads."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from modeldrop.checkpoint.archive import tar_scan
from modeldrop.checkpoint.archive.artifact_scan import scan_local
from modeldrop.contracts import progress
from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz


def _weights_like(tmp_path: Path, mib: int) -> Path:
    d = write_checkpoint(tmp_path / "c")
    (d / "extra-weights.bin").write_bytes(os.urandom(mib << 20))  # gzip saves nothing: the parallel path
    return d


def test_inflating_reports_compressed_bytes_up_to_the_file_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = _weights_like(tmp_path, 24)
    packed = write_tar_gz(d, tmp_path / "model.tar.gz")
    size = packed.stat().st_size
    for parallel in (True, False):
        if not parallel:
            monkeypatch.setattr(tar_scan, "_scan_with_rapidgzip", lambda path: None)
        seen: list[tuple[int, int | None]] = []
        with progress.listening(lambda done, total, seen=seen: seen.append((done, total))):
            scan_local(str(packed))
        assert len(seen) >= 2, (parallel, seen)
        assert all(total == size for _done, total in seen), seen
        assert [done for done, _t in seen] == sorted(done for done, _t in seen)  # never backwards
        assert seen[-1][0] >= size * 0.9


def test_packing_reports_the_bytes_read_and_nobody_listening_costs_nothing(tmp_path: Path) -> None:
    d = _weights_like(tmp_path, 4)
    total = sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    seen: list[int] = []
    with progress.listening(lambda done, _total: seen.append(done)):
        write_tar_gz(d, tmp_path / "a.tar.gz")
    assert seen and seen[-1] == total
    write_tar_gz(d, tmp_path / "b.tar.gz")  # no listener: no error, same archive
    assert (tmp_path / "b.tar.gz").stat().st_size > 0


def test_a_counter_sums_from_other_threads_into_the_callers_listener() -> None:
    seen: list[int] = []
    with progress.listening(lambda done, _total: seen.append(done)):
        add = progress.counter(4000)
    workers = [threading.Thread(target=lambda: [add(1) for _ in range(1000)]) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert max(seen) == 4000 and len(seen) == 4000
