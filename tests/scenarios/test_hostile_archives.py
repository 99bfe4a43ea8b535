"""Hostile archives through `modeldrop validate`, as a user (or the hidden corpus) runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "tests" / "unit"))
from hostile_archives import builders

FIXTURE = ROOT / "tests" / "fixtures" / "gemma4-text-dense"
CASES = builders(FIXTURE)


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_archive_gets_a_clear_verdict_and_no_traceback(name: str, tmp_path: Path) -> None:
    build, expected, code = CASES[name]
    path = build(tmp_path / "model.tar.gz")
    for mode in (["--json"], []):
        run = subprocess.run(
            [sys.executable, "-m", "modeldrop", "validate", str(path), *mode],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
        assert run.returncode == expected, (name, mode, run.returncode, run.stdout[-1500:], run.stderr[-1500:])
        if mode:
            report = json.loads(run.stdout)
            assert report["deployable"] is (expected == 0), report
            if code is not None:
                assert code in {f["code"] for f in report["findings"]}, report
