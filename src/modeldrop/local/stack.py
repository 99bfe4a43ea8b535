"""The SAM stack, emulated: resources and functions read from template.yaml, created in moto.

The state machine definition, its substitutions, the functions' handlers and environment, and the
S3 -> EventBridge rule pattern all come from the same files `sam deploy` uses.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3
import yaml

from modeldrop.aws import clients
from modeldrop.aws.execution_role import SAGEMAKER
from modeldrop.aws.registry import Registry
from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.local import iam_enforcement, moto_shims
from modeldrop.local.hosting import LocalHosting
from modeldrop.local.iam_enforcement import Principal, acting_as
from modeldrop.local.iam_policy import statements_of
from modeldrop.local.runtime_endpoint import LocalRuntime

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
            if key == "Ref":
                if arg == "AWS::StackName":
                    return STACK_NAME
                if arg == "AWS::Region":
                    return REGION
                if arg == "AWS::NoValue":
                    return _NO_VALUE
                if arg in self.parameters:
                    return self.parameters[arg]
                return self.resources.get(arg, f"unresolved:{arg}")
            if key == "Fn::GetAtt":
                logical, attr = arg
                if logical in self.functions:
                    return self.functions[logical].arn
                return self.resources.get(f"{logical}.{attr}", f"unresolved:{logical}.{attr}")
            if key == "Fn::If":
                name, then, otherwise = arg
                return self._resolve(then if self.condition(name) else otherwise)
            if key == "Fn::Equals":
                left, right = (self._resolve(a) for a in arg)
                return str(left) == str(right)
            if key == "Fn::Not":
                return not self._resolve(arg[0])
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::Sub":
                text = arg if isinstance(arg, str) else arg[0]
                for k, v in {
                    "AWS::StackName": STACK_NAME,
                    "AWS::Region": REGION,
                    "AWS::Partition": "aws",
                    "AWS::AccountId": "123456789012",
                    **self.parameters,
                    **self.resources,
                }.items():
                    text = text.replace("${" + k + "}", str(v))
                return text
        if isinstance(value, dict):
            items = {k: self._resolve(v) for k, v in value.items()}
            return {k: v for k, v in items.items() if v is not _NO_VALUE}
        if isinstance(value, list):
            return [v for v in (self._resolve(item) for item in value) if v is not _NO_VALUE]
        return value

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
        return boto3.client(service, region_name=REGION)  # type: ignore[call-overload]

    def table(self) -> Any:
        return boto3.resource("dynamodb", region_name=REGION).Table(self.table_name)

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
        from modeldrop.aws.served_copy import SERVED_PREFIX

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


LOCAL_PARAMETERS = {
    "SageMakerExecutionRoleArn": "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker",
    "PollIntervalSeconds": "30",
}

# The emulated account may run this many instances of each type as endpoints.
LOCAL_ENDPOINT_QUOTA = 8.0

LOCAL_ENV = {
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "POWERTOOLS_TRACE_DISABLED": "true",
    "POWERTOOLS_METRICS_DISABLED": "true",
    "POWERTOOLS_LOG_LEVEL": "CRITICAL",
}


def check_parameters(specs: dict[str, Any], values: dict[str, str]) -> None:
    """Refuse parameter values CloudFormation would refuse (type, allowed values, pattern, range)."""
    import re

    for name, spec in specs.items():
        value = values.get(name, "")
        problem = None
        if spec.get("AllowedValues") and value not in [str(v) for v in spec["AllowedValues"]]:
            problem = f"must be one of {spec['AllowedValues']}"
        elif spec.get("AllowedPattern") and not re.fullmatch(spec["AllowedPattern"], value):
            problem = f"must match {spec['AllowedPattern']}"
        elif spec.get("Type") == "Number":
            try:
                number = float(value)
            except ValueError:
                problem = "must be a number"
            else:
                if "MinValue" in spec and number < float(spec["MinValue"]):
                    problem = f"must be >= {spec['MinValue']}"
                elif "MaxValue" in spec and number > float(spec["MaxValue"]):
                    problem = f"must be <= {spec['MaxValue']}"
        if problem:
            raise ValueError(f"parameter {name}={value!r} {problem}")


def _statements(stack: EmulatedStack, props: dict[str, Any]) -> list[Any]:
    """A function's IAM statements as SAM gives its role: every inline policy document of Policies
    (SAM policy templates are not used by this template, and are refused rather than ignored)."""
    statements: list[Any] = []
    for policy in props.get("Policies", []):
        if not isinstance(policy, dict) or "Statement" not in policy:
            raise ValueError(f"the emulator reads only inline policy documents, not {policy!r}")
        statements += statements_of(stack.resolve(policy))
    return statements


def trust_policy(service: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}],
    }


def build_stack(
    root: Path | None = None,
    parameters: dict[str, str] | None = None,
    hosting: LocalHosting | None = None,
    runtime_options: dict[str, Any] | None = None,
) -> EmulatedStack:
    """Create the stack's resources in moto (call inside an active mock_aws); close() it after."""
    moto_shims.install()
    clients.reset()
    root = root or project_root()
    template = load_template(root)
    params = {name: str(spec.get("Default", "")) for name, spec in template.get("Parameters", {}).items()}
    params.update(LOCAL_PARAMETERS)
    params.update(parameters or {})
    check_parameters(template.get("Parameters", {}), params)
    stack = EmulatedStack(
        root=root, parameters=params, conditions=template.get("Conditions", {}), hosting=hosting or LocalHosting()
    )
    stack.runtime = LocalRuntime(stack.hosting, **(runtime_options or {})).start()
    stack.extra_env = {**LOCAL_ENV, "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": stack.runtime.url}
    resources = template["Resources"]

    s3 = boto3.client("s3", region_name=REGION)
    bucket = f"{STACK_NAME}-artifacts-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    stack.resources["ArtifactBucket"] = bucket
    stack.resources["ArtifactBucket.Arn"] = f"arn:aws:s3:::{bucket}"

    table_props = resources["DeploymentsTable"]["Properties"]
    ddb = boto3.client("dynamodb", region_name=REGION)
    table_name = f"{STACK_NAME}-deployments"
    ddb.create_table(
        TableName=table_name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=table_props["AttributeDefinitions"],
        KeySchema=table_props["KeySchema"],
    )
    stack.resources["DeploymentsTable"] = table_name
    stack.resources["DeploymentsTable.Arn"] = f"arn:aws:dynamodb:{REGION}:123456789012:table/{table_name}"

    events = boto3.client("events", region_name=REGION)
    bus = stack.resolve(resources["EventBus"]["Properties"]["Name"])
    events.create_event_bus(Name=bus)
    stack.resources["EventBus"] = bus
    stack.resources["EventBus.Arn"] = f"arn:aws:events:{REGION}:123456789012:event-bus/{bus}"

    sqs = boto3.client("sqs", region_name=REGION)
    for logical in [k for k, v in resources.items() if v["Type"] == "AWS::SQS::Queue"]:
        queue = f"{STACK_NAME}-{logical}"
        url = sqs.create_queue(QueueName=queue)["QueueUrl"]
        stack.resources[logical] = url
        stack.resources[f"{logical}.Arn"] = f"arn:aws:sqs:{REGION}:123456789012:{queue}"
        stack.resources[f"{logical}.QueueName"] = queue

    iam_enforcement.install()
    iam_enforcement.reset()
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName=f"{STACK_NAME}-fn", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    iam.create_role(RoleName="modeldrop-local-sagemaker", AssumeRolePolicyDocument=json.dumps(trust_policy(SAGEMAKER)))

    lam = boto3.client("lambda", region_name=REGION)
    globals_fn = template.get("Globals", {}).get("Function", {})
    global_env = globals_fn.get("Environment", {}).get("Variables", {})
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("app.py", "# dispatched in-process by modeldrop.local\n")
    function_ids = [k for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"]
    for logical in function_ids:
        props = resources[logical]["Properties"]
        name = f"{STACK_NAME}-{logical}"
        arn = lam.create_function(
            FunctionName=name,
            Runtime=globals_fn.get("Runtime", "python3.13"),
            Role=role,
            Handler=props.get("Handler", globals_fn.get("Handler")),
            Code={"ZipFile": zipped.getvalue()},
        )["FunctionArn"]
        stack.functions[logical] = FunctionSpec(
            logical,
            name,
            root / props["CodeUri"],
            props.get("Handler", globals_fn.get("Handler")),
            {},
            arn,
            timeout=float(props.get("Timeout", globals_fn.get("Timeout", 3))),
        )
        # SAM's role for the function: <Logical>Role, which the bucket policy names.
        stack.resources[f"{logical}Role.Arn"] = f"arn:aws:iam::123456789012:role/{STACK_NAME}-{logical}Role"

    sm_props = resources["DeploymentStateMachine"]["Properties"]
    definition = (root / sm_props["DefinitionUri"]).read_text()
    for key, value in sm_props.get("DefinitionSubstitutions", {}).items():
        definition = definition.replace("${" + key + "}", str(stack.resolve(value)))
    sfn = boto3.client("stepfunctions", region_name=REGION)
    stack.state_machine_arn = sfn.create_state_machine(
        name=f"{STACK_NAME}-deployment", definition=definition, roleArn=role, type="STANDARD"
    )["stateMachineArn"]
    stack.resources["DeploymentStateMachine"] = stack.state_machine_arn

    # Environment and policies last: they may reference the state machine (the starter does).
    for logical in function_ids:
        props = resources[logical]["Properties"]
        stack.functions[logical].principal = Principal(
            logical, stack.resources[f"{logical}Role.Arn"], tuple(_statements(stack, props))
        )
        env = {**global_env, **props.get("Environment", {}).get("Variables", {})}
        stack.functions[logical].env = {k: str(stack.resolve(v)) for k, v in env.items()}
        invoke = stack.resolve(props.get("EventInvokeConfig") or {})
        stack.functions[logical].max_retries = int(invoke.get("MaximumRetryAttempts", 2))
        failure = (invoke.get("DestinationConfig") or {}).get("OnFailure") or {}
        stack.functions[logical].on_failure = failure.get("Destination") if failure.get("Type") == "SQS" else None
        for event in props.get("Events", {}).values():
            if event["Type"] == "EventBridgeRule":
                pattern = stack.resolve(event["Properties"]["Pattern"])
                rule = f"{STACK_NAME}-{logical}-rule"
                events.put_rule(Name=rule, EventPattern=json.dumps(pattern), State="ENABLED")
                events.put_targets(Rule=rule, Targets=[{"Id": "fn", "Arn": stack.functions[logical].arn}])

    policy = resources.get("ArtifactBucketPolicy", {}).get("Properties", {}).get("PolicyDocument")
    if policy:
        s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(stack.resolve(policy)))
    moto_shims.set_dispatcher(stack.dispatch)
    moto_shims.set_async_invoker(stack.invoke_async)
    moto_shims.set_hosting(stack.hosting)
    from modeldrop.serving.memory_plan import instance_catalog

    moto_shims.set_endpoint_quotas({name: LOCAL_ENDPOINT_QUOTA for name in instance_catalog()["instances"]})
    return stack
