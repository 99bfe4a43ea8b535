"""Validation and repair against the tiny Gemma-4 checkpoints transformers itself wrote.

The fixtures in tests/fixtures/ come from tests/fixtures/make_gemma4_fixtures.py (transformers'
save_pretrained). An optional tier loads the repaired checkpoint with transformers and generates;
it runs when MODELDROP_TORCH_PYTHON names a Python with torch and transformers.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import ROOT
from moto import mock_aws

from modeldrop.checkpoint.archive.artifact_scan import scan_source
from modeldrop.checkpoint.repair import INDEX, RESTORED_SHARD, repair
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.contracts.errors import RequestInvalid

FIXTURES = ROOT / "tests" / "fixtures"
TEXT, TEXT_BASE = FIXTURES / "gemma4-text-kvshared", FIXTURES / "gemma4-text-kvshared-base"
MM, MM_BASE = FIXTURES / "gemma4-mm-kvshared", FIXTURES / "gemma4-mm-kvshared-base"


def _tensors(path: Path) -> dict[str, bytes]:
    """Tensor name -> bytes, read with nothing but the safetensors layout."""
    out: dict[str, bytes] = {}
    for shard in sorted(path.glob("*.safetensors")):
        raw = shard.read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        for name, spec in header.items():
            if name != "__metadata__":
                begin, end = spec["data_offsets"]
                out[name] = raw[8 + n + begin : 8 + n + end]
    return out


def _tar(directory: Path, dest: Path) -> Path:
    with tarfile.open(dest, "w:gz") as tar:
        for p in sorted(directory.iterdir()):
            tar.add(p, arcname=p.name)
    return dest


def _errors(report: Any) -> list[str]:
    return [f.code for f in report.findings if f.severity == "error"]


def test_transformers_drops_exactly_the_kv_shared_tensors_in_both_namings() -> None:
    from modeldrop.contracts.engine_target import EngineVersion

    old = EngineVersion("vllm", "0.26.0", "image tag 0.26.0")  # 0.26-0.29 build k/v and k_norm on shared layers
    for fine, base, prefix in ((TEXT, TEXT_BASE, "model.layers."), (MM, MM_BASE, "model.language_model.layers.")):
        report = validate_scan(scan_source(str(fine)), target=old)
        expected = [f"{prefix}{layer}.self_attn.{t}.weight" for layer in (2, 3) for t in ("k_proj", "v_proj", "k_norm")]
        assert report.kv_shared.missing == expected
        # transformers saves a text-only ForConditionalGeneration with vision_config null, which vLLM refuses.
        tower = ["CONFIG_TOWER_MISSING"] if fine == MM else []
        assert [f.code for f in report.findings] == ["KV_SHARED_TENSORS_MISSING", *tower]
        assert set(_tensors(base)) - set(_tensors(fine)) == set(expected)
        assert _errors(validate_scan(scan_source(str(base)))) == tower
    dense = validate_scan(scan_source(str(FIXTURES / "gemma4-text-dense")))
    assert dense.deployable and dense.kv_shared.expected_tensors == 0


def test_validate_against_a_base_lists_what_is_missing_whatever_the_architecture() -> None:
    report = validate_scan(scan_source(str(TEXT)), scan_source(str(TEXT_BASE)))
    assert report.base is not None and len(report.base.missing) == 6 and report.base.missing_bytes == 4160
    codes = [f.code for f in report.findings]
    assert "BASE_TENSORS_MISSING" in codes
    hint = next(f.hint for f in report.findings if f.code == "BASE_TENSORS_MISSING")
    assert hint == f"modeldrop repair {TEXT} --base {TEXT_BASE} --out DEST"
    wrong = validate_scan(scan_source(str(TEXT)), scan_source(str(MM_BASE)))
    assert [f.code for f in wrong.findings if f.code.startswith("BASE")] == ["BASE_MISMATCH"]


def test_repair_directory_restores_base_bytes_and_validates(tmp_path: Path) -> None:
    out = tmp_path / "fixed"
    before = {p.name: p.read_bytes() for p in TEXT.iterdir()}
    result = repair(str(TEXT), str(TEXT_BASE), str(out))
    assert result.report.deployable and len(result.restored) == 6
    fixed, base = _tensors(out), _tensors(TEXT_BASE)
    assert all(fixed[n] == base[n] for n in result.restored)
    assert fixed.keys() == base.keys()
    index = json.loads((out / INDEX).read_text())
    assert {index["weight_map"][n] for n in result.restored} == {RESTORED_SHARD}
    assert index["weight_map"]["model.embed_tokens.weight"] == "model.safetensors"
    assert index["metadata"]["total_size"] == sum(len(v) for v in fixed.values())
    assert {p.name: p.read_bytes() for p in TEXT.iterdir()} == before  # the source is untouched
    with pytest.raises(RequestInvalid, match="exists and is not empty"):
        repair(str(TEXT), str(TEXT_BASE), str(out))
    with pytest.raises(RequestInvalid, match="nothing to repair"):
        repair(str(TEXT_BASE), str(TEXT_BASE), str(tmp_path / "again"))
    with pytest.raises(RequestInvalid, match="does not look like the base"):
        repair(str(TEXT), str(MM_BASE), str(tmp_path / "wrong"))
    with pytest.raises(RequestInvalid, match="cannot write a directory source as a archive"):
        repair(str(TEXT), str(TEXT_BASE), str(tmp_path / "x.tar.gz"))


def test_repair_archive_streams_into_a_new_archive(tmp_path: Path) -> None:
    fine = _tar(MM, tmp_path / "fine.tar.gz")
    base = _tar(MM_BASE, tmp_path / "base.tar.gz")
    out = tmp_path / "fixed.tar.gz"
    result = repair(str(fine), str(base), str(out))
    assert _errors(result.report) == ["CONFIG_TOWER_MISSING"] and result.report.format == "tar.gz"  # MM: no tower
    extracted = tmp_path / "extracted"
    with tarfile.open(out) as tar:
        names = tar.getnames()
        tar.extractall(extracted, filter="data")
    assert names.count(INDEX) == 1 and RESTORED_SHARD in names
    assert _tensors(extracted) == _tensors(MM_BASE)


def test_repair_s3_prefix_and_s3_archive(tmp_path: Path) -> None:
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="art")
        for directory, prefix in ((TEXT, "runs/ft/"), (TEXT_BASE, "bases/e2b/")):
            for p in directory.iterdir():
                s3.put_object(Bucket="art", Key=prefix + p.name, Body=p.read_bytes())
        result = repair("s3://art/runs/ft/", "s3://art/bases/e2b/", "s3://art/runs/ft-repaired/", s3)
        assert result.report.deployable and result.report.format == "s3-prefix"
        listed = {o["Key"] for o in s3.list_objects_v2(Bucket="art", Prefix="runs/ft-repaired/")["Contents"]}
        assert {f"runs/ft-repaired/{n}" for n in (RESTORED_SHARD, INDEX, "model.safetensors", "config.json")} <= listed
        original = {o["Key"] for o in s3.list_objects_v2(Bucket="art", Prefix="runs/ft/")["Contents"]}
        assert f"runs/ft/{RESTORED_SHARD}" not in original  # the source prefix is untouched
        with pytest.raises(RequestInvalid, match="inside the source prefix"):
            repair("s3://art/runs/ft/", "s3://art/bases/e2b/", "s3://art/runs/ft/fixed/", s3)
        with pytest.raises(RequestInvalid, match="already holds objects"):
            repair("s3://art/runs/ft/", "s3://art/bases/e2b/", "s3://art/runs/ft-repaired/", s3)
        s3.upload_file(str(_tar(MM, tmp_path / "m.tar.gz")), "art", "mm/model.tar.gz")
        s3.upload_file(str(_tar(MM_BASE, tmp_path / "b.tar.gz")), "art", "mm-base/model.tar.gz")
        archived = repair("s3://art/mm/model.tar.gz", "s3://art/mm-base/model.tar.gz", "s3://art/mm2/model.tar.gz", s3)
        assert _errors(archived.report) == ["CONFIG_TOWER_MISSING"] and len(archived.restored) == 6


def test_repair_command_exit_codes(tmp_path: Path) -> None:
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "modeldrop", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
        )

    ok = run("repair", str(TEXT), "--base", str(TEXT_BASE), "--out", str(tmp_path / "o"), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["report"]["deployable"] is True
    refused = run("validate", str(TEXT), "--base", str(TEXT_BASE), "--json")
    assert refused.returncode == 1 and json.loads(refused.stdout)["base"]["missing_bytes"] == 4160
    bad = run("repair", str(TEXT), "--base", str(MM_BASE), "--out", str(tmp_path / "p"))
    assert bad.returncode == 2 and "does not look like the base" in bad.stderr and "Traceback" not in bad.stderr


TORCH_PYTHON = os.environ.get("MODELDROP_TORCH_PYTHON")


@pytest.mark.skipif(not TORCH_PYTHON, reason="set MODELDROP_TORCH_PYTHON to a Python with torch + transformers")
def test_repaired_checkpoint_loads_and_generates_with_transformers(tmp_path: Path) -> None:
    results: dict[str, Any] = {}
    for fine, base in ((TEXT, TEXT_BASE), (MM, MM_BASE)):
        out = tmp_path / fine.name
        repair(str(fine), str(base), str(out))
        done = subprocess.run(
            [str(TORCH_PYTHON), str(FIXTURES / "load_and_generate.py"), str(out)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        results[fine.name] = json.loads(done.stdout.strip().splitlines()[-1])
    for name, result in results.items():
        # Loads with nothing missing and generates; transformers ignores the restored KV-shared tensors.
        assert result["new_tokens"] == 5 and result["missing"] == [], (name, result)
    shutil.rmtree(tmp_path, ignore_errors=True)
