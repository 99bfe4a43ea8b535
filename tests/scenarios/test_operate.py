"""The operate commands against the emulated stack, found through a (moto) CloudFormation stack's outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, create_endpoint, subscribe
from typer.testing import CliRunner

from modeldrop.cli import app
from modeldrop.contracts import clock

STACK = "modeldrop-local"
REGION = ["--stack", STACK, "--region", "us-east-1"]


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_deploy_wait_list_status_extend_teardown(
    deployed: Any, archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = deployed
    sqs, url = subscribe(stack, (ROOT / "events" / "modeldrop-events.rule.json").read_text())
    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/7/weights.tar.gz", Body=archive)
    started = _cli("deploy", f"s3://{stack.bucket}/runs/7/weights.tar.gz", *REGION, "--ttl", "2h", "--wait", "--json")
    assert started.exit_code == 0, started.output
    run = json.loads(started.output)
    assert run["status"] == "succeeded" and "SmokeEval" in [s["name"] for s in run["states"]]
    deployment_id, endpoint = run["deployment_id"], run["endpoint_name"]  # the shape run-local --json has
    assert (deployment_id, endpoint) == (run["output"]["deployment_id"], run["output"]["endpoint_name"])

    clock.advance(3600)  # an hour of billing at the catalog price
    [row] = json.loads(_cli("list", *REGION, "--json").output)
    assert (row["deployment_id"], row["status"], row["instance_type"]) == (deployment_id, "succeeded", "ml.g6.2xlarge")
    assert row["cost_usd"] == pytest.approx(1.23, abs=0.02) and not row["cost_is_final"]
    assert 0.9 < row["expires_in_hours"] < 1.1
    human = _cli("list", *REGION)
    assert deployment_id in human.output and "so far" in human.output

    status = json.loads(_cli("status", endpoint, *REGION, "--json").output)
    assert status["deployment_id"] == deployment_id and status["price_read_on"]
    assert status["links"]["endpoint_logs"].endswith(f"$252Faws$252Fsagemaker$252FEndpoints$252F{endpoint}")
    assert status["links"]["execution"].endswith(f":execution:{STACK}-deployment:{run['execution_arn'].split(':')[-1]}")
    # At 80 columns the ids, the endpoint name and both console links are printed whole.
    from modeldrop.cli import _shared

    with monkeypatch.context() as narrow_terminal:
        narrow_terminal.setattr(_shared.console, "width", 80)
        narrow = _cli("list", *REGION).output
        assert deployment_id in narrow and endpoint in narrow and "…" not in narrow, narrow
        narrow = _cli("status", deployment_id, *REGION).output
        assert deployment_id in narrow and endpoint in narrow and "None" not in narrow, narrow
        for link in status["links"].values():
            assert link in narrow, link

    before = clock.utcnow().replace(microsecond=0) + timedelta(hours=6)
    extended = _cli("extend", deployment_id, "--ttl", "6h", *REGION)
    after = clock.utcnow() + timedelta(hours=6)
    assert extended.exit_code == 0, extended.output
    sm = stack.client("sagemaker")
    arn = sm.describe_endpoint(EndpointName=endpoint)["EndpointArn"]
    tag = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}["modeldrop:expires-at"]
    record = stack.table().get_item(Key={"deployment_id": deployment_id})["Item"]
    # The tag and the record agree, and name a time six hours after the command ran (whole seconds).
    assert tag == record["expires_at"] and before <= clock.parse_iso(tag) <= after, (tag, before, after)

    down = _cli("teardown", deployment_id, *REGION)
    assert down.exit_code == 0, down.output
    assert "final cost $1.2" in down.output
    assert stack.leftover_resources() == []
    record = stack.table().get_item(Key={"deployment_id": deployment_id})["Item"]
    assert record["status"] == "torn_down" and record["ended_at"]
    events = [json.loads(m["Body"]) for m in sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]]
    torn = next(e for e in events if e["detail-type"] == "Deployment Torn Down")
    assert torn["detail"]["final_cost_usd"] == pytest.approx(1.23, abs=0.02)
    again = _cli("extend", deployment_id, "--ttl", "1h", *REGION)
    assert again.exit_code == 2 and "nothing to extend" in again.output


def test_refusals_are_one_line(deployed: Any, archive: bytes) -> None:
    stack = deployed
    create_endpoint(stack, "modeldrop-not-ours", archive, managed_by="another-stack")
    cases = [
        (("teardown", "modeldrop-not-ours", *REGION), "is not managed by stack modeldrop-local (managed-by: another"),
        (("status", "nope", *REGION), "no deployment or endpoint 'nope'"),
        (("list", "--stack", "absent", "--region", "us-east-1"), "no stack named absent in us-east-1"),
        (("deploy", "https://x/model.tar.gz", *REGION), "invalid deployment request: artifact_uri"),
        (("deploy", f"s3://{stack.bucket}/m/model.tar.gz", *REGION, "--ttl", "forever"), "is not a duration"),
        (("extend", "nope", "--ttl", "1h", *REGION), "no deployment or endpoint"),
    ]
    for args, message in cases:
        result = _cli(*args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert "Traceback" not in result.output
    assert "endpoint/modeldrop-not-ours" in stack.leftover_resources()


def test_no_credentials_is_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_REGION="eu-west-1",
    )
    result = subprocess.run(
        [sys.executable, "-m", "modeldrop", "list"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[0] == "error: no AWS credentials found"


def test_integration_examples(deployed: Any, archive: bytes) -> None:
    import runpy

    from modeldrop.contracts.models import DeploymentRequest

    stack = deployed
    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/9/weights.tar.gz", Body=archive)
    example = runpy.run_path(str(ROOT / "events" / "start_deployment.py"))
    code = example["main"](
        [f"s3://{stack.bucket}/runs/9/weights.tar.gz", "--stack", STACK, "--region", "us-east-1", "--poll-seconds", "0"]
    )
    assert code == 0
    asl = json.loads((ROOT / "events" / "training-pipeline-step.asl.json").read_text())
    deploy = asl["States"]["Deploy"]
    assert deploy["Resource"] == "arn:aws:states:::states:startExecution.sync:2"
    fields = {k.removesuffix(".$") for k in deploy["Parameters"]["Input"]}
    assert fields <= set(DeploymentRequest.model_fields)
    assert asl["States"]["Train"]["Next"] == "Deploy" and deploy["Catch"][0]["Next"] == "DeployFailed"


def test_teardown_all_before_sam_delete_and_doctor_warns_while_endpoints_live(deployed: Any, archive: bytes) -> None:
    from modeldrop.operate.doctor import check_live_endpoints

    stack = deployed
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/all/model.tar.gz", Body=archive)
    arn = stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/all/model.tar.gz"}, name="to-tear-down")
    assert stack.wait(arn)["status"] == "SUCCEEDED"
    endpoint = stack.record_of(arn).endpoint_name
    sm = stack.client("sagemaker")
    warned = check_live_endpoints(sm, STACK, "modeldrop")
    assert warned.status == "warn" and endpoint in warned.detail and "teardown --all" in warned.fix
    assert _cli("teardown", *REGION).exit_code == 2  # neither an id nor --all
    done = _cli("teardown", "--all", *REGION, "--json")
    assert done.exit_code == 0, done.output
    [result] = json.loads(done.output)["torn_down"]
    assert result["endpoint"] == endpoint and f"endpoint/{endpoint}" in result["deleted"]
    assert stack.record_of(arn).status == "torn_down" and stack.leftover_resources() == []
    assert check_live_endpoints(sm, STACK, "modeldrop").status == "ok"
    # Idempotent: what is already gone or going is said as such, exit 0 -- the deployment again (its
    # endpoint still Deleting), and the whole stack again.
    deployment_id = stack.record_of(arn).deployment_id
    again = _cli("teardown", deployment_id, *REGION, "--json")
    assert again.exit_code == 0, again.output
    assert json.loads(again.output)["already_ended"] == "torn_down"
    twice = _cli("teardown", deployment_id, *REGION)
    assert twice.exit_code == 0 and "already torn_down" in twice.output, twice.output
    assert _cli("teardown", "--all", *REGION, "--json").exit_code == 0


def test_a_failed_deployment_stays_findable_and_a_promoted_one_has_one_truth(deployed: Any, archive: bytes) -> None:
    stack = deployed
    missing = _cli("deploy", f"s3://{stack.bucket}/runs/8/missing.tar.gz", *REGION, "--ttl", "2h", "--wait", "--json")
    assert missing.exit_code == 1, missing.output
    failed = json.loads(missing.output)
    # The failure path's steps report their own outcome: the record exists before the artifact is read.
    assert failed["error"] == "CheckpointUnreadable" and "StepContractViolated" not in missing.output
    status = json.loads(_cli("status", failed["deployment_id"], *REGION, "--json").output)
    assert status["status"] == "failed" and status["failure"]["error"] == "CheckpointUnreadable"

    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/9/weights.tar.gz", Body=archive)
    run = json.loads(_cli("deploy", f"s3://{stack.bucket}/runs/9/weights.tar.gz", *REGION, "--wait", "--json").output)
    deployment_id, own = run["deployment_id"], run["endpoint_name"]
    promoted = _cli("promote", deployment_id, "--channel", "main", *REGION, "--json")
    assert promoted.exit_code == 0, promoted.output
    clock.advance(3600)  # the channel's endpoint bills from here; the deployment's own is gone
    status = json.loads(_cli("status", deployment_id, *REGION, "--json").output)
    assert status["channel"]["channel"] == "main" and status["channel"]["role"] == "serving"
    assert status["endpoint_name"] == "modeldrop-ch-main" and status["preview_endpoint_name"] == own
    assert status["expires_at"] is None and status["cost_is_final"] and status["cost_usd"] < 0.1
    rows = {r["deployment_id"]: r for r in json.loads(_cli("list", *REGION, "--json").output)}
    assert rows[deployment_id]["status"] == "serving (main)" and rows[deployment_id]["expires_in_hours"] is None
    extend = _cli("extend", deployment_id, "--ttl", "2h", *REGION)
    assert extend.exit_code == 2 and "serves channel main" in extend.output
    assert "modeldrop rollback main" in extend.output and "Traceback" not in extend.output
    down = _cli("teardown", deployment_id, *REGION)
    assert down.exit_code == 2 and "modeldrop teardown main" in down.output

    clock.advance(2 * 86400)  # the failed one ended two days ago: out of the default list, in --all
    listed = _cli("list", *REGION)
    assert failed["deployment_id"] not in listed.output and "1 more ended over a day ago" in listed.output
    assert failed["deployment_id"] in _cli("list", *REGION, "--all").output
    closed = _cli("teardown", "main", *REGION)
    assert closed.exit_code == 0, closed.output
    assert "channel main closed; deleted:\n  " in closed.output  # one per line, copyable
    assert stack.leftover_resources() == []


def test_ctrl_c_in_deploy_wait_names_the_deployment_that_goes_on(
    deployed: Any, archive: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C stops the wait, not the deployment (which bills): the output names its id and how to follow and
    stop it, and `status` takes every identifier deploy printed (the id, the execution's name and ARN)."""
    from modeldrop.aws import execution_watch

    stack = deployed
    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/ctrl-c/model.tar.gz", Body=archive)

    def interrupted(sfn: Any, arn: str, show: Any, poll_seconds: float) -> Any:
        stack.wait(arn, timeout=600)  # the user waits a while, then presses Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(execution_watch, "watch", interrupted)
    waited = _cli("deploy", f"s3://{stack.bucket}/runs/ctrl-c/model.tar.gz", *REGION, "--wait")
    assert waited.exit_code == 130, waited.output
    said = waited.output
    assert "goes on" in said and "modeldrop status " in said and "modeldrop teardown " in said, said
    deployment_id = said.split("modeldrop status ", 1)[1].split()[0]
    arn = next(w for w in said.split() if ":execution:" in w)
    for identifier in (deployment_id, arn, arn.rsplit(":", 1)[-1]):
        shown = _cli("status", identifier, *REGION, "--json")
        assert shown.exit_code == 0 and json.loads(shown.output)["deployment_id"] == deployment_id, identifier
    as_json = _cli("deploy", f"s3://{stack.bucket}/runs/ctrl-c/model.tar.gz", *REGION, "--wait", "--json")
    assert as_json.exit_code == 130 and json.loads(as_json.output.splitlines()[-1])["interrupted"] is True
    assert _cli("teardown", deployment_id, *REGION).exit_code == 0
