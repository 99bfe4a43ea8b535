"""Checkpoints of every size: prefixes copied by the state machine's Map, archives served as the
files they hold, archives too large for one Lambda refused at the door, and `modeldrop upload`."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from modeldrop.cli import app
from modeldrop.local.samples.checkpoint import BROKEN_DROP, write_checkpoint
from modeldrop.local.scenarios.run import run_local

STACK = "modeldrop-local"


def test_a_40_shard_prefix_is_copied_by_the_map_one_iteration_per_object(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ck", shards=40)
    files = sorted(p.name for p in checkpoint.iterdir())
    assert sum(name.endswith(".safetensors") for name in files) == 40
    result = run_local(checkpoint, prefix=True)
    assert result.status == "succeeded", (result.error, result.cause)
    assert result.leftover_resources == []
    # The Map ran one CopyShard per object of the prefix; nothing else copied anything.
    assert result.invocations["CopyShardFunction"] == len(files)
    assert "CopyShards" in [s.name for s in result.states]
    record = result.record
    assert record is not None and record.served_uri is not None and str(record.served_uri).endswith("/")
    create = record.step_dict("create_endpoint")
    assert create["model_data_source"]["S3DataSource"] == {
        "S3Uri": str(record.served_uri),
        "S3DataType": "S3Prefix",
        "CompressionType": "None",
    }
    served = {d.rsplit("/", 1)[1] for d in result.deleted_at_exit if d.startswith(str(record.served_uri))}
    assert served == set(files)


def test_a_copy_killed_midway_leaves_no_incomplete_upload_after_cleanup() -> None:
    result = run_local(fault="kill-mid-copy")
    assert result.status == "failed" and result.error == "Sandbox.Timedout", (result.error, result.cause)
    assert result.leftover_resources == []  # no served object and no open multipart upload
    record = result.record
    assert record is not None and record.failure_class == "timeout"
    assert record.step_dict("failure")["state"] == "CopyShards"
    # The killed Lambda never aborted its upload: the failure path found it and aborted it.
    deleted = record.step_dict("teardown")["deleted"]
    assert any("extra-weights.bin (upload " in d for d in deleted), deleted
    assert "ValidateFunction" not in result.invocations


def test_an_archive_over_the_stack_limit_is_refused_before_validation() -> None:
    result = run_local(fault="huge-archive")
    assert result.status == "failed" and result.error == "ArchiveTooLarge"
    assert result.cause is not None and "140.0 GB" in result.cause and "modeldrop upload" in result.cause
    assert "ValidateFunction" not in result.invocations and "CreateEndpointFunction" not in result.invocations
    assert result.leftover_resources == []


def test_the_default_archive_is_served_as_an_uncompressed_prefix() -> None:
    result = run_local()
    assert result.status == "succeeded" and result.leftover_resources == []
    record = result.record
    assert record is not None and str(record.served_uri).endswith(f"modeldrop-served/{record.deployment_id}/")
    source = record.step_dict("create_endpoint")["model_data_source"]["S3DataSource"]
    assert (source["S3DataType"], source["CompressionType"]) == ("S3Prefix", "None")
    assert "CopyShardFunction" not in result.invocations  # the validating pass wrote the files


def test_upload_puts_the_shards_then_the_marker_and_resumes(
    deployed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from modeldrop.cli import _shared
    from modeldrop.local.emulator.iam.enforcement import after_call

    stack = deployed
    checkpoint = write_checkpoint(tmp_path / "ck", shards=6)
    writes: list[str] = []
    for operation in ("PutObject", "CompleteMultipartUpload"):
        after_call("s3", operation, lambda params, _result: writes.append(params["Key"]))
    terminal = io.StringIO()
    monkeypatch.setattr(_shared, "err", Console(file=terminal, force_terminal=True, width=100))
    destination = f"s3://{stack.bucket}/runs/big/model/"
    args = ["upload", str(checkpoint), destination, "--stack", STACK, "--region", "us-east-1"]
    first = CliRunner().invoke(app, [*args, "--wait", "--json"])
    assert first.exit_code == 0, first.output
    run = json.loads(first.output.strip().splitlines()[-1])
    assert run["status"] == "succeeded" and run["execution_status"] == "SUCCEEDED", run
    assert run["deployment_id"] == run["output"]["deployment_id"]  # at the top, as run-local gives it
    assert sorted(run["upload"]["uploaded"]) == sorted(p.name for p in checkpoint.iterdir())
    # Every file went up before the marker: the deployment never saw half a prefix.
    ours = [k for k in writes if k.startswith("runs/big/model/")]
    assert ours[-1] == "runs/big/model/modeldrop.json" and len(ours) == len(list(checkpoint.iterdir())) + 1
    assert "CopyShards" in [s["name"] for s in run["states"]]

    human = CliRunner().invoke(app, args)
    assert human.exit_code == 0, human.output
    assert "uploaded 0 file(s)" in human.output and "marker unchanged" in human.output
    assert "uploading" in terminal.getvalue()  # the progress bar, on a terminal
    executions = stack.client("stepfunctions").list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    assert len(executions) == 1  # the deployment started once


def test_upload_refuses_an_invalid_checkpoint_and_uploads_nothing(deployed: Any, tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ck", drop_kv_shared=True, drop=BROKEN_DROP)
    result = CliRunner().invoke(
        app, ["upload", str(checkpoint), f"s3://{deployed.bucket}/runs/bad/", "--region", "us-east-1", "--json"]
    )
    assert result.exit_code == 1, result.output
    assert json.loads(result.output)["uploaded"] is False
    assert "Contents" not in deployed.client("s3").list_objects_v2(Bucket=deployed.bucket, Prefix="runs/bad/")


def test_a_prefix_changed_after_registration_is_refused_by_the_pinned_copy(stack: Any, tmp_path: Path) -> None:
    """A shard re-uploaded between RegisterDeployment's listing and its copy: CopySourceIfMatch fails the
    Map's iteration (PreconditionFailed), the deployment ends CheckpointUnreadable, nothing is left."""
    checkpoint = write_checkpoint(tmp_path / "ck", shards=3)
    s3 = stack.client("s3")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"direct/p/{path.name}", Body=path.read_bytes())
    shard = next(p.name for p in sorted(checkpoint.iterdir()) if p.name.endswith(".safetensors"))
    stack.after["RegisterFunction"] = lambda _event: s3.put_object(
        Bucket=stack.bucket, Key=f"direct/p/{shard}", Body=b"re-uploaded after the listing"
    )
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/p/"}), timeout=120)
    stack.settle()
    assert desc["status"] == "FAILED" and desc["error"] == "CheckpointUnreadable", desc
    assert f"{shard} changed while it was being deployed" in desc["cause"]  # the copy of that object
    assert stack.leftover_resources() == []


def test_upload_skips_what_is_there_and_sends_what_changed(stack: Any, tmp_path: Path) -> None:
    from modeldrop.aws.s3.checkpoint_upload import upload_directory

    checkpoint = write_checkpoint(tmp_path / "ck", shards=3)
    s3 = stack.client("s3")
    first = upload_directory(s3, checkpoint, stack.bucket, "runs/r/", marker=False)
    assert first.marker is None and len(first.uploaded) == len(list(checkpoint.iterdir()))
    # An interrupted run resumed: one file changed (same size, other bytes), the rest already there.
    config = checkpoint / "config.json"
    config.write_text(config.read_text().replace("gemma4", "GEMMA4"))
    second = upload_directory(s3, checkpoint, stack.bucket, "runs/r/", marker=False)
    assert second.uploaded == ["config.json"] and len(second.skipped) == len(first.uploaded) - 1
    # A file under the prefix that is not in the directory would be served with it: refused.
    s3.put_object(Bucket=stack.bucket, Key="runs/r/stale.safetensors", Body=b"x")
    from modeldrop.contracts.errors import RequestInvalid

    with pytest.raises(RequestInvalid, match=r"stale\.safetensors"):
        upload_directory(s3, checkpoint, stack.bucket, "runs/r/")


def test_a_prefix_holding_only_its_marker_is_refused_at_registration(stack: Any) -> None:
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/empty/modeldrop.json", Body=b"{}")
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/empty/"}), timeout=60)
    stack.settle()
    assert desc["status"] == "FAILED" and desc["error"] == "CheckpointUnreadable", desc
    assert "holds no model files, only its marker" in desc["cause"]
    assert "CopyShardFunction" not in [i.function for i in stack.invocations]
    assert stack.leftover_resources() == []


def test_upload_without_a_marker_has_no_deployment_to_wait_for(deployed: Any, tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ck")
    args = ["upload", str(checkpoint), f"s3://{deployed.bucket}/runs/nm/", "--stack", STACK, "--region", "us-east-1"]
    result = CliRunner().invoke(app, [*args, "--no-marker", "--wait"])
    assert result.exit_code == 2 and "no marker at" in result.output, result.output
    executions = deployed.client("stepfunctions").list_executions(stateMachineArn=deployed.state_machine_arn)
    assert executions["executions"] == []


@pytest.mark.parametrize("smuggled", ["zz/../config.json", "zz//../config.json", "./config.json", "a//b.json"])
def test_a_prefix_key_with_dot_or_empty_segments_is_refused_at_registration(
    stack: Any, tmp_path: Path, smuggled: str
) -> None:
    """SageMaker writes each key of a prefix under /opt/ml/model: `zz/../config.json` would replace the
    validated config.json on the host. Refused before any copy, model or endpoint."""
    checkpoint = write_checkpoint(tmp_path / "ck", shards=1)
    s3 = stack.client("s3")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"direct/dots/{path.name}", Body=path.read_bytes())
    s3.put_object(Bucket=stack.bucket, Key=f"direct/dots/{smuggled}", Body=b"{}")
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/dots/"}), timeout=60)
    stack.settle()
    assert desc["status"] == "FAILED" and desc["error"] == "CheckpointRefused", desc
    assert "'.', '..' or empty segments" in desc["cause"]
    called = [i.function for i in stack.invocations]
    assert "CopyShardFunction" not in called and "CreateEndpointFunction" not in called
    assert stack.leftover_resources() == []


def test_a_base_prefixs_own_adapters_folder_is_not_served(stack: Any, tmp_path: Path) -> None:
    """LMI loads every adapter under /opt/ml/model/adapters/ at start: a folder the checkpoint brought
    along is left out of the served copy (with a warning), so nothing unvalidated is loaded."""
    checkpoint = write_checkpoint(tmp_path / "ck", shards=1)
    s3 = stack.client("s3")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"direct/bundled/{path.name}", Body=path.read_bytes())
    s3.put_object(Bucket=stack.bucket, Key="direct/bundled/adapters/evil/adapter_config.json", Body=b"{}")
    desc = stack.wait(
        stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/bundled/", "engine": "lmi"}), timeout=120
    )
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    deployment_id = json.loads(desc["output"])["deployment_id"]
    served = s3.list_objects_v2(Bucket=stack.bucket, Prefix=f"modeldrop-served/{deployment_id}/")["Contents"]
    assert served and not any("/adapters/" in o["Key"] for o in served)
    # `validate` of the source says so (the pipeline judges the served copy, which has no such folder).
    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan

    (checkpoint / "adapters").mkdir()
    (checkpoint / "adapters" / "adapter_config.json").write_text("{}")
    codes = {f.code for f in validate_scan(scan_source(str(checkpoint))).findings}
    assert "ADAPTERS_FOLDER_NOT_SERVED" in codes


def test_upload_trusts_only_the_checksum_s3_computed_and_redeploys_a_changed_shard(stack: Any, tmp_path: Path) -> None:
    from modeldrop.aws.s3.checkpoint_upload import DIGEST_KEY, file_digest, upload_directory

    checkpoint = write_checkpoint(tmp_path / "ck", shards=2)
    s3 = stack.client("s3")
    first = upload_directory(s3, checkpoint, stack.bucket, "runs/trust/")
    assert first.marker is not None
    # A bucket writer replaces a shard with other bytes of the same size and copies the digest metadata.
    shard = next(p for p in sorted(checkpoint.iterdir()) if p.name.endswith(".safetensors"))
    forged = bytes(shard.stat().st_size)
    s3.put_object(
        Bucket=stack.bucket, Key=f"runs/trust/{shard.name}", Body=forged, Metadata={DIGEST_KEY: file_digest(shard)}
    )
    second = upload_directory(s3, checkpoint, stack.bucket, "runs/trust/")
    assert shard.name in second.uploaded  # S3's checksum of the forged bytes is not the file's
    assert second.marker is not None  # a file changed: the marker again, so the fixed version deploys
    third = upload_directory(s3, checkpoint, stack.bucket, "runs/trust/")
    assert third.uploaded == [] and third.marker is None  # nothing changed: no second deployment
