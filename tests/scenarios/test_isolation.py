"""No deployment can harm another, and nothing a request or a bucket writer asks for passes the stack's
limits -- through the real ASL and handlers, with the emulator enforcing IAM and bucket policies."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import ROOT, put_files

MODELDROP = [sys.executable, "-m", "modeldrop"]


def _old_deployment_id(name: str) -> str:
    """The rule before this change: a slug, or slug-<8 hex of the name> for a name that is not one."""
    slug = re.sub("-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", name.lower())).strip("-")
    if slug == name and 0 < len(slug) <= 40:
        return slug
    return f"{slug[:31].strip('-') or 'd'}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def _put(stack: Any, key: str, body: bytes) -> str:
    stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=body)
    return f"s3://{stack.bucket}/{key}"


def _info(stack: Any) -> Any:
    from modeldrop.operate.deployments import StackInfo

    return StackInfo(
        stack_name="modeldrop-local",
        region="us-east-1",
        state_machine_arn=stack.state_machine_arn,
        table_name=stack.table_name,
        bucket=stack.bucket,
        event_bus=stack.resources["EventBus"],
    )


def _served_keys(stack: Any, deployment_id: str) -> list[str]:
    listing = stack.client("s3").list_objects_v2(Bucket=stack.bucket, Prefix=f"modeldrop-served/{deployment_id}/")
    return [o["Key"] for o in listing.get("Contents", [])]


def _forget_execution(stack: Any, name: str) -> None:
    """Step Functions forgets an execution's name 90 days after it closed: it may then be reused."""
    from moto.stepfunctions.parser.models import stepfunctions_parser_backends

    backend = stepfunctions_parser_backends["123456789012"]["us-east-1"]
    machine = backend.describe_state_machine(stack.state_machine_arn)
    machine.executions[:] = [e for e in machine.executions if e.name != name]


def test_executions_whose_names_once_mapped_to_one_id_keep_everything_of_their_own(
    stack: Any, archive: bytes, checkpoint: Path
) -> None:
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    (checkpoint / "generation_config.json").write_text('{"temperature": 0.5}')
    other = tar_gz_bytes(checkpoint)  # another artifact version, so that neither is a duplicate
    first = stack.start({"artifact_uri": _put(stack, "direct/a/model.tar.gz", archive)}, name="Train_Run_1")
    assert stack.wait(first)["status"] == "SUCCEEDED"
    clash = _old_deployment_id("Train_Run_1")  # an execution named exactly what the first one's id was
    second = stack.start({"artifact_uri": _put(stack, "direct/b/model.tar.gz", other)}, name=clash)
    assert stack.wait(second)["status"] == "SUCCEEDED"
    ids = [stack.deployment_id(first), stack.deployment_id(second)]
    # A name reused after the 90-day window (same name, same ARN): another start time, another deployment.
    (checkpoint / "generation_config.json").write_text('{"temperature": 0.7}')
    _forget_execution(stack, clash)
    third = stack.start({"artifact_uri": _put(stack, "direct/c/model.tar.gz", tar_gz_bytes(checkpoint))}, name=clash)
    assert stack.wait(third)["status"] == "SUCCEEDED" and third == second
    ids.append(stack.deployment_id(third))

    registry = stack.registry()
    records = [registry.get(i) for i in ids]
    assert len(set(ids)) == 3 and all(r is not None and r.status == "succeeded" for r in records)
    assert [r.execution_arn for r in records] == [first, second, third]
    sm = stack.client("sagemaker")
    for record in records:
        assert sm.describe_endpoint(EndpointName=record.endpoint_name)["EndpointStatus"] == "InService"
        assert _served_keys(stack, record.deployment_id), record.deployment_id
    reaped = stack.invoke_function("ReaperFunction", {})
    assert reaped["expired"] == [] and reaped["served_copies_deleted"] == [], reaped
    assert {registry.get(i).status for i in ids} == {"succeeded"}


def test_a_step_that_finds_its_deployment_ended_releases_what_it_created(stack: Any, archive: bytes) -> None:
    """The execution-ended rule ran before this CreateEndpoint had made anything (so it deleted
    nothing); the Lambda, still running, creates the endpoint -- then finds the record aborted and
    deletes its own endpoint, config and model instead of leaving them billing."""
    from modeldrop.contracts.artifact import Artifact
    from modeldrop.contracts.errors import DeploymentEnded
    from modeldrop.contracts.step_payloads import EnginePlan, ImageChoice
    from modeldrop.local.emulator.iam.enforcement import after_call
    from modeldrop.pipeline.config import DefaultsSettings
    from modeldrop.pipeline.deployment import endpoint_steps, steps

    uri = _put(stack, "direct/late/model.tar.gz", archive)
    request = steps.normalize({"artifact_uri": uri}, "late", DefaultsSettings(), "arn:local:late", 0)
    registry = stack.registry()
    registry.register(request.deployment_id, "late", request.model_dump(mode="json"), {}, request.execution_arn)
    registry.record(request.deployment_id, "validate", {}, status="validated", owner=request.execution_arn)
    registry.record(request.deployment_id, "build_env", {}, status="planned", owner=request.execution_arn)
    after_call(
        "sagemaker",
        "CreateEndpoint",
        lambda params, result: registry.record(request.deployment_id, "execution_ended", {}, status="aborted"),
    )
    clients = endpoint_steps.CreateClients(
        sagemaker=stack.client("sagemaker"),
        quotas=stack.client("service-quotas"),
        secretsmanager=stack.client("secretsmanager"),
        ssm=stack.client("ssm"),
    )
    image = ImageChoice(engine="vllm", image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:x", source="t",
                        region="us-east-1")  # fmt: skip
    plan = EnginePlan(env={}, instance_type="ml.g6.2xlarge", max_num_seqs=32, max_model_len=4096,
                      startup_timeout_seconds=600, download_timeout_seconds=600)  # fmt: skip
    role = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"
    with pytest.raises(DeploymentEnded):
        served = Artifact.parse(put_files(stack, "direct/late-files/", archive))
        endpoint_steps.create(clients, registry, request, image, plan, role, "modeldrop-local", served)
    assert stack.leftover_resources() == []
    assert registry.get(request.deployment_id).status == "aborted"


def test_run_local_abort_mid_validate_and_mid_create_leave_nothing_and_the_version_deploys_again() -> None:
    for fault in ("abort-mid-validate", "abort-mid-create"):
        run = subprocess.run(
            [*MODELDROP, "run-local", "--fault", fault, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300
        )
        assert "Traceback" not in run.stderr, run.stderr
        data = json.loads(run.stdout)
        assert run.returncode == 1 and data["status"] == "aborted", (fault, data.get("error"), data.get("cause"))
        assert data["leftover_resources"] == [], (fault, data["leftover_resources"])
        assert data["record"]["status"] == "aborted" and "execution_ended" in data["record"]["steps"]
        assert data["redeploy"]["status"] == "succeeded", (fault, data["redeploy"])


def test_teardown_by_name_acts_on_the_deployment_that_owns_the_endpoint(stack: Any, archive: bytes, checkpoint: Path):
    from modeldrop.local.samples.checkpoint import tar_gz_bytes
    from modeldrop.operate.deployments import OperateError, find_deployment, teardown

    live = stack.start(
        {"artifact_uri": _put(stack, "direct/live/model.tar.gz", archive), "endpoint_name": "modeldrop-chat"},
        name="live-run",
    )
    assert stack.wait(live)["status"] == "SUCCEEDED"
    (checkpoint / "generation_config.json").write_text("{}")
    loser = stack.start(
        {
            "artifact_uri": _put(stack, "direct/l/model.tar.gz", tar_gz_bytes(checkpoint)),
            "endpoint_name": "modeldrop-chat",
        },
        name="same-name-later",
    )
    assert stack.wait(loser)["error"] == "ResourceNameTaken"
    owner, failed = stack.record_of(live), stack.record_of(loser)
    assert failed.created_at > owner.created_at and failed.endpoint_name == "modeldrop-chat"
    info = _info(stack)
    sm, registry = stack.client("sagemaker"), stack.registry()
    assert find_deployment(registry, "modeldrop-chat", sm).deployment_id == owner.deployment_id
    done = teardown(sm, registry, stack.client("events"), info, "modeldrop-chat", s3=stack.client("s3"))
    assert "endpoint/modeldrop-chat" in done["deleted"]
    assert registry.get(owner.deployment_id).status == "torn_down"
    assert registry.get(failed.deployment_id).status == "failed"  # untouched
    assert stack.leftover_resources() == []
    with pytest.raises(OperateError, match="have ended"):  # nothing left under that name: never a quiet success
        teardown(sm, registry, stack.client("events"), info, "modeldrop-chat", s3=stack.client("s3"))


@pytest.mark.parametrize(
    ("marker", "says"),
    [
        ({"instance_type": "ml.p5.48xlarge", "instance_count": 8}, "AllowedInstanceTypes"),
        ({"instance_type": "ml.g6e.12xlarge", "instance_count": 2}, "MaxHourlyPrice"),
        ({"instance_count": 8}, "MaxInstanceCount"),
        ({"ttl_hours": 336}, "MaxTtlHours"),
        ({"force_plan": True}, "AllowForcePlan"),
        ({"engine_settings": {"trust_remote_code": True}}, "AllowTrustRemoteCode"),
        ({"eval_thresholds": {"max_errors": 50}}, "MaxEvalTolerance"),
    ],
)
def test_a_marker_cannot_ask_for_more_than_the_stack_allows(stack: Any, checkpoint: Path, marker: Any, says: str):
    for path in checkpoint.iterdir():
        _put(stack, f"runs/limits/{path.name}", path.read_bytes())
    _put(stack, "runs/limits/modeldrop.json", json.dumps(marker).encode())
    sfn = stack.client("stepfunctions")
    [execution] = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    desc = stack.wait(execution["executionArn"])
    assert desc["error"] == "LimitExceeded" and says in desc["cause"], desc.get("cause")
    assert stack.table().scan()["Items"] == [] and stack.leftover_resources() == []
    invoked = {i.function for i in stack.invocations}
    assert invoked <= {"StarterFunction", "NormalizeFunction", "ExecutionEndedFunction"}, invoked


@pytest.mark.parametrize(
    "marker",
    [
        {"trust_remote_code": True},
        {"engine_env": {"SM_VLLM_TRUST_REMOTE_CODE": ""}},
        {"engine_env": {"SM_VLLM_SERVED_MODEL_NAME": "m\nSM_VLLM_MAX_NUM_SEQS=1024"}},
        {"engine_env": {"SM_VLLM_HF_TOKEN": "hf_abcdefghijklmnopqrstuvwxyz0123"}},
        {"secrets": {"HF_TOKEN": "secretsmanager:modeldrop/hf"}},
        {"endpoint_name": "modeldrop-production"},
        {"max_hourly_price": float("inf")},
    ],
)
def test_a_marker_cannot_smuggle_settings(stack: Any, checkpoint: Path, marker: Any) -> None:
    for path in checkpoint.iterdir():
        _put(stack, f"runs/smuggle/{path.name}", path.read_bytes())
    _put(stack, "runs/smuggle/modeldrop.json", json.dumps(marker).encode())  # json writes inf as Infinity
    executions = stack.client("stepfunctions").list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    for execution in executions:  # the starter refused it outright, or the door did
        assert stack.wait(execution["executionArn"])["error"] in ("RequestInvalid", "LimitExceeded")
    # Nothing of a deployment: at most the closed record of a rejected upload `list` shows (no secret in it).
    items = stack.table().scan()["Items"]
    assert all(i["status"] == "rejected" and i["deployment_id"].startswith("rejected-") for i in items), items
    assert stack.leftover_resources() == []
    text = json.dumps([i.error for i in stack.invocations]) + json.dumps(items, default=str)
    assert "hf_abcdefghijklmnopqrstuvwxyz0123" not in text


def test_only_the_pipeline_may_write_or_delete_a_served_copy(stack: Any, archive: bytes) -> None:
    """The bucket policy, evaluated with its conditions: a principal allowed s3:* on the bucket may
    still not overwrite or delete what SageMaker downloads; the pipeline's own roles may."""
    from modeldrop.local.emulator.iam.enforcement import Principal, acting_as

    key = "modeldrop-served/some-deployment/model.tar.gz"
    s3 = stack.client("s3")
    everything = {"Effect": "Allow", "Action": "s3:*", "Resource": [f"arn:aws:s3:::{stack.bucket}/*"]}
    writer = Principal("bucket-writer", "arn:aws:iam::123456789012:role/training-pipeline", (everything,))
    with acting_as(stack.functions["ValidateFunction"].principal):
        s3.put_object(Bucket=stack.bucket, Key=key, Body=archive)  # the pipeline writes it
    with acting_as(writer):
        s3.put_object(Bucket=stack.bucket, Key="runs/x/model.tar.gz", Body=b"anything")  # elsewhere: allowed
        elsewhere = {"Bucket": stack.bucket, "Key": "runs/x/model.tar.gz"}
        for attempt in (
            lambda: s3.put_object(Bucket=stack.bucket, Key=key, Body=b"unvalidated"),
            lambda: s3.copy_object(Bucket=stack.bucket, Key=key, CopySource=elsewhere),
            lambda: s3.delete_object(Bucket=stack.bucket, Key=key),
        ):
            with pytest.raises(ClientError) as refused:
                attempt()
            assert refused.value.response["Error"]["Code"] == "AccessDenied"
    assert s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read() == archive
    with acting_as(stack.functions["TeardownFunction"].principal):
        s3.delete_object(Bucket=stack.bucket, Key=key)


def test_the_served_copy_is_checked_unchanged_before_create_model(stack: Any, archive: bytes) -> None:
    """Even a write the policy let through (the policy edited, an admin) is caught: CreateEndpoint
    compares the copy with what was validated and creates nothing."""
    from modeldrop.local.emulator.iam.enforcement import after_call, current

    def overwrite(params: Any, result: Any) -> None:
        if str(params.get("Key", "")).endswith("validation.json") and current() is not None:
            from modeldrop.local.emulator.iam.enforcement import acting_as

            with acting_as(None):
                served = [k for k in stack.client("s3").list_objects_v2(Bucket=stack.bucket, Prefix="modeldrop-served/")
                          ["Contents"]]  # fmt: skip
                stack.client("s3").put_object(Bucket=stack.bucket, Key=served[0]["Key"], Body=b"\x1f\x8b swapped")

    after_call("s3", "PutObject", overwrite)
    arn = stack.start({"artifact_uri": _put(stack, "direct/swap/model.tar.gz", archive)}, name="swapped")
    desc = stack.wait(arn)
    assert desc["error"] == "CheckpointUnreadable" and "changed after it was validated" in desc["cause"]
    assert stack.client("sagemaker").list_models()["Models"] == []
    stack.settle()
    assert stack.leftover_resources() == []


def test_markers_within_their_own_limits_cannot_add_up_past_the_stacks_ceiling(
    make_stack: Any, checkpoint: Path
) -> None:
    """Six bucket writers, each asking for one ml.g6.2xlarge ($1.22/h, well inside MaxHourlyPrice): the
    stack's ceiling ($5/h here) holds four; the others are LimitExceeded before anything is created."""
    stack = make_stack({"MaxStackHourlyPrice": "5"})
    for n in range(6):
        for path in checkpoint.iterdir():
            _put(stack, f"runs/team{n}/{path.name}", path.read_bytes())
        _put(stack, f"runs/team{n}/modeldrop.json", json.dumps({"instance_type": "ml.g6.2xlarge"}).encode())
    sfn = stack.client("stepfunctions")
    executions = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    outcomes = [stack.wait(e["executionArn"], timeout=600) for e in executions]
    refused = [d for d in outcomes if d.get("error") == "LimitExceeded"]
    assert len(outcomes) == 6 and [d["status"] for d in outcomes].count("SUCCEEDED") == 4, outcomes
    assert len(refused) == 2 and all("MaxStackHourlyPrice" in d["cause"] for d in refused)
    assert len(stack.client("sagemaker").list_endpoints()["Endpoints"]) == 4
    for loser in refused:  # nothing was copied or created for it
        record = stack.record_of(loser["executionArn"])
        assert _served_keys(stack, record.deployment_id) == []
    # A deployment that ends gives its share back: the next one fits.
    from modeldrop.aws.dynamodb import stack_budget

    hourly, instances = stack_budget.current(stack.table())
    assert round(hourly, 2) == 4.88 and instances == 4
    winner = next(d for d in outcomes if d["status"] == "SUCCEEDED")
    stack.registry().record(stack.record_of(winner["executionArn"]).deployment_id, "teardown", {}, status="torn_down")
    assert round(stack_budget.current(stack.table())[0], 2) == 3.66


def test_a_reservation_left_by_an_ended_deployment_is_released_by_the_reaper(stack: Any) -> None:
    from modeldrop.aws.dynamodb import stack_budget

    registry = stack.registry()
    stack_budget.reserve(stack.table(), "gone-1", 2.0, 1, 60.0, 8)  # no record: a Lambda killed mid-way
    assert stack_budget.current(stack.table()) == (2.0, 1)
    assert registry.release_stale_reservations() == ["gone-1"]
    assert stack_budget.current(stack.table()) == (0.0, 0) and registry.deployments() == []


def test_teardown_all_stops_running_executions_first(stack: Any, archive: bytes) -> None:
    """`teardown --all` while a deployment is on its way: its execution is stopped before the sweep, so
    nothing it would create afterwards outlives the command."""
    from modeldrop.operate.stack_teardown import teardown_all

    info = _info(stack)
    swept: list[Any] = []

    def sweep(_event: Any) -> None:
        swept.extend(
            teardown_all(
                stack.client("sagemaker"), stack.registry(), stack.client("events"), info,
                s3=stack.client("s3"), sfn=stack.client("stepfunctions"),
            )
        )  # fmt: skip

    stack.after["RegisterFunction"] = sweep
    uri = _put(stack, "runs/mid/weights.tar.gz", archive)
    desc = stack.wait(stack.start({"artifact_uri": uri}))
    stack.settle()
    assert desc["status"] == "ABORTED" and any(r.get("stopped") for r in swept), swept
    assert stack.client("sagemaker").list_endpoints()["Endpoints"] == []
    assert stack.leftover_resources() == []


def test_the_bucket_policy_protects_itself_from_everyone_but_the_deploy_role(make_stack: Any) -> None:
    """With DeployRoleArn set, an s3:* holder cannot delete or replace the bucket policy (and with it the
    served copies' protection); the deploy role can."""
    from modeldrop.local.emulator.iam.enforcement import Principal, acting_as

    deployer = "arn:aws:iam::123456789012:role/modeldrop-deployer"
    stack = make_stack({"DeployRoleArn": deployer})
    s3 = stack.client("s3")
    bucket = f"arn:aws:s3:::{stack.bucket}"
    everything = {"Effect": "Allow", "Action": "s3:*", "Resource": [bucket, f"{bucket}/*"]}
    writer = Principal("bucket-admin", "arn:aws:iam::123456789012:role/data-team", (everything,))
    policy = s3.get_bucket_policy(Bucket=stack.bucket)["Policy"]
    with acting_as(writer):
        for attempt in (
            lambda: s3.delete_bucket_policy(Bucket=stack.bucket),
            lambda: s3.put_bucket_policy(Bucket=stack.bucket, Policy='{"Version":"2012-10-17","Statement":[]}'),
        ):
            with pytest.raises(ClientError) as refused:
                attempt()
            assert refused.value.response["Error"]["Code"] == "AccessDenied"
    assert s3.get_bucket_policy(Bucket=stack.bucket)["Policy"] == policy
    with acting_as(Principal("deployer", deployer, (everything,))):
        s3.put_bucket_policy(Bucket=stack.bucket, Policy=policy)


def test_delete_objects_answers_per_key_errors_and_the_caller_reads_them(stack: Any, archive: bytes) -> None:
    """S3 answers DeleteObjects 200 with the keys it refused in Errors (moto's emulation raised for the
    whole call): the served copy a non-pipeline principal may not delete stays, and delete_served says so
    instead of reporting it deleted."""
    from modeldrop.aws.s3.served_copy import delete_served
    from modeldrop.contracts.errors import TeardownIncomplete
    from modeldrop.local.emulator.iam.enforcement import Principal, acting_as

    key = "modeldrop-served/held-1/model.tar.gz"
    s3 = stack.client("s3")
    with acting_as(stack.functions["ValidateFunction"].principal):
        s3.put_object(Bucket=stack.bucket, Key=key, Body=archive)
    everything = {
        "Effect": "Allow",
        "Action": "s3:*",
        "Resource": [f"arn:aws:s3:::{stack.bucket}", f"arn:aws:s3:::{stack.bucket}/*"],
    }
    operator = Principal("operator", "arn:aws:iam::123456789012:role/operator", (everything,))
    version = s3.list_object_versions(Bucket=stack.bucket, Prefix=key)["Versions"][0]["VersionId"]
    with acting_as(operator):
        answer = s3.delete_objects(
            Bucket=stack.bucket, Delete={"Objects": [{"Key": key, "VersionId": version}], "Quiet": True}
        )
        assert [e["Code"] for e in answer["Errors"]] == ["AccessDenied"]
        with pytest.raises(TeardownIncomplete, match="could not delete 1 object"):
            delete_served(s3, stack.bucket, "held-1")
    assert s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read() == archive


def test_the_reaper_may_delete_channel_records_and_no_deployments_record(stack: Any) -> None:
    """The reaper undoes a channel whose claim went stale, so it may DeleteItem -- channel records only
    (dynamodb:LeadingKeys `channel#*`): a deployment's record, whoever's, is out of its reach."""
    from modeldrop.local.emulator.iam.enforcement import acting_as

    table = stack.registry().table
    for key in ("channel#main", "some-deployment-1"):
        table.put_item(Item={"deployment_id": key, "revision": 1})
    with acting_as(stack.functions["ReaperFunction"].principal):
        table.delete_item(Key={"deployment_id": "channel#main"})
        with pytest.raises(ClientError) as refused:
            table.delete_item(Key={"deployment_id": "some-deployment-1"})
    assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
    assert "Item" in table.get_item(Key={"deployment_id": "some-deployment-1"})
    assert "Item" not in table.get_item(Key={"deployment_id": "channel#main"})


def test_the_models_it_creates_have_no_network_and_its_role_creates_no_other(stack: Any, archive: bytes) -> None:
    """The container serves the validated copy, never what a config names on the Hub: CreateModel carries
    EnableNetworkIsolation, and the role's sagemaker:NetworkIsolation condition refuses a model without it."""
    from modeldrop.local.emulator.iam.enforcement import acting_as

    created: list[dict[str, Any]] = []
    from modeldrop.local.emulator.iam.enforcement import after_call

    after_call("sagemaker", "CreateModel", lambda params, _result: created.append(dict(params)))
    arn = stack.start({"artifact_uri": _put(stack, "direct/isolated/model.tar.gz", archive)}, name="isolated")
    assert stack.wait(arn)["status"] == "SUCCEEDED"
    assert created and all(p.get("EnableNetworkIsolation") is True for p in created), created
    sm = stack.client("sagemaker")
    model = created[0]
    with acting_as(stack.functions["CreateEndpointFunction"].principal):
        with pytest.raises(ClientError) as refused:
            sm.create_model(ModelName=model["ModelName"] + "-open", PrimaryContainer=model["PrimaryContainer"],
                            ExecutionRoleArn=model["ExecutionRoleArn"], Tags=model["Tags"])  # fmt: skip
        assert refused.value.response["Error"]["Code"] in ("AccessDenied", "AccessDeniedException")
    stack.settle()
