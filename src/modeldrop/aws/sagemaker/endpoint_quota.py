"""The account's "ml.X for endpoint usage" quota against the instances already in use.

SageMaker refuses CreateEndpoint with ResourceLimitExceeded only after the model and config exist;
checking first names the quota code and how to raise it. Endpoints still Creating or Updating count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.pages import all_items
from modeldrop.aws.sagemaker.sagemaker_resources import list_endpoints
from modeldrop.contracts.errors import QuotaExceeded

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient

COUNTED_STATUSES = ("InService", "Creating", "Updating", "SystemUpdating", "RollingBack")


@dataclass(frozen=True)
class QuotaCheck:
    instance_type: str
    quota_code: str | None
    quota: float | None
    in_use: int
    needed: int
    using: tuple[str, ...]
    note: str = ""


def find_quota(quotas: ServiceQuotasClient, instance_type: str) -> tuple[str, float] | None:
    """(quota code, value) of '<instance type> for endpoint usage', or None if the API does not list it."""
    return endpoint_quotas(quotas).get(instance_type)


def endpoint_quotas(quotas: ServiceQuotasClient) -> dict[str, tuple[str, float]]:
    """Every '<instance type> for endpoint usage' quota: type -> (quota code, value). ListServiceQuotas
    lists only quotas with an applied value; the others are at their AWS default, which
    ListAWSDefaultServiceQuotas lists."""
    applied = _listed(quotas, "list_service_quotas")
    try:
        defaults = _listed(quotas, "list_aws_default_service_quotas")
    except ClientError:
        defaults = {}  # not allowed to read the defaults: the applied values still count
    return {**defaults, **applied}


def _listed(quotas: ServiceQuotasClient, lister: str) -> dict[str, tuple[str, float]]:
    found: dict[str, tuple[str, float]] = {}
    for quota in all_items(quotas, lister, "Quotas", page_size=100, ServiceCode="sagemaker"):
        name = str(quota.get("QuotaName", ""))
        if name.endswith(" for endpoint usage"):
            found[name.removesuffix(" for endpoint usage")] = (str(quota["QuotaCode"]), float(quota["Value"]))
    return found


def instances_in_use(sm: SageMakerClient, instance_type: str) -> tuple[int, list[str]]:
    total = 0
    using: list[str] = []
    for ep in list_endpoints(sm):
        if ep.get("EndpointStatus") not in COUNTED_STATUSES:
            continue
        config_name = sm.describe_endpoint(EndpointName=ep["EndpointName"])["EndpointConfigName"]
        config = sm.describe_endpoint_config(EndpointConfigName=config_name)
        count = sum(
            int(v.get("InitialInstanceCount") or 0)
            for v in config.get("ProductionVariants", [])
            if v.get("InstanceType") == instance_type
        )
        if count:
            total += count
            using.append(f"{ep['EndpointName']} ({count})")
    return total, using


def check_endpoint_quota(
    quotas: ServiceQuotasClient, sm: SageMakerClient, instance_type: str, needed: int = 1
) -> QuotaCheck:
    """Raise QuotaExceeded when `needed` more instances would pass the quota; otherwise say what was seen."""
    try:
        found = find_quota(quotas, instance_type)
    except ClientError as exc:
        # Without Service Quotas access the check cannot run; CreateEndpoint still enforces the quota.
        code = exc.response.get("Error", {}).get("Code")
        return QuotaCheck(instance_type, None, None, 0, needed, (), note=f"quota not checked: {code}")
    if found is None:
        return QuotaCheck(instance_type, None, None, 0, needed, (), note="quota not listed by Service Quotas")
    code, value = found
    in_use, using = instances_in_use(sm, instance_type)
    if in_use + needed > value:
        in_use_text = f"{in_use} in use ({', '.join(using)})" if using else "none in use"
        raise QuotaExceeded(
            f"the quota '{instance_type} for endpoint usage' ({code}) is {value:g}; {in_use_text}; "
            f"this deployment needs {needed} more",
            f"aws service-quotas request-service-quota-increase --service-code sagemaker --quota-code {code} "
            f"--desired-value {in_use + needed}, or delete an endpoint, or choose another instance type",
        )
    return QuotaCheck(instance_type, code, value, in_use, needed, tuple(using))
