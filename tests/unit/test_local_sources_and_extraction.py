"""Hugging Face cache directories as sources, and extraction by the validator's own member rules."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT
from hostile_archives import builders

from modeldrop.checkpoint.archive.archive_rules import ARCHIVE_RULES
from modeldrop.checkpoint.archive.artifact_scan import extract_archive, scan_local
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable

FIXTURE = ROOT / "tests" / "fixtures" / "gemma4-text-dense"


def hf_cache(tmp_path: Path) -> Path:
    """The layout huggingface_hub's snapshot_download leaves: snapshot files are links into blobs/."""
    repo = tmp_path / "hub" / "models--org--tiny"
    blobs, snapshot = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in FIXTURE.iterdir():
        blob = blobs / hashlib.sha256(file.read_bytes()).hexdigest()
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


def test_a_hugging_face_cache_snapshot_validates(tmp_path: Path) -> None:
    snapshot = hf_cache(tmp_path)
    assert all(p.is_symlink() for p in snapshot.iterdir())
    report = validate_scan(scan_local(str(snapshot)))
    assert report.deployable and report.tensor_count == validate_scan(scan_local(str(FIXTURE))).tensor_count


@pytest.mark.parametrize("target", ["/etc/hostname", "../../..", "outside.bin"])
def test_a_link_out_of_the_cache_or_to_a_directory_is_refused(tmp_path: Path, target: str) -> None:
    snapshot = hf_cache(tmp_path)
    (tmp_path / "outside.bin").write_bytes(b"x")
    link_target = str(tmp_path / "outside.bin") if target == "outside.bin" else target
    (snapshot / "extra.json").symlink_to(link_target)
    with pytest.raises(CheckpointRefused, match="symlink") as refused:
        scan_local(str(snapshot))
    assert refused.value.code == "DIRECTORY_LINK_OUTSIDE"


def test_a_plain_directory_still_refuses_links_out(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(FIXTURE, model)
    (model / "x.json").symlink_to("/etc/hostname")
    with pytest.raises(CheckpointRefused, match="symlink"):
        scan_local(str(model))
    (model / "x.json").unlink()
    (model / "y.json").symlink_to("config.json")  # inside the directory itself: followed
    assert validate_scan(scan_local(str(model))).deployable


def test_extraction_matches_tar_on_a_good_archive(tmp_path: Path) -> None:
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(FIXTURE, arcname=".")
    extract_archive(archive, tmp_path / "out")
    for file in FIXTURE.iterdir():
        assert (tmp_path / "out" / file.name).read_bytes() == file.read_bytes()


@pytest.mark.parametrize(
    "name", [n for n, (_b, exit_code, code) in builders(FIXTURE).items() if exit_code == 2 or code in ARCHIVE_RULES]
)
def test_extraction_refuses_what_validation_refuses_and_writes_nothing_outside(tmp_path: Path, name: str) -> None:
    build, _exit, _code = builders(FIXTURE)[name]
    archive = build(tmp_path / "model.tar.gz")
    box = tmp_path / "box"
    before = set(tmp_path.rglob("*"))
    if name == "oversized config.json":
        extract_archive(archive, box / "model")  # extraction has no size rule; validation refuses it
        return
    with pytest.raises((CheckpointUnreadable, CheckpointRefused)):
        extract_archive(archive, box / "model")
    created = {p for p in set(tmp_path.rglob("*")) - before if not p.is_relative_to(box)}
    assert created == set(), created
