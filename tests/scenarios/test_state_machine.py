"""Scenarios through the real ASL (moto's interpreter) with the real handlers in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import subscribe

from modeldrop.local.samples.checkpoint import BROKEN_DROP, tar_gz_bytes, write_checkpoint


def _executions(stack: Any) -> list[dict[str, Any]]:
    sfn = stack.client("stepfunctions")
    return sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]


def _upload(stack: Any, key: str, body: bytes) -> None:
    stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=body)


def _only_execution(stack: Any) -> dict[str, Any]:
    executions = _executions(stack)
    assert len(executions) == 1, executions
    return stack.wait(executions[0]["executionArn"])


def _record(stack: Any, desc: dict[str, Any]) -> dict[str, Any]:
    item = stack.table().get_item(Key={"deployment_id": stack.deployment_id(desc["name"])}).get("Item")
    assert item is not None
    return item


def _received(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def test_happy_path_from_s3_event(stack: Any, archive: bytes) -> None:
    sqs, url = subscribe(stack)
    _upload(stack, "runs/exp1/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    output = json.loads(desc["output"])
    assert output["status"] == "succeeded"
    assert output["env"]["SM_VLLM_MAX_NUM_SEQS"] == "32"
    assert output["env"]["SM_VLLM_GPU_MEMORY_UTILIZATION"] == "0.90"
    assert output["image"].startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:")
    assert output["eval"]["passed"] is True and output["eval"]["cases"] == 3
    assert output["eval"]["ttft_p50_s"] > 0 and output["eval"]["tokens_per_s_p50"] > 0
    item = _record(stack, desc)
    assert item["status"] == "succeeded"
    assert {"validate", "resolve_image", "build_env", "create_endpoint", "smoke_eval", "result"} <= set(item["steps"])
    sm = stack.client("sagemaker")
    ep = sm.describe_endpoint(EndpointName=output["endpoint_name"])
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=ep["EndpointArn"])["Tags"]}
    assert tags["modeldrop:managed-by"] == "modeldrop-local"
    assert tags["modeldrop:expires-at"] == item["expires_at"]
    # The full reports live in S3 next to the artifact, not in the state.
    report = stack.client("s3").get_object(
        Bucket=stack.bucket, Key=f"runs/exp1/modeldrop-reports/{item['deployment_id']}/validation.json"
    )
    assert json.loads(report["Body"].read())["tensor_count"] == 107
    markdown = (
        stack.client("s3")
        .get_object(Bucket=stack.bucket, Key=f"runs/exp1/modeldrop-reports/{item['deployment_id']}/eval.md")["Body"]
        .read()
        .decode()
    )
    assert "PASSED" in markdown and f"`{output['endpoint_name']}`" in markdown
    # The endpoint was served by a real process, which its log group shows.
    logs = stack.client("logs").filter_log_events(logGroupName=f"/aws/sagemaker/Endpoints/{output['endpoint_name']}")
    assert any("Application startup complete" in e["message"] for e in logs["events"])
    [event] = _received(sqs, url)
    assert event["detail-type"] == "Deployment Succeeded"
    assert event["detail"]["endpoint_name"] == output["endpoint_name"] and event["detail"]["hourly_price"] == "1.22"


def test_direct_start_with_prefix_and_overrides(stack: Any, checkpoint: Path) -> None:
    s3 = stack.client("s3")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"prefix-run/{path.name}", Body=path.read_bytes())
    arn = stack.start(
        {"artifact_uri": f"s3://{stack.bucket}/prefix-run/", "engine": "lmi", "max_num_seqs": 16}, name="pipeline-run-7"
    )
    desc = stack.wait(arn)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    env = json.loads(desc["output"])["env"]
    assert env["OPTION_ROLLING_BATCH"] == "vllm"
    assert env["OPTION_TENSOR_PARALLEL_DEGREE"] == "max"
    assert env["OPTION_MAX_ROLLING_BATCH_SIZE"] == "16"
    assert env["HF_MODEL_ID"] == "/opt/ml/model"
    model = stack.client("sagemaker").describe_model(ModelName=json.loads(desc["output"])["endpoint_name"])
    assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["CompressionType"] == "None"


def test_engine_oom_fails_the_endpoint_with_the_cause_from_its_logs(stack: Any, archive: bytes) -> None:
    sqs, url = subscribe(stack)
    stack.hosting.plan("oom")
    _upload(stack, "m/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "EndpointFailed"
    item = _record(stack, desc)
    assert item["status"] == "failed"
    assert "did not pass the ping health check" in item["failure_reason"]
    assert item["failure_class"] == "endpoint"
    failure = json.loads(item["steps"]["failure"])
    assert failure["diagnosis"] == "the engine ran out of GPU memory while loading"
    assert any("CUDA out of memory" in line for line in failure["log_excerpt"])
    assert "startup timeout will not help" in failure["hint"]
    teardown = json.loads(item["steps"]["teardown"])
    name = item["endpoint_name"]
    served = f"s3://{stack.bucket}/modeldrop-served/{item['deployment_id']}/"
    assert teardown["deleted"][:3] == [f"endpoint/{name}", f"endpoint-config/{name}", f"model/{name}"]
    # The served copy is the archive's files, uncompressed: every one of them went.
    assert f"{served}config.json" in teardown["deleted"] and all(d.startswith(served) for d in teardown["deleted"][3:])
    assert stack.leftover_resources() == []
    [event] = _received(sqs, url)
    assert event["detail-type"] == "Deployment Failed"
    assert event["detail"]["error"] == "EndpointFailed" and "ping health check" in event["detail"]["failure_reason"]


def test_no_capacity_fails_without_a_log_group(stack: Any, archive: bytes) -> None:
    stack.hosting.plan("capacity")
    _upload(stack, "cap/model.tar.gz", archive)
    desc = _only_execution(stack)
    # One instance type, no capacity: the fallback list is used up at once.
    assert desc["error"] == "CapacityUnavailable" and "ml.g6.2xlarge" in desc["cause"]
    item = _record(stack, desc)
    assert item["failure_reason"].startswith("InsufficientInstanceCapacity")
    assert json.loads(item["steps"]["failure"])["log_excerpt"] == []
    assert stack.client("logs").describe_log_groups(logGroupNamePrefix="/aws/sagemaker/Endpoints/")["logGroups"] == []
    assert stack.leftover_resources() == []


def test_slow_start_fails_at_the_startup_health_check_timeout(make_stack: Any, archive: bytes) -> None:
    # A short real-time grace: the process never answers /ping, so only the virtual timeout matters.
    stack = make_stack(fault="slow-start", real_startup_grace=0.5)
    _upload(stack, "slowstart/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["error"] == "EndpointFailed"
    failure = json.loads(_record(stack, desc)["steps"]["failure"])
    assert failure["diagnosis"] == "the engine was still loading when the startup health check timed out"
    polls = [i for i in stack.invocations if i.function == "PollEndpointFunction"]
    # The sample's startup timeout is 600 s (virtual), polled every 30 s.
    assert 19 <= len(polls) <= 23
    assert stack.leftover_resources() == []


def test_deadline_exceeded_while_creating(make_stack: Any, archive: bytes) -> None:
    # A deploy deadline shorter than the container's startup timeout: the deadline ends it.
    stack = make_stack({"DeployDeadlineSeconds": "300"}, fault="slow-start", real_startup_grace=0.5)
    _upload(stack, "slow/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "DeployDeadlineExceeded"
    polls = [i for i in stack.invocations if i.function == "PollEndpointFunction"]
    # 300 s at 30 s per poll: the virtual clock runs the real schedule.
    assert 9 <= len(polls) <= 12
    assert _record(stack, desc)["failure_class"] == "endpoint"
    assert stack.leftover_resources() == []


def test_refused_checkpoint_creates_no_sagemaker_resource(stack: Any, tmp_path: Path) -> None:
    broken = write_checkpoint(tmp_path / "broken", drop_kv_shared=True, drop=BROKEN_DROP)
    _upload(stack, "e4b/model.tar.gz", tar_gz_bytes(broken))
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "CheckpointRefused"
    assert "WEIGHTS_MISSING" in desc["cause"]
    assert "CreateEndpointFunction" not in {i.function for i in stack.invocations}
    assert stack.leftover_resources() == []
    assert _record(stack, desc)["failure_class"] == "checkpoint"


def test_truncated_answer_fails_the_eval_and_tears_down(stack: Any, archive: bytes) -> None:
    stack.hosting.plan("truncate")
    _upload(stack, "cut/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "EvalFailed"
    assert "truncated: greeting" in desc["cause"]
    verdict = json.loads(_record(stack, desc)["steps"]["smoke_eval"])
    assert verdict["truncated"] == 3 and verdict["report_markdown_uri"].endswith("eval.md")
    assert stack.leftover_resources() == []


def test_throttled_runtime_is_retried_and_counted(stack: Any, archive: bytes) -> None:
    stack.hosting.plan("throttle")
    _upload(stack, "throttle/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    item = _record(stack, desc)
    uri = item["eval_report_uri"].removeprefix(f"s3://{stack.bucket}/")
    report = json.loads(stack.client("s3").get_object(Bucket=stack.bucket, Key=uri)["Body"].read())
    assert report["cases"][0]["attempts"] == 3 and report["cases"][1]["attempts"] == 1


def test_stream_broken_mid_answer_is_an_error_not_a_pass(stack: Any, archive: bytes) -> None:
    stack.hosting.plan("stream-break")
    _upload(stack, "broken/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["error"] == "EvalFailed"
    assert "errors: greeting" in desc["cause"]
    assert stack.leftover_resources() == []


def test_duplicate_s3_event_starts_one_execution(stack: Any, archive: bytes) -> None:
    _upload(stack, "dup/model.tar.gz", archive)
    first = _only_execution(stack)
    # Redeliver the exact same event, as S3's at-least-once delivery may.
    head = stack.client("s3").head_object(Bucket=stack.bucket, Key="dup/model.tar.gz")
    event = {
        "source": "aws.s3",
        "detail-type": "Object Created",
        "detail": {
            "bucket": {"name": stack.bucket},
            "object": {"key": "dup/model.tar.gz", "version-id": head["VersionId"], "size": len(archive)},
        },
    }
    outcome = stack.invoke_function("StarterFunction", event)
    assert outcome["status"] == "duplicate"
    assert len(_executions(stack)) == 1
    assert first["status"] == "SUCCEEDED"


def test_transient_lambda_error_is_retried(stack: Any, archive: bytes) -> None:
    stack.inject["ValidateFunction"] = ["Lambda.ServiceException", "Lambda.TooManyRequestsException"]
    _upload(stack, "retry/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    validate_calls = [i for i in stack.invocations if i.function == "ValidateFunction"]
    assert [i.error for i in validate_calls] == ["Lambda.ServiceException", "Lambda.TooManyRequestsException", None]


def test_an_inactive_engine_check_function_is_waited_for(stack: Any, archive: bytes) -> None:
    """`--fault engine-check-inactive`: an image function idle for weeks refuses its first invocations
    while Lambda restores it; the EngineCheck task waits it out (without INACTIVE_RETRY it fails there)."""
    from modeldrop.local.scenarios.account_faults import INACTIVE_ERRORS, arm_faults

    arm_faults(stack, frozenset({"engine-check-inactive"}), None)
    _upload(stack, "inactive/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    calls = [i.error for i in stack.invocations if i.function == "EngineCheckFunction"]
    assert calls == [*INACTIVE_ERRORS, None]


def test_an_engine_check_image_lambda_cannot_start_is_not_waited_for(stack: Any, archive: bytes) -> None:
    """CodeArtifactUserFailedException: the image needs a new deploy, and no retry can fix that: the deployment
    fails at EngineCheck on the first answer, nothing created."""
    stack.inject["EngineCheckFunction"] = ["Lambda.CodeArtifactUserFailedException"]
    _upload(stack, "image-failed/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED", desc
    calls = [i.error for i in stack.invocations if i.function == "EngineCheckFunction"]
    assert calls == ["Lambda.CodeArtifactUserFailedException"], calls
    assert "CreateEndpointFunction" not in [i.function for i in stack.invocations]
    assert stack.leftover_resources() == []


def test_stray_objects_start_nothing(stack: Any) -> None:
    for key in ("notes.txt", "runs/model.tar.gz.tmp", "runs/config.json", "runs/model-00001-of-00002.safetensors"):
        _upload(stack, key, b"x")
    assert _executions(stack) == []
    assert not [i for i in stack.invocations if i.function == "StarterFunction"]


def test_marker_closes_a_prefix_with_overrides(stack: Any, checkpoint: Path) -> None:
    for path in sorted(checkpoint.iterdir()):
        _upload(stack, f"shards/{path.name}", path.read_bytes())
    assert _executions(stack) == []  # shards alone start nothing
    _upload(stack, "shards/modeldrop.json", json.dumps({"engine": "lmi", "ttl_hours": 1}).encode())
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    assert json.loads(desc["output"])["env"]["OPTION_MAX_ROLLING_BATCH_SIZE"] == "32"


def test_bad_marker_is_rejected_once_and_starts_nothing(stack: Any, checkpoint: Path) -> None:
    _upload(stack, "shards/config.json", (checkpoint / "config.json").read_bytes())
    _upload(stack, "shards/modeldrop.json", b'{"engine": "vllm", "role_arn": "arn:aws:iam::1:role/x"}')
    starter = [i for i in stack.invocations if i.function == "StarterFunction"]
    # Rejected, not raised: an error would make EventBridge redeliver the same bad marker.
    assert [i.error for i in starter] == [None]
    assert _executions(stack) == []


def test_a_misspelt_marker_is_seen_in_list_all_with_its_close_match(stack: Any, checkpoint: Path) -> None:
    """A marker written straight to S3 with a misspelt key starts nothing, and says why where the user looks:
    a closed `rejected` record `list --all` shows (its reason names the key's close match) and a Deployment
    Rejected event. Redelivered, it is recorded once; the starter's role reaches no other record."""
    from modeldrop.operate.deployment_rows import row_for

    _upload(stack, "typo/config.json", (checkpoint / "config.json").read_bytes())
    for _ in range(2):
        _upload(stack, "typo/modeldrop.json", b'{"instnce_type": "ml.g6e.2xlarge"}')
    assert _executions(stack) == []
    records = stack.registry().deployments()
    assert [r.status for r in records] == ["rejected"] * len(records) and len(records) == 2  # two versions
    record = records[0]
    assert record.deployment_id.startswith("rejected-") and record.endpoint_name is None
    assert "'instnce_type': did you mean 'instance_type'" in str(record.failure_reason), record.failure_reason
    row = row_for(record)  # what `list` and `list --all` print of it
    assert row.status == "rejected" and row.artifact_uri == "s3://" + stack.bucket + "/typo/modeldrop.json"
    assert "did you mean 'instance_type'" in str(row.reason)
    sqs_bodies = [i for i in stack.invocations if i.function == "StarterFunction"]
    assert [i.error for i in sqs_bodies] == [None, None]  # recorded, not raised: no redelivery loop


def test_bad_request_fails_fast_without_a_record(stack: Any) -> None:
    arn = stack.start({"artifact_uri": "https://example.com/model.tar.gz"}, name="bad-request")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "RequestInvalid"
    assert "artifact_uri" in desc["cause"]
    assert stack.table().scan()["Items"] == []
    stack.settle()
    # The rule on the state machine's status changes looks, finds no record, and does nothing.
    assert {i.function for i in stack.invocations} == {"NormalizeFunction", "ExecutionEndedFunction"}


def test_quota_exceeded_is_not_retried(stack: Any, archive: bytes, monkeypatch: Any) -> None:
    from botocore.exceptions import ClientError
    from moto.sagemaker import models as sm

    calls = []

    def refuse(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        raise ClientError(
            {
                "Error": {
                    "Code": "ResourceLimitExceeded",
                    "Message": "The account-level service limit 'ml.g6.2xlarge for endpoint usage' is 0 Instances",
                }
            },
            "CreateEndpoint",
        )

    monkeypatch.setattr(sm.SageMakerModelBackend, "create_endpoint", refuse)
    _upload(stack, "quota/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["error"] == "QuotaExceeded"
    assert "for endpoint usage" in desc["cause"]
    assert [i.function for i in stack.invocations].count("CreateEndpointFunction") == 1
    assert stack.leftover_resources() == []


def test_quota_precheck_refuses_before_anything_is_created(stack: Any, archive: bytes) -> None:
    from modeldrop.local.emulator import service_quotas

    service_quotas.set_endpoint_quotas({"ml.g6.2xlarge": 0})
    _upload(stack, "noquota/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["error"] == "QuotaExceeded"
    assert "'ml.g6.2xlarge for endpoint usage' (L-" in desc["cause"]
    assert "request-service-quota-increase" in desc["cause"]
    # A quota of 0 is known before anything is read: RegisterDeployment's preflight refuses it.
    invoked = [i.function for i in stack.invocations]
    assert "ValidateFunction" not in invoked and "CreateEndpointFunction" not in invoked, invoked
    assert stack.leftover_resources() == [] and stack.hosting.endpoints == {}


def test_secrets_reach_the_container_but_never_the_state_or_the_record(stack: Any, archive: bytes) -> None:
    """A secret the container needs is in its env and nowhere else; a Hub token is not passed at all,
    since the weights come from S3 (and DescribeModel shows the env in plain text)."""
    value, token = "wandb_live_5ecret_value", "hf_live_5ecret_value_0123456789"
    secrets = stack.client("secretsmanager")
    secrets.create_secret(Name="modeldrop/wandb", SecretString=json.dumps({"key": value}))
    secrets.create_secret(Name="modeldrop/hf", SecretString=json.dumps({"token": token}))
    _upload(stack, "gated/weights.tar.gz", archive)
    refs = {"WANDB_API_KEY": "secretsmanager:modeldrop/wandb#key", "HF_TOKEN": "secretsmanager:modeldrop/hf#token"}
    arn = stack.start({"artifact_uri": f"s3://{stack.bucket}/gated/weights.tar.gz", "secrets": refs}, name="gated-run")
    desc = stack.wait(arn)
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    name = json.loads(desc["output"])["endpoint_name"]
    environment = stack.client("sagemaker").describe_model(ModelName=name)["PrimaryContainer"]["Environment"]
    assert environment["WANDB_API_KEY"] == value and "HF_TOKEN" not in environment
    process = stack.hosting.endpoints[name].process
    environ = Path(f"/proc/{process.pid}/environ").read_bytes()
    assert value.encode() in environ and token.encode() not in environ
    history = stack.client("stepfunctions").get_execution_history(executionArn=arn, maxResults=1000)
    for secret in (value, token):
        assert secret not in json.dumps(history, default=str) and secret not in desc["output"]
    item = _record(stack, desc)
    assert value not in json.dumps(item, default=str) and token not in json.dumps(item, default=str)
    assert json.loads(item["request"])["secrets"] == refs
    warnings = json.loads(item["steps"]["build_env"])["warnings"]
    assert any("HF_TOKEN not passed to the container" in w for w in warnings), warnings


def test_secret_outside_the_prefix_is_refused_at_the_door(stack: Any) -> None:
    arn = stack.start(
        {"artifact_uri": f"s3://{stack.bucket}/x/model.tar.gz", "secrets": {"HF_TOKEN": "ssm:/other-team/token"}},
        name="bad-secret",
    )
    desc = stack.wait(arn)
    assert desc["error"] == "RequestInvalid" and "outside this stack's secrets prefix" in desc["cause"]
    assert stack.table().scan()["Items"] == []


def test_one_artifact_version_gives_one_deployment_whichever_entry_points_fire(stack: Any, archive: bytes) -> None:
    """The README's pipeline mistake: upload into the watched bucket and also start directly, at once."""
    key = "runs/both/model.tar.gz"
    _upload(stack, key, archive)  # the S3 rule starts one execution
    direct = stack.start({"artifact_uri": f"s3://{stack.bucket}/{key}"}, name="pipeline-run-1")
    retried = stack.start({"artifact_uri": f"s3://{stack.bucket}/{key}"}, name="pipeline-run-1-retry")
    outcomes = [stack.wait(e["executionArn"]) for e in _executions(stack)]
    assert direct in {d["executionArn"] for d in outcomes} and retried in {d["executionArn"] for d in outcomes}
    verdicts = sorted((d["status"], d.get("error")) for d in outcomes)
    assert verdicts == [("FAILED", "DuplicateDeployment"), ("FAILED", "DuplicateDeployment"), ("SUCCEEDED", None)]
    endpoints = stack.client("sagemaker").list_endpoints()["Endpoints"]
    assert len(endpoints) == 1, endpoints
    loser = next(d for d in outcomes if d["status"] == "FAILED")
    assert "already deployed by" in loser["cause"] and "nothing was created" in loser["cause"]


def test_a_new_version_of_the_same_key_is_a_new_deployment(stack: Any, archive: bytes) -> None:
    """Other bytes under the same key are a new deployment; the same bytes again (a new S3 version, but
    the same content) are the deployment that serves them already."""
    import gzip

    key = "runs/again/model.tar.gz"
    _upload(stack, key, archive)
    first = _only_execution(stack)
    assert first["status"] == "SUCCEEDED"
    _upload(stack, key, gzip.compress(gzip.decompress(archive), mtime=1))  # other bytes: a new version
    runs = [stack.wait(e["executionArn"]) for e in _executions(stack)]
    assert sorted(d["status"] for d in runs) == ["SUCCEEDED", "SUCCEEDED"], [
        (d["status"], d.get("cause")) for d in runs
    ]
    _upload(stack, key, archive)  # the first bytes again: the first deployment serves them already
    again = [stack.wait(e["executionArn"]) for e in _executions(stack)]
    assert sorted((d["status"], d.get("error")) for d in again) == [
        ("FAILED", "DuplicateDeployment"),
        ("SUCCEEDED", None),
        ("SUCCEEDED", None),
    ]


def test_uploads_under_direct_start_nothing(stack: Any, archive: bytes) -> None:
    _upload(stack, "direct/runs/7/model.tar.gz", archive)
    assert _executions(stack) == []


def test_bookkeeping_after_a_passed_eval_is_retried_and_never_tears_down(stack: Any, archive: bytes) -> None:
    stack.inject["FinalizeFunction"] = ["ProvisionedThroughputExceededException"]
    _upload(stack, "book/once/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    finalize = [i for i in stack.invocations if i.function == "FinalizeFunction"]
    assert [i.error for i in finalize] == ["ProvisionedThroughputExceededException", None]


def test_bookkeeping_that_keeps_failing_keeps_the_healthy_endpoint(stack: Any, archive: bytes) -> None:
    stack.inject["FinalizeFunction"] = ["ProvisionedThroughputExceededException"] * 10
    _upload(stack, "book/always/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED" and desc["error"] == "DeploymentUnrecorded", desc
    assert "stays up until its TTL" in desc["cause"]
    endpoints = stack.client("sagemaker").list_endpoints()["Endpoints"]
    assert [e["EndpointStatus"] for e in endpoints] == ["InService"]
    assert not any(i.function in ("TeardownFunction", "RecordFailureFunction") for i in stack.invocations)


def test_a_burst_of_uploads_of_the_same_bytes_ends_with_one_deployment(stack: Any, archive: bytes) -> None:
    """100 re-uploads of one archive in a burst: each is a new S3 version and a new event, but the same
    content, so one deployment (the others DuplicateDeployment before anything is created)."""
    key = "runs/burst/model.tar.gz"
    for _ in range(100):
        _upload(stack, key, archive)
    outcomes = [stack.wait(e["executionArn"], timeout=600) for e in _executions(stack)]
    verdicts = [(d["status"], d.get("error")) for d in outcomes]
    assert verdicts.count(("SUCCEEDED", None)) == 1, sorted(set(verdicts))
    assert {v for v in verdicts if v[0] != "SUCCEEDED"} <= {("FAILED", "DuplicateDeployment")}
    assert len(stack.client("sagemaker").list_endpoints()["Endpoints"]) == 1
