"""Scenarios through the real ASL (moto's interpreter) with the real handlers in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import CHAT_CUT, CHAT_OK

from modeldrop.local.moto_shims import EndpointScript
from modeldrop.sample_checkpoint import tar_gz_bytes, write_checkpoint


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
    from modeldrop.models import deployment_id_for

    item = stack.table().get_item(Key={"deployment_id": deployment_id_for(desc["name"])}).get("Item")
    assert item is not None
    return item


def _subscribe(stack: Any) -> tuple[Any, str]:
    """A training pipeline's view: an SQS queue subscribed to the modeldrop bus."""
    sqs = stack.client("sqs")
    url = sqs.create_queue(QueueName="pipeline-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events = stack.client("events")
    bus = stack.resources["EventBus"]
    events.put_rule(Name="to-pipeline", EventBusName=bus, EventPattern=json.dumps({"source": ["modeldrop"]}))
    events.put_targets(Rule="to-pipeline", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    return sqs, url


def _received(sqs: Any, url: str) -> list[dict[str, Any]]:
    messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
    return [json.loads(m["Body"]) for m in messages]


def test_happy_path_from_s3_event(stack: Any, archive: bytes) -> None:
    sqs, url = _subscribe(stack)
    stack.queue_chat_answers([CHAT_OK, CHAT_OK])
    _upload(stack, "runs/exp1/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    output = json.loads(desc["output"])
    assert output["status"] == "succeeded"
    assert output["env"]["SM_VLLM_MAX_NUM_SEQS"] == "32"
    assert output["env"]["SM_VLLM_GPU_MEMORY_UTILIZATION"] == "0.90"
    assert output["image"].startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:")
    assert output["eval"]["passed"] is True and output["eval"]["cases"] == 2
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
    assert json.loads(report["Body"].read())["tensor_count"] == 62
    [event] = _received(sqs, url)
    assert event["detail-type"] == "Deployment Succeeded"
    assert event["detail"]["endpoint_name"] == output["endpoint_name"] and event["detail"]["hourly_price"] == "1.22"


def test_direct_start_with_prefix_and_overrides(stack: Any, checkpoint: Path) -> None:
    s3 = stack.client("s3")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"prefix-run/{path.name}", Body=path.read_bytes())
    stack.queue_chat_answers([CHAT_OK, CHAT_OK])
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
    model = stack.client("sagemaker").describe_model(ModelName="modeldrop-pipeline-run-7")
    assert model["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["CompressionType"] == "None"


def test_endpoint_failed_records_reason_and_deletes_everything(stack: Any, archive: bytes) -> None:
    sqs, url = _subscribe(stack)
    reason = "The primary container for production variant AllTraffic did not pass the ping health check."
    stack.hosting.plan(EndpointScript(statuses=["Creating", "Creating", "Failed"], failure_reason=reason))
    _upload(stack, "m/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "EndpointFailed"
    item = _record(stack, desc)
    assert item["status"] == "failed"
    assert item["failure_reason"] == reason
    assert item["failure_class"] == "endpoint"
    teardown = json.loads(item["steps"]["teardown"])
    assert teardown["deleted"] == [f"{k}/{item['endpoint_name']}" for k in ("endpoint", "endpoint-config", "model")]
    assert stack.leftover_resources() == []
    [event] = _received(sqs, url)
    assert event["detail-type"] == "Deployment Failed"
    assert event["detail"]["error"] == "EndpointFailed" and event["detail"]["failure_reason"] == reason


def test_deadline_exceeded_while_creating(stack: Any, archive: bytes) -> None:
    stack.hosting.plan(EndpointScript(statuses=["Creating"]))
    _upload(stack, "slow/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "DeployDeadlineExceeded"
    polls = [i for i in stack.invocations if i.function == "PollEndpointFunction"]
    # Default deadline 2700 s at 30 s per poll: the virtual clock runs the real schedule.
    assert 85 <= len(polls) <= 95
    assert _record(stack, desc)["failure_class"] == "endpoint"
    assert stack.leftover_resources() == []


def test_refused_checkpoint_creates_no_sagemaker_resource(stack: Any, tmp_path: Path) -> None:
    broken = write_checkpoint(tmp_path / "broken", drop_kv_shared=True)
    _upload(stack, "e4b/model.tar.gz", tar_gz_bytes(broken))
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "CheckpointRefused"
    assert "KV_SHARED_TENSORS_MISSING" in desc["cause"]
    assert "CreateEndpointFunction" not in {i.function for i in stack.invocations}
    assert stack.leftover_resources() == []
    assert _record(stack, desc)["failure_class"] == "checkpoint"


def test_truncated_answer_fails_the_eval_and_tears_down(stack: Any, archive: bytes) -> None:
    stack.queue_chat_answers([CHAT_CUT, CHAT_OK])
    _upload(stack, "cut/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "EvalFailed"
    assert "truncated" in desc["cause"]
    assert stack.leftover_resources() == []


def test_duplicate_s3_event_starts_one_execution(stack: Any, archive: bytes) -> None:
    stack.queue_chat_answers([CHAT_OK, CHAT_OK])
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
    stack.queue_chat_answers([CHAT_OK, CHAT_OK])
    _upload(stack, "retry/model.tar.gz", archive)
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    validate_calls = [i for i in stack.invocations if i.function == "ValidateFunction"]
    assert [i.error for i in validate_calls] == ["Lambda.ServiceException", "Lambda.TooManyRequestsException", None]


def test_stray_objects_start_nothing(stack: Any) -> None:
    for key in ("notes.txt", "runs/model.tar.gz.tmp", "runs/config.json", "runs/model-00001-of-00002.safetensors"):
        _upload(stack, key, b"x")
    assert _executions(stack) == []
    assert not [i for i in stack.invocations if i.function == "StarterFunction"]


def test_marker_closes_a_prefix_with_overrides(stack: Any, checkpoint: Path) -> None:
    for path in sorted(checkpoint.iterdir()):
        _upload(stack, f"shards/{path.name}", path.read_bytes())
    assert _executions(stack) == []  # shards alone start nothing
    stack.queue_chat_answers([CHAT_OK, CHAT_OK])
    _upload(stack, "shards/modeldrop.json", json.dumps({"engine": "sglang", "ttl_hours": 1}).encode())
    desc = _only_execution(stack)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"), stack.invocations)
    assert json.loads(desc["output"])["env"]["SM_SGLANG_MAX_RUNNING_REQUESTS"] == "32"


def test_bad_marker_is_rejected_once_and_starts_nothing(stack: Any, checkpoint: Path) -> None:
    _upload(stack, "shards/config.json", (checkpoint / "config.json").read_bytes())
    _upload(stack, "shards/modeldrop.json", b'{"engine": "vllm", "role_arn": "arn:aws:iam::1:role/x"}')
    starter = [i for i in stack.invocations if i.function == "StarterFunction"]
    # Rejected, not raised: an error would make EventBridge redeliver the same bad marker.
    assert [i.error for i in starter] == [None]
    assert _executions(stack) == []


def test_bad_request_fails_fast_without_a_record(stack: Any) -> None:
    arn = stack.start({"artifact_uri": "https://example.com/model.tar.gz"}, name="bad-request")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED"
    assert desc["error"] == "RequestInvalid"
    assert "artifact_uri" in desc["cause"]
    assert stack.table().scan()["Items"] == []
    assert {i.function for i in stack.invocations} == {"NormalizeFunction"}


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
