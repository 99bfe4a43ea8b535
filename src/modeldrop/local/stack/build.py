"""Build the emulated stack from template.yaml: its bucket, table, bus, queues, roles, functions and
state machine in moto, each function with its role's statements and its environment resolved, the
way `sam deploy` makes them (call inside an active mock_aws; close() the stack after)."""

from __future__ import annotations

import io
import json
import re
import uuid
import zipfile
from pathlib import Path
from typing import Any

import boto3

from modeldrop.aws import clients
from modeldrop.aws.sagemaker.execution_role import SAGEMAKER
from modeldrop.local.emulator import moto_shims, service_quotas
from modeldrop.local.emulator.iam import enforcement as iam_enforcement
from modeldrop.local.emulator.iam.enforcement import ACCOUNT, Principal
from modeldrop.local.emulator.iam.policy import statements_of
from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
from modeldrop.local.emulator.sagemaker.runtime import LocalRuntime
from modeldrop.local.stack.emulated import REGION, STACK_NAME, EmulatedStack, FunctionSpec, load_template, project_root

LOCAL_PARAMETERS = {
    "SageMakerExecutionRoleArn": f"arn:aws:iam::{ACCOUNT}:role/modeldrop-local-sagemaker",
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


def _number_problem(spec: dict[str, Any], value: str) -> str | None:
    try:
        number = float(value)
    except ValueError:
        return "must be a number"
    if "MinValue" in spec and number < float(spec["MinValue"]):
        return f"must be >= {spec['MinValue']}"
    if "MaxValue" in spec and number > float(spec["MaxValue"]):
        return f"must be <= {spec['MaxValue']}"
    return None


def check_parameters(specs: dict[str, Any], values: dict[str, str]) -> None:
    """Refuse parameter values CloudFormation would refuse (type, allowed values, pattern, range)."""
    for name, spec in specs.items():
        value = values.get(name, "")
        problem = None
        if spec.get("AllowedValues") and value not in [str(v) for v in spec["AllowedValues"]]:
            problem = f"must be one of {spec['AllowedValues']}"
        elif spec.get("AllowedPattern") and not re.fullmatch(spec["AllowedPattern"], value):
            problem = f"must match {spec['AllowedPattern']}"
        elif spec.get("Type") == "Number":
            problem = _number_problem(spec, value)
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


def sagemaker_role_policy(bucket: str, resource_prefix: str = "modeldrop") -> dict[str, Any]:
    """What the deploy guide asks of SageMakerExecutionRoleArn: read the artifact bucket, pull the
    image, write the endpoint's logs, read the channels' auto-rollback alarms (a blue/green update)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"},
            {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{bucket}"},
            {
                "Effect": "Allow",
                "Action": ["ecr:GetAuthorizationToken", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
                "Resource": "*",
            },
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogStream", "logs:PutLogEvents", "logs:CreateLogGroup"],
                "Resource": "*",
            },
            {
                "Effect": "Allow",
                "Action": "cloudwatch:DescribeAlarms",
                "Resource": f"arn:aws:cloudwatch:{REGION}:{ACCOUNT}:alarm:{resource_prefix}-ch-*",
            },
        ],
    }


def _storage(stack: EmulatedStack, resources: dict[str, Any]) -> str:
    """The artifact bucket, the deployments table, the event bus and the queues; returns the bucket."""
    s3 = boto3.client("s3", region_name=REGION)
    bucket = f"{STACK_NAME}-artifacts-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    s3.put_bucket_notification_configuration(Bucket=bucket, NotificationConfiguration={"EventBridgeConfiguration": {}})
    stack.resources["ArtifactBucket"] = bucket
    stack.resources["ArtifactBucket.Arn"] = f"arn:aws:s3:::{bucket}"

    table_props = resources["DeploymentsTable"]["Properties"]
    table_name = f"{STACK_NAME}-deployments"
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName=table_name,
        BillingMode="PAY_PER_REQUEST",
        AttributeDefinitions=table_props["AttributeDefinitions"],
        KeySchema=table_props["KeySchema"],
    )
    stack.resources["DeploymentsTable"] = table_name
    stack.resources["DeploymentsTable.Arn"] = f"arn:aws:dynamodb:{REGION}:{ACCOUNT}:table/{table_name}"

    bus = stack.resolve(resources["EventBus"]["Properties"]["Name"])
    boto3.client("events", region_name=REGION).create_event_bus(Name=bus)
    stack.resources["EventBus"] = bus
    stack.resources["EventBus.Arn"] = f"arn:aws:events:{REGION}:{ACCOUNT}:event-bus/{bus}"

    sqs = boto3.client("sqs", region_name=REGION)
    for logical in [k for k, v in resources.items() if v["Type"] == "AWS::SQS::Queue"]:
        queue = f"{STACK_NAME}-{logical}"
        stack.resources[logical] = sqs.create_queue(QueueName=queue)["QueueUrl"]
        stack.resources[f"{logical}.Arn"] = f"arn:aws:sqs:{REGION}:{ACCOUNT}:{queue}"
        stack.resources[f"{logical}.QueueName"] = queue
    return bucket


def _function_code(root: Path, resource: dict[str, Any]) -> tuple[Path, str]:
    """A function's code folder and handler: a zip function's CodeUri and Handler; an image function's
    Dockerfile folder and ImageConfig command (its Dockerfile copies that folder's handler beside the
    package, as the layer holds it: tests/contracts/test_engine_image_build.py holds the two equal)."""
    props = resource["Properties"]
    if props.get("PackageType") == "Image":
        metadata = resource["Metadata"]
        dockerfile = root / metadata["DockerContext"] / metadata["Dockerfile"]
        return dockerfile.parent, props["ImageConfig"]["Command"][0]
    return root / props["CodeUri"], props["Handler"]


def _functions(stack: EmulatedStack, template: dict[str, Any], role: str) -> list[str]:
    """One Lambda per function (dispatched in-process), with its template Timeout and SAM's role name."""
    resources = template["Resources"]
    globals_fn = template.get("Globals", {}).get("Function", {})
    lam = boto3.client("lambda", region_name=REGION)
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as zf:
        zf.writestr("app.py", "# dispatched in-process by modeldrop.local\n")
    function_ids = [k for k, v in resources.items() if v["Type"] == "AWS::Serverless::Function"]
    for logical in function_ids:
        props = resources[logical]["Properties"]
        name = f"{STACK_NAME}-{logical}"
        code_dir, handler = _function_code(stack.root, resources[logical])
        arn = lam.create_function(
            FunctionName=name,
            Runtime=props.get("Runtime", globals_fn.get("Runtime", "python3.13")),
            Role=role,
            Handler=handler,
            Code={"ZipFile": zipped.getvalue()},
        )["FunctionArn"]
        timeout = float(props.get("Timeout", globals_fn.get("Timeout", 3)))
        stack.functions[logical] = FunctionSpec(logical, name, code_dir, handler, {}, arn, timeout=timeout)
        # SAM's role for the function: <Logical>Role, which the bucket policy names.
        stack.resources[f"{logical}Role.Arn"] = f"arn:aws:iam::{ACCOUNT}:role/{STACK_NAME}-{logical}Role"
    return function_ids


def _state_machine(stack: EmulatedStack, resources: dict[str, Any], role: str) -> None:
    sm_props = resources["DeploymentStateMachine"]["Properties"]
    definition = (stack.root / sm_props["DefinitionUri"]).read_text()
    for key, value in sm_props.get("DefinitionSubstitutions", {}).items():
        definition = definition.replace("${" + key + "}", str(stack.resolve(value)))
    sfn = boto3.client("stepfunctions", region_name=REGION)
    stack.state_machine_arn = sfn.create_state_machine(
        name=f"{STACK_NAME}-deployment", definition=definition, roleArn=role, type="STANDARD"
    )["stateMachineArn"]
    stack.resources["DeploymentStateMachine"] = stack.state_machine_arn


def _wire(stack: EmulatedStack, template: dict[str, Any], function_ids: list[str]) -> None:
    """Each function's policies, environment, async settings and rules: last, since they may name
    the state machine (the starter does)."""
    resources = template["Resources"]
    global_env = template.get("Globals", {}).get("Function", {}).get("Environment", {}).get("Variables", {})
    events = boto3.client("events", region_name=REGION)
    for logical in function_ids:
        props, spec = resources[logical]["Properties"], stack.functions[logical]
        spec.principal = Principal(logical, stack.resources[f"{logical}Role.Arn"], tuple(_statements(stack, props)))
        env = {**global_env, **props.get("Environment", {}).get("Variables", {})}
        spec.env = {k: str(stack.resolve(v)) for k, v in env.items()}
        invoke = stack.resolve(props.get("EventInvokeConfig") or {})
        spec.max_retries = int(invoke.get("MaximumRetryAttempts", 2))
        failure = (invoke.get("DestinationConfig") or {}).get("OnFailure") or {}
        spec.on_failure = failure.get("Destination") if failure.get("Type") == "SQS" else None
        for event in props.get("Events", {}).values():
            if event["Type"] == "EventBridgeRule":
                pattern = stack.resolve(event["Properties"]["Pattern"])
                rule = f"{STACK_NAME}-{logical}-rule"
                events.put_rule(Name=rule, EventPattern=json.dumps(pattern), State="ENABLED")
                events.put_targets(Rule=rule, Targets=[{"Id": "fn", "Arn": spec.arn}])


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
    bucket = _storage(stack, template["Resources"])

    iam_enforcement.install()
    iam_enforcement.reset()
    iam = boto3.client("iam", region_name=REGION)
    role = iam.create_role(
        RoleName=f"{STACK_NAME}-fn", AssumeRolePolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": []})
    )["Role"]["Arn"]
    iam.create_role(RoleName="modeldrop-local-sagemaker", AssumeRolePolicyDocument=json.dumps(trust_policy(SAGEMAKER)))
    iam.put_role_policy(
        RoleName="modeldrop-local-sagemaker",
        PolicyName="serve",
        PolicyDocument=json.dumps(
            sagemaker_role_policy(bucket, str(stack.parameters.get("ResourcePrefix", "modeldrop")))
        ),
    )
    function_ids = _functions(stack, template, role)
    _state_machine(stack, template["Resources"], role)
    _wire(stack, template, function_ids)

    policy = template["Resources"].get("ArtifactBucketPolicy", {}).get("Properties", {}).get("PolicyDocument")
    if policy:
        boto3.client("s3", region_name=REGION).put_bucket_policy(
            Bucket=bucket, Policy=json.dumps(stack.resolve(policy))
        )
    moto_shims.set_dispatcher(stack.dispatch)
    moto_shims.set_async_invoker(stack.invoke_async)
    moto_shims.set_hosting(stack.hosting)
    from modeldrop.serving.memory_plan import instance_catalog

    service_quotas.set_endpoint_quotas({name: LOCAL_ENDPOINT_QUOTA for name in instance_catalog()["instances"]})
    return stack
