"""IAM policy evaluation as AWS documents it, for the emulator's enforcement of template.yaml.

Statements: Effect, Action / NotAction (case-insensitive, `*` and `?`), Resource / NotResource
(case-sensitive wildcards), Principal (`*` or AWS ARNs, for resource policies) and Condition. An
explicit Deny wins; otherwise any Allow allows; otherwise the request is implicitly denied.

Conditions follow the IAM reference: operators are ANDed, keys of one operator are ANDed, the
values of one key are ORed -- except for negated operators (StringNotEquals, ArnNotLike, ...),
where a key matches only if it matches none of them. A key missing from the request makes a
condition false, a negated one true, `...IfExists` true, and `Null` tests for exactly that.
ForAnyValue / ForAllValues qualify multivalued keys. An operator this module does not know is an
error, never a silent pass (moto's own evaluator ignores what it does not know).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, Literal

Decision = Literal["allow", "deny", "implicit"]
ContextValue = str | list[str]


class PolicyError(ValueError):
    """A policy the evaluator cannot read (an unknown operator, a malformed statement)."""


@dataclass(frozen=True)
class AuthRequest:
    """One action on one resource, with the request context's condition keys."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)
    principal: str | None = None  # the caller's ARN, matched against resource policies' Principal


@cache
def _wildcard(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    # IAM wildcards: `*` any run of characters, `?` one character; nothing else is special.
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(f"^{body}$", re.IGNORECASE | re.DOTALL if ignore_case else re.DOTALL)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _matches_any(patterns: Any, value: str, ignore_case: bool) -> bool:
    return any(_wildcard(str(p), ignore_case).match(value) for p in _as_list(patterns))


def _principal_matches(principal: Any, caller: str | None) -> bool:
    if principal is None:
        return True  # an identity policy: the caller is whoever holds it
    if principal == "*" or (isinstance(principal, dict) and principal.get("AWS") == "*"):
        return True
    if caller is None or not isinstance(principal, dict):
        return False
    return caller in {str(p) for p in _as_list(principal.get("AWS", []))}


def _string_op(name: str) -> tuple[bool, bool, bool] | None:
    """(negated, wildcard, ignore_case) for the string and ARN operator families."""
    table = {
        "StringEquals": (False, False, False),
        "StringNotEquals": (True, False, False),
        "StringEqualsIgnoreCase": (False, False, True),
        "StringNotEqualsIgnoreCase": (True, False, True),
        "StringLike": (False, True, False),
        "StringNotLike": (True, True, False),
    }
    return table.get(name)


_ARN_OPS = {"ArnEquals": False, "ArnLike": False, "ArnNotEquals": True, "ArnNotLike": True}


def _arn_matches(pattern: str, arn: str) -> bool:
    """ARN operators compare the six colon-separated parts one by one, each with wildcards: a `*`
    never spans a colon between them."""
    wanted, actual = pattern.split(":", 5), arn.split(":", 5)
    if len(wanted) != 6 or len(actual) != 6:
        return False
    return all(_wildcard(w, False).match(a) for w, a in zip(wanted, actual, strict=True))


_NUMERIC = {
    "NumericEquals": lambda a, b: a == b,
    "NumericNotEquals": lambda a, b: a != b,
    "NumericLessThan": lambda a, b: a < b,
    "NumericLessThanEquals": lambda a, b: a <= b,
    "NumericGreaterThan": lambda a, b: a > b,
    "NumericGreaterThanEquals": lambda a, b: a >= b,
}


def _one_value(operator: str, actual: str, expected: list[Any]) -> bool:
    """Whether one context value satisfies OPERATOR against the policy's values (the OR of them,
    or for a negated operator, none of them)."""
    if operator in _ARN_OPS:
        hit = any(_arn_matches(str(e), actual) for e in expected)
        return not hit if _ARN_OPS[operator] else hit
    string = _string_op(operator)
    if string is not None:
        negated, wildcard, ignore_case = string
        if wildcard:
            hit = _matches_any(expected, actual, ignore_case)
        elif ignore_case:
            hit = actual.lower() in {str(e).lower() for e in expected}
        else:
            hit = actual in {str(e) for e in expected}
        return not hit if negated else hit
    if operator == "Bool":
        return actual.lower() in {str(e).lower() for e in expected}
    if operator in _NUMERIC:
        try:
            number = float(actual)
        except ValueError:
            return False
        compare = _NUMERIC[operator]
        if operator == "NumericNotEquals":
            return all(compare(number, float(e)) for e in expected)
        return any(compare(number, float(e)) for e in expected)
    raise PolicyError(f"condition operator {operator!r} is not supported by the emulator's IAM evaluation")


def _negated(operator: str) -> bool:
    string = _string_op(operator)
    return bool(string and string[0]) or _ARN_OPS.get(operator, False) or operator == "NumericNotEquals"


def _condition_holds(raw_operator: str, key: str, expected: Any, context: Mapping[str, ContextValue]) -> bool:
    qualifier, _, operator = raw_operator.rpartition(":")
    if qualifier not in ("", "ForAnyValue", "ForAllValues"):
        raise PolicyError(f"condition qualifier {qualifier!r} is not an IAM set operator")
    values = _as_list(expected)
    present = key in context
    if operator == "Null":
        wanted_absent = str(values[0]).lower() == "true"
        return (not present) == wanted_absent
    if_exists = operator.endswith("IfExists")
    base = operator.removesuffix("IfExists")
    if not present:
        if qualifier == "ForAllValues":
            return True  # vacuously: no value fails
        return if_exists or _negated(base)
    actual = [str(v) for v in _as_list(context[key])]
    if qualifier == "ForAllValues":
        return all(_one_value(base, a, values) for a in actual)
    if qualifier == "ForAnyValue" or len(actual) == 1:
        return any(_one_value(base, a, values) for a in actual)
    raise PolicyError(f"{key} has several values: use ForAnyValue or ForAllValues with {operator}")


def conditions_hold(condition: Mapping[str, Mapping[str, Any]] | None, context: Mapping[str, ContextValue]) -> bool:
    if not condition:
        return True
    if not isinstance(condition, Mapping):
        raise PolicyError("Condition must be an object")
    return all(
        _condition_holds(operator, key, expected, context)
        for operator, keys in condition.items()
        for key, expected in keys.items()
    )


def _listed(statement: Mapping[str, Any], positive: str, negative: str, value: str, ignore_case: bool) -> bool:
    """Whether VALUE is covered by the statement's POSITIVE element, or left out by its NEGATIVE one."""
    if positive in statement:
        return _matches_any(statement[positive], value, ignore_case)
    if negative in statement:
        return not _matches_any(statement[negative], value, ignore_case)
    return positive == "Resource"  # a statement with neither (a trust policy) names no resource


def _statement_applies(statement: Mapping[str, Any], request: AuthRequest) -> bool:
    if "Action" not in statement and "NotAction" not in statement:
        raise PolicyError("a statement needs Action or NotAction")
    return (
        _listed(statement, "Action", "NotAction", request.action, ignore_case=True)
        and _listed(statement, "Resource", "NotResource", request.resource, ignore_case=False)
        and _principal_matches(statement.get("Principal"), request.principal)
        and conditions_hold(statement.get("Condition"), request.context)
    )


def evaluate(statements: Sequence[Mapping[str, Any]], request: AuthRequest) -> Decision:
    """The decision of one policy's statements on one request."""
    decision: Decision = "implicit"
    for statement in statements:
        effect = statement.get("Effect")
        if effect not in ("Allow", "Deny"):
            raise PolicyError(f"statement Effect must be Allow or Deny, not {effect!r}")
        if not _statement_applies(statement, request):
            continue
        if effect == "Deny":
            return "deny"
        decision = "allow"
    return decision


def allowed(
    identity: Sequence[Mapping[str, Any]], request: AuthRequest, resource_policy: Sequence[Mapping[str, Any]] = ()
) -> Decision:
    """Identity policy and (same account) resource policy together: any explicit Deny denies; an Allow
    in either allows; else implicitly denied."""
    first = evaluate(identity, request)
    second = evaluate(resource_policy, request) if resource_policy else "implicit"
    if "deny" in (first, second):
        return "deny"
    return "allow" if "allow" in (first, second) else "implicit"


def statements_of(document: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """A policy document's statements (a single statement object counts as a list of one)."""
    if isinstance(document, Mapping):
        body = document.get("Statement", [])
        return [body] if isinstance(body, Mapping) else list(body)
    return list(document)
