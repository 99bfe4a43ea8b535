"""The SageMaker execution role's trust policy: which services may assume it.

The source lab's role trusted only Bedrock, so SageMaker could not assume it: CreateModel refused
it only after the artifact had been validated and copied. Read by `modeldrop doctor` and by the
state machine's RegisterDeployment step, before anything is created.
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_iam import IAMClient

SAGEMAKER = "sagemaker.amazonaws.com"
TRUST_FIX = (
    "aws iam update-assume-role-policy --role-name {name} --policy-document "
    '\'{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":{{"Service":'
    '"sagemaker.amazonaws.com"}},"Action":"sts:AssumeRole"}}]}}\''
)


def trusted_services(document: Any) -> set[str]:
    """The services an assume-role policy document (JSON, URL-encoded as IAM returns it, or parsed) allows."""
    if isinstance(document, str):
        document = json.loads(urllib.parse.unquote(document)) if document.strip() else {}
    services: set[str] = set()
    statements = document.get("Statement", []) if isinstance(document, dict) else []
    for statement in statements if isinstance(statements, list) else [statements]:
        actions = statement.get("Action", [])
        actions = [actions] if isinstance(actions, str) else actions
        if statement.get("Effect") != "Allow" or not any(a in ("sts:AssumeRole", "sts:*", "*") for a in actions):
            continue
        principal = statement.get("Principal", {})
        service = principal.get("Service", []) if isinstance(principal, dict) else []
        services.update([service] if isinstance(service, str) else service)
    return services


class RoleUnreadable(Exception):
    """GetRole refused (AccessDenied and the like): the trust cannot be checked, CreateModel decides."""


def role_problem(iam: IAMClient, role_arn: str) -> tuple[str, str] | None:
    """(what is wrong, the fix) when SageMaker cannot assume ROLE_ARN; None when it can. Raises
    RoleUnreadable when the role cannot be read."""
    name = role_arn.rsplit("/", 1)[-1]
    try:
        role = iam.get_role(RoleName=name)["Role"]
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code == "NoSuchEntity":
            return (
                f"{role_arn} does not exist",
                "create a role that trusts sagemaker.amazonaws.com and redeploy with SageMakerExecutionRoleArn",
            )
        raise RoleUnreadable(f"could not read {name}: {code}") from None
    trusted = trusted_services(role.get("AssumeRolePolicyDocument", {}))
    if SAGEMAKER in trusted:
        return None
    seen = ", ".join(sorted(trusted)) or "no service"
    return f"{name} trusts {seen}, not {SAGEMAKER}: SageMaker cannot assume it", TRUST_FIX.format(name=name)
