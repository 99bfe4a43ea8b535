"""RegisterDeployment's cheap checks of what would fail a deployment late: `modeldrop doctor`'s
role and quota checks, run for this request before minutes of validation and copying.

A quota that is merely busy is not a failure here (CreateEndpoint waits or falls back); a quota
below the request's instance count on every type it may use is, as no wait can help.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker.endpoint_quota import endpoint_quotas
from modeldrop.aws.sagemaker.execution_role import RoleUnreadable, role_problem
from modeldrop.contracts.errors import ExecutionRoleUnusable, QuotaExceeded
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.serving.instance_choice import AUTO

if TYPE_CHECKING:
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_service_quotas import ServiceQuotasClient


def preflight(
    registry: Registry, iam: IAMClient, quotas: ServiceQuotasClient, req: NormalizedRequest, role_arn: str
) -> dict[str, Any]:
    """Raise ExecutionRoleUnusable or QuotaExceeded; otherwise record (and return) what was checked."""
    try:
        problem = role_problem(iam, role_arn)
    except RoleUnreadable as exc:  # no iam:GetRole: CreateModel still decides
        role = f"not checked: {exc}"
    else:
        if problem is not None:
            raise ExecutionRoleUnusable(*problem)
        role = "trusts sagemaker.amazonaws.com"
    checked = {"role": role, "quota": _quota_floor(quotas, req)}
    registry.record(req.deployment_id, "preflight", checked, owner=req.execution_arn, live=True)
    return checked


def _quota_floor(quotas: ServiceQuotasClient, req: NormalizedRequest) -> str:
    types = req.instance_types or [req.instance_type]
    if AUTO in types:
        return "not checked: the types follow from the validated checkpoint"
    try:
        listed = endpoint_quotas(quotas)
    except ClientError as exc:  # no Service Quotas access: CreateEndpoint's check and SageMaker decide
        return f"not checked: {exc.response.get('Error', {}).get('Code')}"
    short = []
    for instance_type in types:
        if instance_type not in listed:
            return f"{instance_type}: not listed by Service Quotas"
        code, value = listed[instance_type]
        if value >= req.instance_count:
            return f"{instance_type}: {value:g} ({code})"
        short.append((instance_type, code, value))
    shown = "; ".join(f"'{t} for endpoint usage' ({c}) is {v:g}" for t, c, v in short)
    _first, code, _value = short[0]
    raise QuotaExceeded(
        f"{shown}: below the {req.instance_count} instance(s) this deployment needs on every type it may use",
        f"aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code {code} "
        f"--desired-value {req.instance_count}, or list an instance type with quota",
    )
