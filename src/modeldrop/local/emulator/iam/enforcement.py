"""IAM, enforced in the emulator: every AWS call a function makes is checked against that function's
statements in template.yaml (and, for S3, the bucket's policy) before it reaches moto.

A function runs as its principal (`acting_as`) for the length of its handler, and the worker
threads it starts inherit it. A call no statement allows, or one a bucket policy denies, fails with
the service's own AccessDenied error, as it would on AWS. Code outside a function -- the tests, the
local run, SageMaker's own reads of model data -- runs as no principal and is not checked.

Every checked call is kept in `CHECKED` (principal, service:operation, decision), so a test can
show that the functions' calls were all authorized, and which were refused.
"""

# Patching botocore and the thread pool is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,attr-defined,union-attr"
from __future__ import annotations

import contextvars
import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import ClientError

from modeldrop.local.emulator.iam.calls import Call, requests_for
from modeldrop.local.emulator.iam.policy import AuthRequest, allowed, statements_of

ACCOUNT = "123456789012"


@dataclass(frozen=True)
class Principal:
    name: str  # the function's logical id, or a test's label
    arn: str  # its role ARN: aws:PrincipalArn
    statements: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Checked:
    principal: str
    call: str
    decision: str
    denied: tuple[str, ...] = ()


@dataclass
class _State:
    enforcing: bool = True
    checked: list[Checked] = field(default_factory=list)
    # After a call succeeds, under any principal: (service, operation, callback(params, result)).
    after: list[tuple[str, str, Callable[[Mapping[str, Any], Any], None]]] = field(default_factory=list)
    # Before a call is made, under any principal: (service, operation, callback(params)).
    before: list[tuple[str, str, Callable[[Mapping[str, Any]], None]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("modeldrop_principal", default=None)
# One token per function invocation (its worker threads share it): a killed invocation makes no more calls.
_invocation: contextvars.ContextVar[object | None] = contextvars.ContextVar("modeldrop_invocation", default=None)
_killed: set[object] = set()


class LambdaKilled(Exception):
    """The invocation was killed (as at its timeout): it made no call after this."""

    error_type = "Sandbox.Timedout"


def kill_current() -> None:
    """Kill the running invocation: this call and every later one it (or its threads) makes fails."""
    token = _invocation.get()
    if token is not None:
        _killed.add(token)
    raise LambdaKilled("the function was killed mid-invocation (as at its timeout)")


STATE = _State()
CHECKED = STATE.checked
_installed = False

# The error code each service answers a refused call with.
DENIED_CODES = {"s3": "AccessDenied", "iam": "AccessDenied", "sts": "AccessDenied"}


@contextmanager
def acting_as(principal: Principal | None) -> Iterator[None]:
    """Run the block as PRINCIPAL (None: outside any function, unchecked), as one invocation."""
    token = _current.set(principal)
    invocation = _invocation.set(object())
    try:
        yield
    finally:
        _invocation.reset(invocation)
        _current.reset(token)


def current() -> Principal | None:
    return _current.get()


def after_call(service: str, operation: str, callback: Callable[[Mapping[str, Any], Any], None]) -> None:
    """Run CALLBACK(params, result) after every successful SERVICE:OPERATION call (a fault's trigger)."""
    STATE.after.append((service, operation, callback))


def before_call(service: str, operation: str, callback: Callable[[Mapping[str, Any]], None]) -> None:
    """Run CALLBACK(params) before every SERVICE:OPERATION call is made (a race's trigger)."""
    STATE.before.append((service, operation, callback))


def reset() -> None:
    with STATE.lock:
        STATE.checked.clear()
        STATE.after.clear()
        STATE.before.clear()
        STATE.enforcing = True
        _killed.clear()


def install() -> None:
    """Patch botocore's call path and the thread pool once per process."""
    global _installed
    if _installed:
        return
    import botocore.client

    original = botocore.client.BaseClient._make_api_call

    def make_api_call(self: Any, operation_name: str, api_params: dict[str, Any]) -> Any:
        service = self.meta.service_model.service_name
        if _invocation.get() in _killed:
            raise LambdaKilled("the function was killed mid-invocation (as at its timeout)")
        principal = _current.get()
        for hook_service, hook_operation, hook in list(STATE.before):
            if hook_service == service and hook_operation == operation_name:
                hook(api_params)
        if principal is not None and STATE.enforcing and (service, operation_name) == ("s3", "DeleteObjects"):
            result = _delete_objects(principal, self, original, api_params)
        else:
            if principal is not None and STATE.enforcing:
                _authorize(principal, Call(service, operation_name, api_params, self.meta.region_name, ACCOUNT))
            result = original(self, operation_name, api_params)
        for hook_service, hook_operation, callback in list(STATE.after):
            if hook_service == service and hook_operation == operation_name:
                callback(api_params, result)
        return result

    botocore.client.BaseClient._make_api_call = make_api_call

    submit = ThreadPoolExecutor.submit

    def submit_in_context(self: Any, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        # A function's worker threads (part copies, s3transfer) act as the function did.
        return submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

    ThreadPoolExecutor.submit = submit_in_context
    _installed = True


def _delete_objects(principal: Principal, client: Any, original: Any, params: dict[str, Any]) -> Any:
    """DeleteObjects as S3 answers it: each key authorized on its own; a denied one is an entry of the
    200 response's Errors (with Quiet too), never an error of the whole call."""
    keep, errors = [], []
    for entry in params["Delete"]["Objects"]:
        one = {"Bucket": params["Bucket"], "Delete": {"Objects": [entry]}}
        if _denials(principal, Call("s3", "DeleteObjects", one, client.meta.region_name, ACCOUNT)):
            errors.append({**entry, "Code": "AccessDenied", "Message": "Access Denied"})
        else:
            keep.append(entry)
    with STATE.lock:
        verdict = "denied" if errors else "allowed"
        STATE.checked.append(Checked(principal.name, "s3:DeleteObjects", verdict, tuple(e["Key"] for e in errors)))
    result: dict[str, Any] = {"Deleted": [], "Errors": []}
    if keep:
        result = dict(original(client, "DeleteObjects", {**params, "Delete": {**params["Delete"], "Objects": keep}}))
    if errors:
        result["Errors"] = [*result.get("Errors", []), *errors]
    return result


def _denials(principal: Principal, call: Call) -> list[str]:
    lookups = _MotoLookups(call.region)
    denied = []
    for r in requests_for(call, lookups):
        request = AuthRequest(
            r.action,
            r.resource,
            {"aws:PrincipalArn": principal.arn, "aws:SecureTransport": "true", **r.context},
            principal.arn,
        )
        resource_policy = _bucket_policy(request.resource) if call.service == "s3" else ()
        if allowed(principal.statements, request, resource_policy) != "allow":
            denied.append(f"{request.action} on {request.resource}")
    return denied


def _authorize(principal: Principal, call: Call) -> None:
    denied = _denials(principal, call)
    name = f"{call.service}:{call.operation}"
    with STATE.lock:
        STATE.checked.append(Checked(principal.name, name, "denied" if denied else "allowed", tuple(denied)))
    if denied:
        code = DENIED_CODES.get(call.service, "AccessDeniedException")
        message = (
            f"User: {principal.arn} is not authorized to perform: {denied[0]} because no identity-based policy "
            "allows it, or a resource-based policy denies it"
        )
        raise ClientError({"Error": {"Code": code, "Message": message}}, call.operation)


def _bucket_policy(resource: str) -> Sequence[Mapping[str, Any]]:
    if not resource.startswith("arn:aws:s3:::"):
        return ()
    bucket_name = resource[len("arn:aws:s3:::") :].split("/", 1)[0]
    from moto.s3.models import s3_backends

    bucket = s3_backends[ACCOUNT]["aws"].buckets.get(bucket_name)
    raw = getattr(bucket, "policy", None)
    if not raw:
        return ()
    return statements_of(json.loads(raw))


# Resources moto does not model, kept by the emulator's own services beside moto's backends: a kind
# (as an ARN writes it) and how to find its table in the SageMaker backend. The services register
# them (moto_shims.install), so that IAM needs to know none of them.
_TAG_TABLES: dict[str, Callable[[Any], Mapping[str, Any]]] = {}


def register_tag_table(kind: str, table_of: Callable[[Any], Mapping[str, Any]]) -> None:
    _TAG_TABLES[kind] = table_of


class _MotoLookups:
    """Resource facts the services know, read from moto's backends (never through a client call)."""

    def __init__(self, region: str) -> None:
        self.region = region

    def sagemaker_tags(self, arn: str) -> dict[str, str] | None:
        from moto.sagemaker.models import sagemaker_backends

        backend = sagemaker_backends[ACCOUNT][self.region]
        kind, _, name = arn.rsplit(":", 1)[-1].partition("/")
        table: dict[str, Mapping[str, Any]] = {
            "endpoint": backend.endpoints,
            "endpoint-config": backend.endpoint_configs,
            "model": backend._models,
            **{other: table_of(backend) for other, table_of in _TAG_TABLES.items()},
        }
        # SageMaker names are case-insensitive, and its ARNs are written in lower case.
        for key, resource in table.get(kind, {}).items():
            if key.lower() == name.lower():
                return {t["Key"]: t["Value"] for t in resource.tags or []}
        return None

    def secret(self, secret_id: str) -> tuple[str, str | None] | None:
        from moto.secretsmanager.models import secretsmanager_backends

        store = secretsmanager_backends[ACCOUNT][self.region].secrets
        if secret_id not in store:
            return None
        secret = store[secret_id]
        key = secret.kms_key_id
        return secret.arn, _customer_key(key, self.region)

    def parameter_key(self, name: str) -> str | None:
        from moto.ssm.models import ssm_backends

        parameter = ssm_backends[ACCOUNT][self.region].get_parameter(name)
        if parameter is None or parameter.parameter_type != "SecureString":
            return None
        return _customer_key(parameter.keyid, self.region)


def _customer_key(key: str | None, region: str) -> str | None:
    """A customer-managed KMS key as an ARN; None for the service's own AWS-managed key."""
    if not key or key.startswith("alias/aws/"):
        return None
    if key.startswith("arn:"):
        return key
    return f"arn:aws:kms:{region}:{ACCOUNT}:{'key/' + key if not key.startswith('alias/') else key}"
