from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")
# run-local's engine check (a vLLM probe, tens of seconds per deployment on a busy CPU) is on by default
# where the engine venv is: the tests that judge it ask for it (--engine-check, EngineCheck Enabled), and
# every other run-local a test starts -- in-process or as a subprocess inheriting this -- goes without.
os.environ.setdefault("MODELDROP_ENGINE_CHECK", "Disabled")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def make_stack() -> Iterator[Callable[..., Any]]:
    """Build the emulated stack (with its own hosting) inside one mock_aws; everything stops after."""
    from moto import mock_aws

    from modeldrop.contracts import clock
    from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
    from modeldrop.local.stack.build import build_stack

    clock.reset()
    built: list[Any] = []
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):

        def make(parameters: dict[str, str] | None = None, root: Path = ROOT, **hosting: Any) -> Any:
            # The EngineCheck step's probe takes seconds per deployment: on where a test asks for it.
            parameters = {"EngineCheck": "Disabled", **(parameters or {})}
            stack = build_stack(root, parameters, hosting=LocalHosting(**hosting))
            built.append(stack)
            return stack

        try:
            yield make
        finally:
            for stack in built:
                stack.close()
    clock.reset()


@pytest.fixture
def stack(make_stack: Callable[..., Any]) -> Any:
    return make_stack()


@contextlib.contextmanager
def served_dispatch(stack: Any, functions: Callable[[str], Any]) -> Iterator[Any]:
    """STACK's emulated account served over HTTP (a moto server in this process), and its Lambda
    invocations answered by FUNCTIONS(endpoint_url) -- functions that run outside this process and reach
    the account as a deployed function reaches AWS. Restored and closed after."""
    from moto.server import ThreadedMotoServer

    from modeldrop.local.emulator import moto_shims

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    answering = functions(f"http://{host}:{port}")
    moto_shims.set_dispatcher(answering.dispatch)
    try:
        yield answering
    finally:
        moto_shims.set_dispatcher(stack.dispatch)
        answering.close()
        server.stop()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    from modeldrop.local.samples.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def archive(checkpoint: Path) -> bytes:
    from modeldrop.local.samples.checkpoint import tar_gz_bytes

    return tar_gz_bytes(checkpoint)


def create_endpoint(
    stack: Any,
    name: str,
    archive: bytes,
    *,
    managed_by: str = "modeldrop-local",
    expires_at: str = "2099-01-01T00:00:00Z",
    env: dict[str, str] | None = None,
    tags: list[dict[str, str]] | None = None,
) -> None:
    """Model, config and endpoint as the CreateEndpoint step makes them, from the archive's files at a
    prefix no rule watches (a served copy is always uncompressed)."""
    from modeldrop.aws.sagemaker.sagemaker_resources import create_all, tags_for

    create_all(
        stack.client("sagemaker"),
        name,
        "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:x",
        put_files(stack, "fixtures/weights/", archive),
        env if env is not None else {"SM_VLLM_MAX_MODEL_LEN": "4096", "SM_VLLM_MODEL": "/opt/ml/model"},
        "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker",
        "ml.g6.2xlarge",
        600,
        600,
        tags if tags is not None else tags_for(managed_by, name, expires_at),
    )


def put_files(stack: Any, prefix: str, archive: bytes) -> str:
    """The archive's files under PREFIX, as a served copy holds them; returns the prefix's URI."""
    import io
    import tarfile

    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member) if member.isfile() else None
            if data is not None:
                key = prefix + member.name.removeprefix("./")
                stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=data.read())
    return f"s3://{stack.bucket}/{prefix}"


def subscribe(stack: Any, pattern: str = '{"source": ["modeldrop"]}') -> tuple[Any, str]:
    """A training pipeline's view: an SQS queue subscribed to the modeldrop bus."""
    sqs = stack.client("sqs")
    url = sqs.create_queue(QueueName="pipeline-events")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events = stack.client("events")
    bus = stack.resources["EventBus"]
    events.put_rule(Name="to-pipeline", EventBusName=bus, EventPattern=pattern)
    events.put_targets(Rule="to-pipeline", EventBusName=bus, Targets=[{"Id": "q", "Arn": arn}])
    return sqs, url


@pytest.fixture
def deployed(stack: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The emulated stack plus the CloudFormation stack `sam deploy` would have made, with its outputs."""
    outputs = {
        "StateMachineArn": stack.state_machine_arn,
        "DeploymentsTableName": stack.table_name,
        "ArtifactBucketName": stack.bucket,
        "EventBusName": stack.resources["EventBus"],
    }
    template = {
        "Resources": {"Handle": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    stack.client("cloudformation").create_stack(StackName="modeldrop-local", TemplateBody=json.dumps(template))
    monkeypatch.setenv("MODELDROP_POLL_SECONDS", "0.02")
    return stack


# xdist hands each worker whole files (--dist loadfile) in collection order: the longest files are
# collected first, so that no worker is left running one at the end while the others idle. A
# scheduling hint for CI's wall time (from `--durations`), not an order any test depends on.
LONGEST_FIRST = (
    "test_doc_examples.py",
    "test_engine_check.py",
    "test_doc_examples_local.py",
    "test_cli.py",
    "test_capacity_and_phases.py",
    "test_real_engine.py",
    "test_isolation.py",
    "test_engine_image.py",
    "test_engine_oracle.py",
    "test_state_machine.py",
    "test_hosting_fidelity.py",
    "test_idle_channels.py",
    "test_channels.py",
    "test_shared_adapters.py",
    "test_channel_requests.py",
    "test_adapter_channels.py",
    "test_shared_operate.py",
    "test_hybrid_plan.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's own order is kept
