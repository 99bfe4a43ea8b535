"""IAM's SimulatePrincipalPolicy in the emulator (moto 5.2.5 has none): a role's inline and attached
policies judged by the emulator's own policy evaluator (local.iam_policy), one result per action with
one per resource inside it, with IAM's decisions (allowed, explicitDeny, implicitDeny). `modeldrop doctor` asks it
whether the SageMaker role may read the artifact bucket."""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="attr-defined"
from __future__ import annotations

import json
from typing import Any

from modeldrop.local.emulator.iam.policy import AuthRequest, allowed, statements_of

_DECISIONS = {"allow": "allowed", "deny": "explicitDeny", "implicit": "implicitDeny"}


def role_statements(backend: Any, role_arn: str) -> list[Any]:
    """Every statement of the role's inline and attached (default version) policies."""
    role = backend.get_role(role_arn.rsplit("/", 1)[-1])
    documents = [*role.policies.values()]
    for policy in role.managed_policies.values():
        documents += [v.document for v in policy.versions if v.is_default]
    return [s for doc in documents for s in statements_of(json.loads(doc) if isinstance(doc, str) else doc)]


def simulate(statements: list[Any], actions: list[str], resources: list[str]) -> list[dict[str, Any]]:
    """One result per action, with one resource-specific result per resource; the action's own
    decision is the most restrictive of them, as IAM answers."""
    results = []
    for action in actions:
        specific = [
            {
                "EvalResourceName": resource,
                "EvalResourceDecision": _DECISIONS[allowed(statements, AuthRequest(action, resource))],
            }
            for resource in resources or ["*"]
        ]
        decisions = {s["EvalResourceDecision"] for s in specific}
        top = next((d for d in ("explicitDeny", "implicitDeny") if d in decisions), "allowed")
        results.append(
            {
                "EvalActionName": action,
                "EvalResourceName": "*",
                "EvalDecision": top,
                "ResourceSpecificResults": specific,
            }
        )
    return results


def install() -> None:
    from moto.core.responses import ActionResult
    from moto.iam.responses import IamResponse

    def simulate_principal_policy(self: Any) -> Any:
        statements = role_statements(self.backend, self._get_param("PolicySourceArn"))
        results = simulate(statements, self._get_param("ActionNames", []), self._get_param("ResourceArns", []))
        return ActionResult({"EvaluationResults": results, "IsTruncated": False})

    IamResponse.simulate_principal_policy = simulate_principal_policy
