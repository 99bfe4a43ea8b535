"""The execution role's trust as doctor and RegisterDeployment's preflight read it (one GetRole)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from botocore.exceptions import ClientError

from modeldrop.aws.sagemaker.execution_role import RoleUnreadable, role_problem
from modeldrop.operate.doctor import check_role_trust

ARN = "arn:aws:iam::123456789012:role/serving"


class FakeIam:
    def __init__(self, trust: Any = None, error: str | None = None) -> None:
        self.trust, self.error, self.calls = trust, error, 0

    def get_role(self, RoleName: str) -> dict[str, Any]:
        self.calls += 1
        if self.error:
            raise ClientError({"Error": {"Code": self.error, "Message": "x"}}, "GetRole")
        return {"Role": {"AssumeRolePolicyDocument": json.dumps(self.trust)}}


def _trust(service: str) -> dict[str, Any]:
    return {"Statement": [{"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]}


def test_one_get_role_decides_trusted_untrusted_missing_or_unreadable() -> None:
    trusted = FakeIam(_trust("sagemaker.amazonaws.com"))
    assert role_problem(trusted, ARN) is None and check_role_trust(trusted, ARN).status == "ok"
    bedrock = FakeIam(_trust("bedrock.amazonaws.com"))
    check = check_role_trust(bedrock, ARN)
    assert check.status == "fail" and "trusts bedrock.amazonaws.com" in check.detail and bedrock.calls == 1
    missing = FakeIam(error="NoSuchEntity")
    assert "does not exist" in check_role_trust(missing, ARN).detail and missing.calls == 1
    denied = FakeIam(error="AccessDenied")
    with pytest.raises(RoleUnreadable, match="AccessDenied"):
        role_problem(denied, ARN)
    assert check_role_trust(denied, ARN).status == "warn"


class _SimulatingIam:
    """SimulatePrincipalPolicy as AWS answers it for a role with GetObject on bucket/* and
    ListBucket on the bucket (and, with LIST=False, no ListBucket at all)."""

    def __init__(self, list_allowed: bool = True) -> None:
        self.list_allowed = list_allowed

    def simulate_principal_policy(self, **kwargs: object) -> dict[str, object]:
        bucket, objects = "arn:aws:s3:::b", "arn:aws:s3:::b/*"
        grants = {("s3:GetObject", objects), *({("s3:ListBucket", bucket)} if self.list_allowed else set())}
        results = []
        for action in kwargs["ActionNames"]:  # type: ignore[attr-defined]
            specific = [
                {"EvalResourceName": r, "EvalResourceDecision": "allowed" if (action, r) in grants else "implicitDeny"}
                for r in (objects, bucket)
            ]
            # The top-level decision is the most restrictive over every resource asked about.
            top = "allowed" if all(s["EvalResourceDecision"] == "allowed" for s in specific) else "implicitDeny"
            results.append({"EvalActionName": action, "EvalDecision": top, "ResourceSpecificResults": specific})
        return {"EvaluationResults": results}


def test_doctor_reads_each_action_on_its_own_resource() -> None:
    from modeldrop.operate.doctor import check_role_reads_bucket

    role = "arn:aws:iam::123456789012:role/sm"
    assert check_role_reads_bucket(_SimulatingIam(), role, "b").status == "ok"  # type: ignore[arg-type]
    missing = check_role_reads_bucket(_SimulatingIam(list_allowed=False), role, "b")  # type: ignore[arg-type]
    assert missing.status == "fail" and "s3:ListBucket" in missing.detail and "s3:GetObject" not in missing.detail
