"""Capacity fallback, quota waits, phase routing, the teardown loop and the execution-ended rule --
through the real ASL and handlers (and, for the issue's command lines, run-local as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, put_files, subscribe

from modeldrop.contracts import clock

MODELDROP = [sys.executable, "-m", "modeldrop"]


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    run = subprocess.run([*MODELDROP, *args], capture_output=True, text=True, cwd=ROOT, timeout=1800)
    assert "Traceback" not in run.stderr, run.stderr
    return run.returncode, json.loads(run.stdout)


def _start(stack: Any, archive: bytes, name: str, **request: Any) -> str:
    key = f"direct/{name}/model.tar.gz"
    stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=archive)
    sfn = stack.client("stepfunctions")
    return str(
        sfn.start_execution(
            stateMachineArn=stack.state_machine_arn,
            name=name,
            input=json.dumps({"artifact_uri": f"s3://{stack.bucket}/{key}", **request}),
        )["executionArn"]
    )


def _record(stack: Any, name: str) -> dict[str, Any]:
    record = stack.record_of(name)
    assert record is not None, name
    return dict(record.to_json())


def _states(stack: Any, arn: str) -> list[str]:
    events = stack.client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return [e["stateEnteredEventDetails"]["name"] for e in events if e["type"].endswith("StateEntered")]


# ---- the command lines -------------------------------------------------------------------


def test_run_local_capacity_falls_back_to_the_next_type() -> None:
    code, data = _cli("run-local", "--fault", "capacity", "--instance-type", "ml.g6.2xlarge,ml.g6e.2xlarge", "--json")
    assert code == 0, data
    record = data["record"]
    [failed] = record["steps"]["attempts"]
    assert failed["instance_type"] == "ml.g6.2xlarge" and failed["error"] == "InsufficientCapacity"
    assert failed["minutes"] >= 0 and failed["cost_usd_at_most"] is not None and failed["hourly_price"] == 1.22
    assert record["instance_type"] == "ml.g6e.2xlarge" and data["output"]["instance_type"] == "ml.g6e.2xlarge"
    assert record["steps"]["create_endpoint"]["endpoint_config_name"].endswith("-a2")
    assert data["leftover_resources"] == []


def test_run_local_capacity_with_one_type_fails_naming_capacity() -> None:
    code, data = _cli("run-local", "--fault", "capacity", "--json")
    assert code == 1 and data["error"] == "CapacityUnavailable", data
    assert "ml.g6.2xlarge" in data["cause"] and data["leftover_resources"] == []


def test_run_local_quota_busy_waits_or_fails_fast() -> None:
    code, data = _cli("run-local", "--fault", "quota-busy", "--quota-wait", "30m", "--json")
    assert code == 0, data
    waits = [s["name"] for s in data["states"]].count("WaitForQuota")
    assert waits >= 2 and data["record"]["steps"]["quota_wait"]["instance_type"] == "ml.g6.2xlarge"
    assert data["leftover_resources"] == []
    code, data = _cli("run-local", "--fault", "quota-busy", "--json")
    assert code == 1 and data["error"] == "QuotaExceeded", data
    assert "other-team-endpoint" in data["cause"] and "request-service-quota-increase" in data["cause"]
    assert data["leftover_resources"] == []


def test_run_local_abort_is_recorded_and_leaves_nothing() -> None:
    code, data = _cli("run-local", "--fault", "abort", "--json")
    assert code == 1 and data["status"] == "aborted", data
    assert data["record"]["status"] == "aborted"
    ended = data["record"]["steps"]["execution_ended"]
    assert ended["status"] == "ABORTED" and any(d.startswith("endpoint/") for d in ended["deleted"])
    assert data["leftover_resources"] == []


# ---- fallback rules through the ASL --------------------------------------------------------------


def test_no_fallback_for_an_engine_oom(make_stack: Any, archive: bytes) -> None:
    stack = make_stack(fault="oom")
    arn = _start(stack, archive, "oom-list", instance_types=["ml.g6.2xlarge", "ml.g6e.2xlarge"])
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "EndpointFailed"
    assert "NextAttempt" not in _states(stack, arn)
    assert "attempts" not in _record(stack, "oom-list")["steps"]
    assert [i.function for i in stack.invocations].count("CreateEndpointFunction") == 1
    assert stack.leftover_resources() == []


def test_no_fallback_for_a_failed_eval(make_stack: Any, archive: bytes) -> None:
    stack = make_stack(fault="truncate")
    arn = _start(stack, archive, "eval-list", instance_types="auto")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "EvalFailed"
    assert "NextAttempt" not in _states(stack, arn) and stack.leftover_resources() == []


def test_fallback_re_plans_the_env_for_each_type_and_announces_the_attempt(make_stack: Any, archive: bytes) -> None:
    stack = make_stack(fault="capacity")
    sqs, url = subscribe(stack)
    arn = _start(stack, archive, "replan", instance_types=["ml.g6.2xlarge", "ml.g6.12xlarge"])
    desc = stack.wait(arn)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    record = _record(stack, "replan")
    first, second = record["steps"]["build_env"], record["steps"]["build_env_2"]
    assert first["instance_type"] == "ml.g6.2xlarge" and second["instance_type"] == "ml.g6.12xlarge"
    # Four GPUs: tensor parallelism 4 and a per-GPU memory plan, planned again for the new type.
    assert first["env"]["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "1" and second["env"]["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    assert second["memory"]["tensor_parallel"] == 4
    sm = stack.client("sagemaker")
    config = sm.describe_endpoint_config(EndpointConfigName=record["steps"]["create_endpoint"]["endpoint_config_name"])
    model = sm.describe_model(ModelName=config["ProductionVariants"][0]["ModelName"])
    assert config["ProductionVariants"][0]["InstanceType"] == "ml.g6.12xlarge"
    assert model["PrimaryContainer"]["Environment"]["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "4"
    # The first attempt's config and model went with its endpoint.
    names = [c["EndpointConfigName"] for c in sm.list_endpoint_configs()["EndpointConfigs"]]
    assert names == [config["EndpointConfigName"]]
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    kinds = [json.loads(m["Body"])["detail-type"] for m in messages]
    assert "Deployment Attempt Failed" in kinds and "Deployment Succeeded" in kinds


def test_two_artifacts_for_a_quota_of_one(make_stack: Any, archive: bytes, checkpoint: Path) -> None:
    from modeldrop.local.emulator import service_quotas
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    stack = make_stack()
    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 1)
    (checkpoint / "notes.txt").write_text("a second training run")
    other = tar_gz_bytes(checkpoint)
    first = _start(stack, archive, "first-run")
    second = _start(stack, other, "second-run")
    outcomes = sorted([stack.wait(first)["status"], stack.wait(second)["status"]])
    assert outcomes == ["FAILED", "SUCCEEDED"], outcomes
    failed = (
        first if stack.client("stepfunctions").describe_execution(executionArn=first)["status"] == "FAILED" else second
    )
    desc = stack.client("stepfunctions").describe_execution(executionArn=failed)
    assert desc["error"] == "QuotaExceeded" and "ml.g6.2xlarge" in desc["cause"]
    endpoints = [e["EndpointName"] for e in stack.client("sagemaker").list_endpoints()["Endpoints"]]
    assert len(endpoints) == 1  # the winner's; the loser left nothing


def test_dynamodb_throttled_once_at_every_step_still_deploys(stack: Any, archive: bytes, monkeypatch: Any) -> None:
    """Every record write is refused once with ProvisionedThroughputExceededException: the SDK's
    standard retry mode (AWS_RETRY_MODE in every function) absorbs it and nothing fails."""
    from moto.dynamodb.exceptions import DynamodbException
    from moto.dynamodb.models import DynamoDBBackend

    original = DynamoDBBackend.update_item
    refused: list[str] = []

    def throttled_once(self: Any, *args: Any, **kwargs: Any) -> Any:
        call = json.dumps([str(a) for a in args] + sorted(f"{k}={v}" for k, v in kwargs.items()), default=str)
        if call not in refused:
            refused.append(call)
            raise DynamodbException(
                "ProvisionedThroughputExceededException", "The level of configured provisioned throughput was exceeded"
            )
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DynamoDBBackend, "update_item", throttled_once)
    desc = stack.wait(_start(stack, archive, "ddb-throttled"))
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    record = _record(stack, "ddb-throttled")
    assert record["status"] == "succeeded" and len(refused) >= 6
    assert {"validate", "build_env", "create_endpoint", "smoke_eval", "result"} <= set(record["steps"])


# ---- phases ------------------------------------------------------------------------------------


def test_a_refused_checkpoint_never_calls_sagemaker(stack: Any, checkpoint: Path) -> None:
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    (checkpoint / "config.json").write_text("{}")
    arn = _start(stack, tar_gz_bytes(checkpoint), "refused")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "CheckpointRefused"
    states = _states(stack, arn)
    assert "DiscardServedCopy" in states and "Teardown" not in states
    record = _record(stack, "refused")
    assert record["steps"]["failure"]["phase"] == "prepare" and record["steps"]["failure"]["log_group"] is None
    assert stack.leftover_resources() == []


def test_a_malformed_payload_between_steps_is_an_internal_error(stack: Any) -> None:
    from modeldrop.contracts.errors import classify

    result = stack.dispatch(stack.functions["PollEndpointFunction"].name, {"deployment_id": "x", "endpoint": {}})
    payload, errored = json.loads(result[0]), result[1]
    assert errored and payload["errorType"] == "StepContractViolated"
    assert "poll_endpoint" in payload["errorMessage"] and "endpoint" in payload["errorMessage"]
    assert "correct the request" not in payload["errorMessage"] and classify("StepContractViolated") == "internal"


def test_teardown_waits_for_the_endpoint_before_its_config_and_model(make_stack: Any, archive: bytes) -> None:
    stack = make_stack(fault="oom")
    arn = _start(stack, archive, "ordered")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "EndpointFailed"
    states = _states(stack, arn)
    # Deleting is seen at least once: the loop waited, and only then deleted the config and model.
    assert states.count("Teardown") >= 2 and "WaitForTeardown" in states
    teardown = _record(stack, "ordered")["steps"]["teardown"]
    assert teardown["done"] and {"endpoint-config", "model"} <= {d.split("/")[0] for d in teardown["deleted"]}
    assert stack.leftover_resources() == []


def _stop_all(stack: Any) -> None:
    sfn = stack.client("stepfunctions")
    for ex in sfn.list_executions(stateMachineArn=stack.state_machine_arn, statusFilter="RUNNING")["executions"]:
        sfn.stop_execution(executionArn=ex["executionArn"])


def test_a_stopped_execution_loses_its_endpoint_at_once(stack: Any, archive: bytes) -> None:
    """StopExecution after CreateEndpoint: the rule on the state machine's status changes deletes the
    endpoint, its config, model and served copy, and marks the record -- long before the TTL."""
    stack.after["CreateEndpointFunction"] = lambda _event: _stop_all(stack)
    arn = _start(stack, archive, "stopped")
    assert stack.wait(arn)["status"] == "ABORTED"
    stack.settle()
    record = _record(stack, "stopped")
    assert record["status"] == "aborted" and record["steps"]["execution_ended"]["status"] == "ABORTED"
    assert stack.leftover_resources() == []
    # The event again (EventBridge delivers at least once): nothing more to do, the record stays.
    desc = stack.client("stepfunctions").describe_execution(executionArn=arn)
    detail = {"status": "ABORTED", "name": "stopped", "executionArn": arn, "startDate": desc["startDate"].isoformat()}
    again = stack.invoke_function("ExecutionEndedFunction", {"detail": detail})
    assert again["deleted"] == [] and again["marked"] is False


def test_concurrent_waiters_for_one_free_slot(stack: Any, archive: bytes, monkeypatch: Any) -> None:
    """Two deployments both passed the quota pre-check for the last slot (it cannot see the other's
    create in flight): SageMaker's own ResourceLimitExceeded sends the second back to waiting, no lock."""
    from modeldrop.contracts.artifact import Artifact
    from modeldrop.contracts.step_payloads import EnginePlan, ImageChoice
    from modeldrop.local.emulator import service_quotas
    from modeldrop.pipeline.config import DefaultsSettings
    from modeldrop.pipeline.deployment import endpoint_steps, steps

    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 1)
    monkeypatch.setattr(endpoint_steps, "check_endpoint_quota", lambda *a, **k: None)  # both saw a free slot
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/sweep/model.tar.gz", Body=archive)
    uri = f"s3://{stack.bucket}/direct/sweep/model.tar.gz"
    served = Artifact.parse(put_files(stack, "direct/sweep-files/", archive))
    clients = endpoint_steps.CreateClients(
        sagemaker=stack.client("sagemaker"),
        quotas=stack.client("service-quotas"),
        secretsmanager=stack.client("secretsmanager"),
        ssm=stack.client("ssm"),
    )
    image = ImageChoice(
        engine="vllm", image_uri="763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:x", source="t", region="us-east-1"
    )
    plan = EnginePlan(
        env={"SM_VLLM_MAX_NUM_SEQS": "32"},
        instance_type="ml.g6.2xlarge",
        max_num_seqs=32,
        max_model_len=4096,
        startup_timeout_seconds=600,
        download_timeout_seconds=600,
    )
    role = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"

    def create(req: Any, quota_waits: int = 0, quota_wait_until: str | None = None) -> Any:
        return endpoint_steps.create(
            clients, stack.registry(), req, image, plan, role, "modeldrop-local", served, quota_waits, quota_wait_until
        )

    requests = []
    for name in ("sweep-a", "sweep-b"):
        req = steps.normalize(
            {"artifact_uri": uri, "quota_wait_minutes": 60}, name, DefaultsSettings(), f"arn:local:{name}", 0
        )
        registry = stack.registry()
        registry.register(req.deployment_id, name, req.model_dump(mode="json"), {}, req.execution_arn)
        registry.record(req.deployment_id, "validate", {}, status="validated")  # as far as the plan
        registry.record(req.deployment_id, "build_env", {}, status="planned")
        requests.append(req)
    req_a, req_b = requests
    first, second = create(req_a), create(req_b)
    assert first.status == "created"
    assert second.status == "quota-busy" and second.wait_seconds > 0 and "current utilization of 1" in second.reason
    # Still busy on its next check; once the first is gone, the waiter proceeds.
    again = create(req_b, second.quota_waits, second.quota_wait_until)
    assert again.status == "quota-busy" and again.quota_waits == second.quota_waits + 1
    sm = stack.client("sagemaker")
    sm.delete_endpoint(EndpointName=req_a.resource_name)
    sm.describe_endpoint(EndpointName=req_a.resource_name)  # Deleting: no longer holds an instance
    last = create(req_b, again.quota_waits, again.quota_wait_until)
    listed = [(e["EndpointName"], e["EndpointStatus"]) for e in sm.list_endpoints()["Endpoints"]]
    assert last.status == "created" and last.quota_waits == again.quota_waits, (last.reason, listed)


# ---- instance_count: SageMaker's InitialInstanceCount, counted by the quota, the plan and the cost ----


def test_instance_count_reaches_the_endpoint_the_quota_and_the_cost(
    make_stack: Any, archive: bytes, checkpoint: Path
) -> None:
    from modeldrop.contracts.record import DeploymentRecord
    from modeldrop.local.emulator import service_quotas
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    stack = make_stack()
    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 3)
    arn = _start(stack, archive, "two-instances", instance_count=2, instance_type="ml.g6.2xlarge")
    assert stack.wait(arn)["status"] == "SUCCEEDED"
    record = _record(stack, "two-instances")
    assert record["instance_count"] == 2 and record["steps"]["create_endpoint"]["quota"]["needed"] == 2
    assert record["steps"]["build_env"]["instance_count"] == 2  # the memory plan is per instance, for 2
    sm = stack.client("sagemaker")
    config = sm.describe_endpoint_config(EndpointConfigName=record["steps"]["create_endpoint"]["endpoint_config_name"])
    assert config["ProductionVariants"][0]["InitialInstanceCount"] == 2
    # Cost counts every instance: the same hours at twice the catalog's per-instance price.
    two = DeploymentRecord.model_validate(record)
    one = two.model_copy(update={"instance_count": 1}).cost_so_far()
    assert one is not None and two.cost_so_far() == pytest.approx(2 * one, abs=2e-4)  # still running
    # Two more do not fit a quota of 3 while the first two serve; the refusal counts instances.
    (checkpoint / "notes.txt").write_text("a second training run")
    arn = _start(stack, tar_gz_bytes(checkpoint), "two-more", instance_count=2, instance_type="ml.g6.2xlarge")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "QuotaExceeded", desc
    assert "2 in use" in desc["cause"] and "this deployment needs 2 more" in desc["cause"], desc["cause"]
    endpoints = [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]]
    assert endpoints == [record["endpoint_name"]]  # the refused one left nothing


def test_plan_shows_the_instance_count_and_its_price(checkpoint: Path) -> None:
    code, data = _cli("plan", str(checkpoint), "--region", "us-east-1", "--instance-count", "3", "--json")
    assert code == 0, data
    assert data["instance_count"] == 3 and data["hourly_price"] == 1.22
    assert data["hourly_cost"] == round(3 * 1.22, 4)
    zero = subprocess.run(
        [*MODELDROP, "plan", str(checkpoint), "--instance-count", "0"], capture_output=True, text=True, cwd=ROOT
    )
    assert zero.returncode == 2 and "Traceback" not in zero.stderr


def test_an_endpoint_name_of_ones_own_inside_the_stack_prefix(
    make_stack: Any, archive: bytes, checkpoint: Path
) -> None:
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    stack = make_stack()
    arn = _start(stack, archive, "named-run", endpoint_name="modeldrop-chat-prod")
    assert stack.wait(arn)["status"] == "SUCCEEDED"
    assert _record(stack, "named-run")["endpoint_name"] == "modeldrop-chat-prod"
    sm = stack.client("sagemaker")
    assert sm.describe_endpoint(EndpointName="modeldrop-chat-prod")["EndpointStatus"] == "InService"
    # Outside the prefix the stack's roles could neither create nor delete it: refused before anything.
    arn = _start(stack, archive, "outside-run", endpoint_name="chat-prod")
    desc = stack.wait(arn)
    assert desc["error"] == "RequestInvalid" and "modeldrop-*" in desc["cause"], desc
    # The same name again: the second deployment fails on the name and leaves the first one serving.
    (checkpoint / "notes.txt").write_text("another run")
    arn = _start(stack, tar_gz_bytes(checkpoint), "same-name-run", endpoint_name="modeldrop-chat-prod")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and desc["error"] == "ResourceNameTaken", desc
    assert sm.describe_endpoint(EndpointName="modeldrop-chat-prod")["EndpointStatus"] == "InService"
    assert [e["EndpointName"] for e in sm.list_endpoints()["Endpoints"]] == ["modeldrop-chat-prod"]
    assert sm.describe_endpoint_config(EndpointConfigName="modeldrop-chat-prod")["ProductionVariants"]
    assert sm.describe_model(ModelName="modeldrop-chat-prod")["ModelName"] == "modeldrop-chat-prod"


# ---- the preflight: doctor's cheap checks as part of RegisterDeployment ------------------------


def test_run_local_untrusted_role_is_refused_before_anything_is_created() -> None:
    code, data = _cli("run-local", "--fault", "untrusted-role", "--json")
    assert code == 1 and data["error"] == "ExecutionRoleUnusable", data
    assert "trusts bedrock.amazonaws.com" in data["cause"] and "update-assume-role-policy" in data["cause"]
    states = [s["name"] for s in data["states"]]
    assert "ValidateCheckpoint" not in states and "CreateEndpoint" not in states
    assert data["record"]["failure_class"] == "configuration" and data["leftover_resources"] == []


def test_a_quota_below_the_instance_count_on_every_type_fails_at_registration(make_stack: Any, archive: bytes) -> None:
    from modeldrop.local.emulator import service_quotas

    stack = make_stack()
    service_quotas.set_endpoint_quotas({"ml.g6.2xlarge": 1, "ml.g6e.2xlarge": 0})
    arn = _start(stack, archive, "too-few", instance_types=["ml.g6.2xlarge", "ml.g6e.2xlarge"], instance_count=2)
    desc = stack.wait(arn)
    assert desc["error"] == "QuotaExceeded" and "below the 2 instance(s)" in desc["cause"], desc
    assert "--desired-value 2" in desc["cause"]
    assert "ValidateCheckpoint" not in _states(stack, arn)
    assert stack.leftover_resources() == []
    # One type with enough quota is enough: the preflight passes and records what it saw.
    service_quotas.set_endpoint_quotas({"ml.g6.2xlarge": 1, "ml.g6e.2xlarge": 2})
    arn = _start(stack, archive, "enough", instance_types=["ml.g6.2xlarge", "ml.g6e.2xlarge"], instance_count=2)
    stack.wait(arn)
    assert _record(stack, "enough")["steps"]["preflight"]["quota"].startswith("ml.g6e.2xlarge: 2")


def test_a_stop_while_mark_succeeded_runs_keeps_record_endpoint_and_claim_consistent(
    stack: Any, archive: bytes
) -> None:
    """The execution ends ABORTED after MarkSucceeded wrote `succeeded`: the deployment is complete, so it
    is kept (record succeeded, endpoint InService, its TTL applies) -- never a succeeded record with its
    endpoint deleted and its version claimed."""
    stack.after["FinalizeFunction"] = lambda _event: _stop_all(stack)
    arn = _start(stack, archive, "late-stop")
    assert stack.wait(arn)["status"] == "ABORTED"
    stack.settle()
    record = _record(stack, "late-stop")
    assert record["status"] == "succeeded"
    endpoints = stack.client("sagemaker").list_endpoints()["Endpoints"]
    assert [e["EndpointStatus"] for e in endpoints] == ["InService"]
    clock.advance(10 * 3600)  # and its TTL ends it as any other
    stack.invoke_function("ReaperFunction", {})
    stack.settle()
    assert _record(stack, "late-stop")["status"] == "expired" and stack.leftover_resources() == []
