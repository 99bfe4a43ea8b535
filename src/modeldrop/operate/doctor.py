"""`modeldrop doctor`: what would make the first deploy fail, checked before it (read-only).

Each check is one line: passed or not, what was seen, and the fix. The source lab's first deploys
failed on exactly these: an execution role that trusted only Bedrock (SageMaker could not assume
it), a quota of 0 for the default instance type on a new account, and an image not in the region.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from botocore.exceptions import BotoCoreError, ClientError
from pydantic import BaseModel

from modeldrop.aws.pages import all_items
from modeldrop.aws.sagemaker.endpoint_quota import find_quota, instances_in_use
from modeldrop.aws.sagemaker.execution_role import SAGEMAKER, RoleUnreadable, role_problem
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ImageUnresolvable
from modeldrop.operate.engine_function import check_engine_function
from modeldrop.serving.image import resolve_image

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient

REQUIRED_OUTPUTS = ("StateMachineArn", "DeploymentsTableName", "ArtifactBucketName", "EventBusName")


class Check(BaseModel):
    name: str
    status: Literal["ok", "fail", "warn"]
    detail: str
    fix: str = ""


class StackView(BaseModel):
    """What doctor reads from the stack: its parameters, outputs and a few physical names."""

    stack_name: str
    region: str
    parameters: dict[str, str]
    outputs: dict[str, str]
    resources: dict[str, str]  # logical id -> physical id


def read_stack(cfn: CloudFormationClient, stack_name: str, region: str) -> StackView:
    stack = cfn.describe_stacks(StackName=stack_name)["Stacks"][0]
    summaries = all_items(cfn, "list_stack_resources", "StackResourceSummaries", StackName=stack_name)
    resources = {res["LogicalResourceId"]: res.get("PhysicalResourceId", "") for res in summaries}
    return StackView(
        stack_name=stack_name,
        region=region,
        parameters={p["ParameterKey"]: p.get("ParameterValue", "") for p in stack.get("Parameters", [])},
        outputs={o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])},
        resources=resources,
    )


def check_outputs(view: StackView) -> Check:
    missing = [k for k in REQUIRED_OUTPUTS if k not in view.outputs]
    if missing:
        return Check(
            name="stack outputs",
            status="fail",
            detail=f"{view.stack_name} lacks {', '.join(missing)}",
            fix="is this a modeldrop stack? redeploy it with `sam deploy`",
        )
    return Check(name="stack outputs", status="ok", detail=f"{view.stack_name}: {len(view.outputs)} outputs")


def check_role_trust(iam: IAMClient, role_arn: str) -> Check:
    name = role_arn.rsplit("/", 1)[-1]
    try:
        problem = role_problem(iam, role_arn)
    except RoleUnreadable as exc:
        return Check(name="SageMaker execution role", status="warn", detail=str(exc))
    if problem is not None:
        return Check(name="SageMaker execution role", status="fail", detail=problem[0], fix=problem[1])
    return Check(name="SageMaker execution role", status="ok", detail=f"{name} trusts {SAGEMAKER}")


def check_role_reads_bucket(iam: IAMClient, role_arn: str, bucket: str | None) -> Check:
    if not bucket:
        return Check(name="role reads the artifact bucket", status="warn", detail="the stack names no artifact bucket")
    try:
        results = iam.simulate_principal_policy(
            PolicySourceArn=role_arn,
            ActionNames=["s3:GetObject", "s3:ListBucket"],
            ResourceArns=[f"arn:{partition_of(role_arn)}:s3:::{bucket}{tail}" for tail in ("/*", "")],
        )["EvaluationResults"]
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        return Check(
            name="role reads the artifact bucket",
            status="warn",
            detail=f"could not simulate the role's policy ({type(exc).__name__})",
            fix=f"make sure {role_arn.rsplit('/', 1)[-1]} may s3:GetObject and s3:ListBucket on {bucket}",
        )
    denied = sorted({r["EvalActionName"] for r in results if not _allowed_on_its_resource(r, bucket)})
    if denied:
        return Check(
            name="role reads the artifact bucket",
            status="fail",
            detail=f"the role may not {', '.join(denied)} on {bucket}",
            fix=f"attach a policy allowing s3:GetObject on arn:aws:s3:::{bucket}/* and s3:ListBucket on the bucket",
        )
    return Check(
        name="role reads the artifact bucket", status="ok", detail=f"s3:GetObject and s3:ListBucket on {bucket}"
    )


def check_role_reads_channel_alarms(iam: IAMClient, role_arn: str, region: str, resource_prefix: str) -> Check:
    """A channel's blue/green update rolls back on its CloudWatch alarms, which SageMaker reads as the
    endpoint's execution role (the deployment guardrails guide): without it every promotion is refused."""
    name = "role reads the channel alarms"
    account = role_arn.split(":")[4] if role_arn.count(":") >= 5 else "*"
    alarms = f"arn:{partition_of(role_arn)}:cloudwatch:{region}:{account}:alarm:{resource_prefix}-ch-*"
    fix = f"attach a policy allowing cloudwatch:DescribeAlarms on {alarms}"
    try:
        results = iam.simulate_principal_policy(
            PolicySourceArn=role_arn, ActionNames=["cloudwatch:DescribeAlarms"], ResourceArns=[alarms]
        )["EvaluationResults"]
    except (ClientError, BotoCoreError, NotImplementedError) as exc:
        return Check(name=name, status="warn", detail=f"could not simulate the role's policy ({type(exc).__name__})",
                     fix=fix)  # fmt: skip
    if any(r.get("EvalDecision") != "allowed" for r in results):
        return Check(name=name, status="fail", detail="the role may not cloudwatch:DescribeAlarms on the channels' "
                     "rollback alarms: every channel promotion would be refused", fix=fix)  # fmt: skip
    return Check(name=name, status="ok", detail=f"cloudwatch:DescribeAlarms on {alarms}")


# Each action is judged on the resource it applies to: the top-level EvalDecision is the most
# restrictive across every resource asked about (GetObject on the bucket ARN is always denied).
_RESOURCE_OF = {"s3:GetObject": ":s3:::{bucket}/*", "s3:ListBucket": ":s3:::{bucket}"}


def partition_of(arn: str) -> str:
    """The partition an ARN lives in (aws, aws-cn, aws-us-gov): the stack's, for the ARNs doctor builds."""
    parts = arn.split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "arn" and parts[1] else "aws"


def _allowed_on_its_resource(result: Any, bucket: str) -> bool:
    wanted = _RESOURCE_OF.get(result["EvalActionName"], "").format(bucket=bucket)
    for specific in result.get("ResourceSpecificResults") or []:
        if wanted and str(specific.get("EvalResourceName", "")).endswith(wanted):
            return bool(specific.get("EvalResourceDecision") == "allowed")
    return bool(result.get("EvalDecision") == "allowed")


def check_quota(quotas: ServiceQuotasClient, sm: SageMakerClient, instance_type: str) -> Check:
    name = f"endpoint quota for {instance_type}"
    try:
        found = find_quota(quotas, instance_type)
    except ClientError as exc:
        return Check(name=name, status="warn", detail=f"Service Quotas not readable: {exc.response['Error']['Code']}")
    if found is None:
        return Check(name=name, status="warn", detail=f"Service Quotas lists no '{instance_type} for endpoint usage'")
    code, value = found
    in_use, using = instances_in_use(sm, instance_type)
    increase = (
        f"aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code {code} "
        f"--desired-value {max(1, in_use + 1)}"
    )
    if value < 1:
        return Check(
            name=name, status="fail", detail=f"the quota is {value:g} ({code}): no endpoint can start", fix=increase
        )
    if in_use >= value:
        return Check(
            name=name,
            status="warn",
            detail=f"all {value:g} in use ({', '.join(using)}): a deployment would wait or fail with QuotaExceeded",
            fix=increase + ", or use quota_wait_minutes / instance_types",
        )
    return Check(name=name, status="ok", detail=f"{value:g} ({code}), {in_use} in use")


def check_image(engine: str, region: str, env: dict[str, str]) -> Check:
    try:
        choice = resolve_image(engine, region, env, None)  # type: ignore[arg-type]
    except ImageUnresolvable as exc:
        return Check(name=f"{engine} image in {region}", status="fail", detail=exc.message, fix=exc.hint)
    return Check(name=f"{engine} image in {region}", status="ok", detail=choice.image_uri)


def check_reaper(
    logs: CloudWatchLogsClient, function_name: str | None, period_minutes: int, now: datetime | None = None
) -> Check:
    if not function_name:
        return Check(name="reaper", status="warn", detail="the stack has no ReaperFunction resource")
    group = f"/aws/lambda/{function_name}"
    try:
        streams = logs.describe_log_streams(logGroupName=group, orderBy="LastEventTime", descending=True, limit=1)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return Check(
                name="reaper",
                status="fail",
                detail=f"{function_name} has never run (no log group {group})",
                fix="check the stack's reaper schedule rule is enabled",
            )
        return Check(name="reaper", status="warn", detail=f"could not read {group}: {exc.response['Error']['Code']}")
    last_ms = max((s.get("lastEventTimestamp") or 0 for s in streams.get("logStreams", [])), default=0)
    if not last_ms:
        return Check(name="reaper", status="fail", detail=f"{function_name} has never logged a run")
    now = now or clock.utcnow()
    minutes_ago = (now.timestamp() * 1000 - last_ms) / 60000
    if minutes_ago > 3 * period_minutes:
        return Check(
            name="reaper",
            status="fail",
            detail=f"last ran {minutes_ago:.0f} min ago, every {period_minutes} min expected",
            fix="check the reaper's schedule rule and its errors in CloudWatch",
        )
    return Check(name="reaper", status="ok", detail=f"last ran {minutes_ago:.0f} min ago")


def check_alarms(cloudwatch: Any, names: list[str]) -> Check:
    if not names:
        return Check(name="alarms", status="warn", detail="the stack lists no alarms")
    alarms = cloudwatch.describe_alarms(AlarmNames=names).get("MetricAlarms", [])
    firing = [a["AlarmName"] for a in alarms if a.get("StateValue") == "ALARM"]
    if firing:
        return Check(
            name="alarms",
            status="fail",
            detail=f"in ALARM: {', '.join(firing)}",
            fix="`modeldrop list` and the dashboard say which deployment; the reaper's logs say why",
        )
    return Check(name="alarms", status="ok", detail=f"{len(alarms)} alarms, none firing")


def run_checks(
    client: Callable[[str], Any],
    stack_name: str,
    region: str,
    instance_type: str | None = None,
    env: dict[str, str] | None = None,
) -> list[Check]:
    """Every check, in the order a first deploy meets them; CLIENT(service) gives a boto3 client."""
    try:
        view = read_stack(client("cloudformation"), stack_name, region)
    except ClientError as exc:
        return [
            Check(
                name="stack",
                status="fail",
                detail=f"{stack_name} in {region}: {exc.response['Error'].get('Message', exc)}",
                fix="pass --stack NAME / --region; `sam deploy` prints the name",
            )
        ]
    checks = [check_outputs(view)]
    role = view.parameters.get("SageMakerExecutionRoleArn", "")
    if role:
        iam = client("iam")
        checks.append(check_role_trust(iam, role))
        checks.append(check_role_reads_bucket(iam, role, view.outputs.get("ArtifactBucketName")))
        prefix = view.parameters.get("ResourcePrefix") or "modeldrop"
        checks.append(check_role_reads_channel_alarms(iam, role, region, prefix))
    else:
        checks.append(Check(name="SageMaker execution role", status="fail", detail="the stack has no role parameter"))
    default_type = instance_type or view.parameters.get("DefaultInstanceType") or "ml.g6.2xlarge"
    checks.append(check_quota(client("service-quotas"), client("sagemaker"), default_type))
    engine = view.parameters.get("DefaultEngine") or "vllm"
    image_env = {
        key: view.parameters.get(param, "")
        for key, param in (
            ("VLLM_IMAGE_URI", "VllmImageUri"),
            ("SGLANG_IMAGE_URI", "SglangImageUri"),
            ("LMI_IMAGE_URI", "LmiImageUri"),
            ("LMI_VERSION", "LmiVersion"),
        )
        if view.parameters.get(param)
    }
    checks.append(check_image(engine, region, {**image_env, **(env or {})}))
    engine_function = view.resources.get("EngineCheckFunction")
    status, detail, fix = check_engine_function(client("lambda"), client("ecr"), engine_function)
    checks.append(Check(name="engine-check function", status=status, detail=detail, fix=fix))  # type: ignore[arg-type]
    period = int(view.parameters.get("ReaperPeriodMinutes") or 15)
    checks.append(check_reaper(client("logs"), view.resources.get("ReaperFunction"), period))
    alarms = [v for k, v in view.resources.items() if k.endswith("Alarm")]
    checks.append(check_alarms(client("cloudwatch"), alarms))
    checks.append(check_live_endpoints(client("sagemaker"), stack_name, view.parameters.get("ResourcePrefix")))
    return checks


def check_live_endpoints(sm: SageMakerClient, stack_tag: str, resource_prefix: str | None) -> Check:
    """Endpoints this stack manages that bill now: `sam delete` would remove the reaper and the alarms
    that watch them, and leave them running."""
    from modeldrop.operate.stack_teardown import live_endpoints

    name = "live endpoints"
    try:
        live = live_endpoints(sm, stack_tag, resource_prefix or "modeldrop")
    except ClientError as exc:
        return Check(name=name, status="warn", detail=f"could not list endpoints: {exc.response['Error']['Code']}")
    if not live:
        return Check(name=name, status="ok", detail="none: nothing bills, and `sam delete` strands nothing")
    return Check(
        name=name,
        status="warn",
        detail=f"{len(live)} billing ({', '.join(live[:5])}{', ...' if len(live) > 5 else ''}); `sam delete` would "
        "remove the reaper and alarms and leave them running",
        fix="modeldrop teardown --all before sam delete",
    )
