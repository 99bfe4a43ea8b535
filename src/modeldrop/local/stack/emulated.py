"""The SAM stack, emulated: resources and functions read from template.yaml, created in moto.

The state machine definition, its substitutions, the functions' handlers and environment, and the
S3 -> EventBridge rule pattern all come from the same files `sam deploy` uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import boto3
import yaml
from botocore.config import Config

from modeldrop.aws import clients
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.local.emulator import moto_shims
from modeldrop.local.emulator.iam.enforcement import ACCOUNT, Principal, acting_as
from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
from modeldrop.local.emulator.sagemaker.runtime import LocalRuntime

REGION = "us-east-1"
STACK_NAME = "modeldrop-local"


def project_root() -> Path:
    env = os.environ.get("MODELDROP_ROOT")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd(), *Path.cwd().parents, *Path(__file__).resolve().parents]
    for path in candidates:
        if (path / "template.yaml").is_file() and (path / "statemachine").is_dir():
            return path
    raise FileNotFoundError("template.yaml not found: run from the modeldrop checkout or set MODELDROP_ROOT")


class _CfnLoader(yaml.SafeLoader):
    pass


def _tag(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    name = "Fn::" + suffix if suffix not in ("Ref", "Condition") else suffix
    if isinstance(node, yaml.ScalarNode):
        value: Any = loader.construct_scalar(node)
        if suffix == "GetAtt":
            value = value.split(".", 1)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_mapping(node, deep=True)
    return {name: value}


_CfnLoader.add_multi_constructor("!", _tag)


def load_template(root: Path) -> dict[str, Any]:
    with (root / "template.yaml").open() as fh:
        data: dict[str, Any] = yaml.load(fh, Loader=_CfnLoader)
    return data


_TEST_CLIENTS = Config(retries={"mode": "standard", "max_attempts": 5})


@dataclass
class FunctionSpec:
    logical_id: str
    name: str
    code_dir: Path
    handler: str
    env: dict[str, str]
    arn: str = ""
    principal: Principal | None = None  # its role and the template's statements, enforced on its calls
    # Asynchronous invocations (EventBridge targets): Lambda's retries, then the on-failure destination.
    max_retries: int = 2
    on_failure: str | None = None  # an SQS queue ARN
    timeout: float = 3.0  # seconds (the template's Timeout, else its Globals', else Lambda's 3)


@dataclass
class Invocation:
    function: str
    seconds: float
    error: str | None


_NO_VALUE = object()  # Ref AWS::NoValue


@dataclass
class EmulatedStack:
    root: Path
    parameters: dict[str, str]
    conditions: dict[str, Any] = field(default_factory=dict)
    functions: dict[str, FunctionSpec] = field(default_factory=dict)
    resources: dict[str, str] = field(default_factory=dict)
    state_machine_arn: str = ""
    hosting: LocalHosting = field(default_factory=LocalHosting)
    runtime: LocalRuntime | None = None
    invocations: list[Invocation] = field(default_factory=list)
    inject: dict[str, list[str]] = field(default_factory=dict)
    # Called with a function's event after it succeeded (a fault that strikes between two steps).
    after: dict[str, Callable[[dict[str, Any]], None]] = field(default_factory=dict)
    extra_env: dict[str, str] = field(default_factory=dict)
    _modules: dict[str, ModuleType] = field(default_factory=dict)
    # Reentrant: a function's own S3 write can deliver an event to another function in the same thread.
    _env_lock: threading.RLock = field(default_factory=threading.RLock)

    # ---- template resolution -------------------------------------------------------------
    def resolve(self, value: Any) -> Any:
        """VALUE with the template's intrinsics evaluated (AWS::NoValue leaves its key or item out)."""
        resolved = self._resolve(value)
        return None if resolved is _NO_VALUE else resolved

    def condition(self, name: str) -> bool:
        return bool(self._resolve(self.conditions[name]))

    def _resolve(self, value: Any) -> Any:
        if isinstance(value, dict) and len(value) == 1:
            ((key, arg),) = value.items()
            intrinsic = self._INTRINSICS.get(key)
            if intrinsic is not None:
                return intrinsic(self, arg)
        if isinstance(value, dict):
            items = {k: self._resolve(v) for k, v in value.items()}
            return {k: v for k, v in items.items() if v is not _NO_VALUE}
        if isinstance(value, list):
            return [v for v in (self._resolve(item) for item in value) if v is not _NO_VALUE]
        return value

    def _ref(self, arg: str) -> Any:
        pseudo = {"AWS::StackName": STACK_NAME, "AWS::Region": REGION, "AWS::NoValue": _NO_VALUE}
        if arg in pseudo:
            return pseudo[arg]
        if arg in self.parameters:
            return self.parameters[arg]
        return self.resources.get(arg, f"unresolved:{arg}")

    def _get_att(self, arg: list[str]) -> Any:
        logical, attr = arg
        if logical in self.functions:
            return self.functions[logical].arn
        return self.resources.get(f"{logical}.{attr}", f"unresolved:{logical}.{attr}")

    def _sub(self, arg: Any) -> str:
        text = arg if isinstance(arg, str) else arg[0]
        names = {
            "AWS::StackName": STACK_NAME,
            "AWS::Region": REGION,
            "AWS::Partition": "aws",
            "AWS::AccountId": ACCOUNT,
            **self.parameters,
            **self.resources,
        }
        for k, v in names.items():
            text = text.replace("${" + k + "}", str(v))
        return str(text)

    _INTRINSICS: ClassVar[dict[str, Callable[[EmulatedStack, Any], Any]]] = {
        "Ref": _ref,
        "Fn::GetAtt": _get_att,
        "Fn::If": lambda self, arg: self._resolve(arg[1] if self.condition(arg[0]) else arg[2]),
        "Fn::Equals": lambda self, arg: str(self._resolve(arg[0])) == str(self._resolve(arg[1])),
        "Fn::Not": lambda self, arg: not self._resolve(arg[0]),
        "Condition": lambda self, arg: self.condition(arg),
        "Fn::Sub": _sub,
    }

    # ---- in-process Lambda dispatch --------------------------------------------------------
    def _module(self, spec: FunctionSpec) -> ModuleType:
        if spec.logical_id not in self._modules:
            path = spec.code_dir / "app.py"
            mod_name = f"modeldrop_fn_{spec.code_dir.name}"
            loader = importlib.util.spec_from_file_location(mod_name, path)
            assert loader and loader.loader
            module = importlib.util.module_from_spec(loader)
            sys.modules[mod_name] = module
            loader.loader.exec_module(module)
            self._modules[spec.logical_id] = module
        return self._modules[spec.logical_id]

    def dispatch(self, function_name: str, payload: dict[str, Any]) -> tuple[str, bool, str]:
        spec = next((f for f in self.functions.values() if f.name == function_name), None)
        if spec is None:
            return json.dumps({"errorType": "ResourceNotFoundException", "errorMessage": function_name}), True, ""
        started = time.monotonic()
        queued = self.inject.get(spec.logical_id)
        if queued:
            error = queued.pop(0)
            self._record(spec.logical_id, started, error)
            if error == "States.Timeout":  # the interpreter's own task timeout: an error with no Cause
                raise TimeoutError(f"injected {error}")
            return json.dumps({"errorType": error, "errorMessage": f"injected {error}"}), True, ""
        context = _Context(spec.name, spec.arn, spec.timeout)
        with self._env_lock, _patched_env({**spec.env, **self.extra_env}), acting_as(spec.principal):
            try:
                # Imported under the function's env: Powertools reads POWERTOOLS_* at import.
                handler_fn = getattr(self._module(spec), spec.handler.split(".")[-1])
                result = handler_fn(payload, context)
            except Exception as exc:
                self._record(spec.logical_id, started, type(exc).__name__)
                return moto_shims.error_payload(exc), True, ""
        if context.spent() > spec.timeout:
            # Lambda would have killed it: the error Lambda returns (a test's wall clock is not counted,
            # only what the handler waited on the emulator's clock, so a busy machine cannot fail it).
            self._record(spec.logical_id, started, TIMED_OUT)
            message = f"Task timed out after {spec.timeout:.2f} seconds ({context.spent():.0f} s of waits)"
            return json.dumps({"errorType": TIMED_OUT, "errorMessage": message}), True, ""
        self._record(spec.logical_id, started, None)
        if spec.logical_id in self.after:
            self.after[spec.logical_id](payload)
        return json.dumps(result, default=str), False, ""

    def invoke_async(self, function_name: str, event: dict[str, Any]) -> None:
        """An asynchronous invocation, as Lambda runs one: the function, retried up to its
        MaximumRetryAttempts when it fails, then the event and the error to its on-failure destination."""
        spec = next((f for f in self.functions.values() if f.name == function_name), None)
        attempts = 1 + (spec.max_retries if spec else 0)
        payload, errored = "", False
        for _ in range(attempts):
            payload, errored, _logs = moto_shims.dispatch(function_name, event)
            if not errored:
                return
        if spec is None or not spec.on_failure:
            return  # dropped, as Lambda drops it with no destination
        record = {
            "version": "1.0",
            "timestamp": clock.iso(clock.utcnow()),
            "requestContext": {
                "requestId": uuid.uuid4().hex,
                "functionArn": f"{spec.arn}:$LATEST",
                "condition": "RetriesExhausted",
                "approximateInvokeCount": attempts,
            },
            "requestPayload": event,
            "responseContext": {"statusCode": 200, "executedVersion": "$LATEST", "functionError": "Unhandled"},
            "responsePayload": json.loads(payload),
        }
        sqs = self.client("sqs")
        url = sqs.get_queue_url(QueueName=spec.on_failure.rsplit(":", 1)[-1])["QueueUrl"]
        with acting_as(spec.principal):  # the function's role sends it, as Lambda does
            sqs.send_message(QueueUrl=url, MessageBody=json.dumps(record))

    def failed_events(self, logical_id: str) -> list[dict[str, Any]]:
        """What reached LOGICAL_ID's on-failure queue (the destination records), without removing it."""
        spec = self.functions[logical_id]
        if not spec.on_failure:
            return []
        sqs = self.client("sqs")
        url = sqs.get_queue_url(QueueName=spec.on_failure.rsplit(":", 1)[-1])["QueueUrl"]
        messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=0).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    def _record(self, logical_id: str, started: float, error: str | None) -> None:
        inv = Invocation(logical_id, round(time.monotonic() - started, 4), error)
        self.invocations.append(inv)

    # ---- conveniences for runs and tests ---------------------------------------------------
    @property
    def bucket(self) -> str:
        return self.resources["ArtifactBucket"]

    @property
    def table_name(self) -> str:
        return self.resources["DeploymentsTable"]

    def client(self, service: str) -> Any:
        # The retry settings given, not read from os.environ: a Lambda running in another thread patches
        # and restores AWS_RETRY_MODE there, and botocore's env lookup is a check-then-read.
        return boto3.client(service, region_name=REGION, config=_TEST_CLIENTS)  # type: ignore[call-overload]

    def table(self) -> Any:
        return boto3.resource("dynamodb", region_name=REGION, config=_TEST_CLIENTS).Table(self.table_name)

    def registry(self) -> Registry:
        return Registry(self.table())

    def deployment_id(self, execution: str) -> str:
        """The deployment id of the execution named (or with the ARN) EXECUTION."""
        from modeldrop.contracts.models import deployment_id_of

        sfn = self.client("stepfunctions")
        for item in sfn.list_executions(stateMachineArn=self.state_machine_arn)["executions"]:
            if execution in (item["name"], item["executionArn"]):
                return deployment_id_of(item)
        raise KeyError(f"no execution {execution}")

    def record_of(self, execution: str) -> DeploymentRecord | None:
        """The deployment record of the execution named (or with the ARN) EXECUTION."""
        return self.registry().get(self.deployment_id(execution))

    def abort(self, join_seconds: float = 15.0) -> None:
        """An interrupted run: no endpoint process may survive or start, and the executions stop.

        Executions run on moto's daemon threads; they are stopped and joined here, while the emulator
        is still active, so none goes on to call AWS unmocked after the run has left it.
        """
        self.hosting.stop_all()
        sfn = self.client("stepfunctions")
        with contextlib.suppress(Exception):  # best effort: the processes are already stopped
            running = sfn.list_executions(stateMachineArn=self.state_machine_arn, statusFilter="RUNNING")
            for execution in running["executions"]:
                sfn.stop_execution(executionArn=execution["executionArn"], error="Interrupted", cause="run-local")
        self.settle(join_seconds)
        self.hosting.stop_all()

    def settle(self, join_seconds: float = 30.0) -> None:
        """Wait for moto's execution threads: an ended execution's status-change event is delivered
        (and its rule's function run) on the execution's own thread, just after the status is set."""
        from moto.stepfunctions.parser.utils import TMP_THREADS

        deadline = time.monotonic() + join_seconds
        for thread in list(TMP_THREADS):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(timeout=max(deadline - time.monotonic(), 0.0))

    def close(self) -> None:
        """Stop every endpoint process and the local runtime endpoint."""
        if self.runtime is not None:
            self.runtime.stop()
            self.runtime = None
        self.hosting.stop_all()
        moto_shims.set_hosting(None)
        moto_shims.set_dispatcher(None)
        moto_shims.set_async_invoker(None)
        clients.reset()  # the handlers' clients point at this stack's runtime endpoint

    def invoke_function(self, logical_id: str, event: dict[str, Any]) -> dict[str, Any]:
        payload, errored, _ = self.dispatch(self.functions[logical_id].name, event)
        result: dict[str, Any] = json.loads(payload)
        if errored:
            raise RuntimeError(f"{result['errorType']}: {result['errorMessage']}")
        return result

    def start(self, request: dict[str, Any], name: str | None = None) -> str:
        arn: str = self.client("stepfunctions").start_execution(
            stateMachineArn=self.state_machine_arn,
            name=name or f"run-{uuid.uuid4().hex[:12]}",
            input=json.dumps(request),
        )["executionArn"]
        return arn

    def wait(self, execution_arn: str, timeout: float = 60.0) -> dict[str, Any]:
        """The finished execution (describe only: execution_watch.watch also follows the states).
        TIMEOUT bounds how long it may go without a new history event, not its whole run: a busy
        machine is slow, a stuck execution makes no progress."""
        sfn = self.client("stepfunctions")
        deadline, last_event, looked = time.monotonic() + timeout, 0, 0.0
        while True:
            desc: dict[str, Any] = sfn.describe_execution(executionArn=execution_arn)
            if desc["status"] != "RUNNING":
                return desc
            now = time.monotonic()
            if now - looked > 1.0:
                looked = now
                events = sfn.get_execution_history(executionArn=execution_arn, maxResults=1, reverseOrder=True)
                newest = max((int(e["id"]) for e in events.get("events", [])), default=0)
                if newest > last_event:
                    last_event, deadline = newest, now + timeout
            if now > deadline:
                raise TimeoutError(f"execution {execution_arn} made no progress for {timeout}s")
            time.sleep(0.02)

    def leftover_resources(self) -> list[str]:
        """What this stack's deployments left in the emulated account (names under its prefix; another
        team's endpoint, as --fault quota-busy creates, is not ours to count)."""
        sm = self.client("sagemaker")
        ours = f"{self.parameters.get('ResourcePrefix', 'modeldrop')}-"
        for endpoint in sm.list_endpoints()["Endpoints"]:
            if endpoint["EndpointStatus"] == "Deleting":  # on its way: look again, as a user would
                with contextlib.suppress(Exception):
                    sm.describe_endpoint(EndpointName=endpoint["EndpointName"])
                    sm.describe_endpoint(EndpointName=endpoint["EndpointName"])
        names = [f"endpoint/{e['EndpointName']}" for e in sm.list_endpoints()["Endpoints"]]
        names += [f"endpoint-config/{c['EndpointConfigName']}" for c in sm.list_endpoint_configs()["EndpointConfigs"]]
        names += [f"model/{m['ModelName']}" for m in sm.list_models()["Models"]]
        for _ in range(2):  # a Deleting component is gone once seen again, as a user would look again
            listed = sm.list_inference_components()["InferenceComponents"]
        names += [f"inference-component/{c['InferenceComponentName']}" for c in listed]
        left = [n for n in names if n.split("/", 1)[1].startswith(ours)]
        left += [f"process/{name}" for name in self.hosting.running()]
        # The served copies of artifacts are the deployment's too (any version, delete markers included).
        from modeldrop.aws.s3.served_copy import SERVED_PREFIX

        versions = self.client("s3").list_object_versions(Bucket=self.bucket, Prefix=SERVED_PREFIX)
        left += sorted({f"s3://{self.bucket}/{v['Key']}" for v in versions.get("Versions", [])})
        # A multipart upload never completed nor aborted bills its parts until the lifecycle rule runs.
        uploads = self.client("s3").list_multipart_uploads(Bucket=self.bucket, Prefix=SERVED_PREFIX)
        left += sorted(f"upload/{u['Key']}" for u in uploads.get("Uploads", []))
        return left


TIMED_OUT = "Sandbox.Timedout"


class _Context:
    def __init__(self, name: str, arn: str, timeout: float = 300.0) -> None:
        self._timeout, self._slept_at_start = timeout, clock.slept_here()
        self.function_name = name
        self.function_version = "$LATEST"
        self.invoked_function_arn = arn
        self.memory_limit_in_mb = 256
        self.aws_request_id = uuid.uuid4().hex
        self.log_group_name = f"/aws/lambda/{name}"
        self.log_stream_name = "local"

    def spent(self) -> float:
        """The seconds this invocation waited on the emulator's clock (its virtual sleeps)."""
        return clock.slept_here() - self._slept_at_start

    def get_remaining_time_in_millis(self) -> int:
        return max(int((self._timeout - self.spent()) * 1000), 0)


@contextmanager
def _patched_env(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
