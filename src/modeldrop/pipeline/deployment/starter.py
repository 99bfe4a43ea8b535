"""S3 'Object Created' event -> at most one deployment execution.

S3 delivers events at least once, so the execution name is derived from bucket/key/version-id and
ExecutionAlreadyExists means 'already handled'. A marker object (modeldrop.json) closes an
uncompressed safetensors prefix and may carry per-model overrides.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import posixpath
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError

from modeldrop.aws.s3.served_copy import SERVED_PREFIX
from modeldrop.contracts.errors import ModeldropError, RequestInvalid, describe_validation
from modeldrop.contracts.models import DeploymentRequest, GateThresholds, parse_request

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_stepfunctions import SFNClient

    from modeldrop.aws.dynamodb.registry import Registry

ARCHIVE_SUFFIX = "model.tar.gz"
MARKER_NAME = "modeldrop.json"
# A marker may override any request field except where the artifact is and how it arrived -- and
# the two that are capabilities rather than settings: anyone who can write to the bucket can write a
# marker, so it may not name secrets to inject, an endpoint name to take over, or another deployment's
# endpoint to put adapters on (a direct start may).
MARKER_ONLY_BY_DIRECT_START = {"secrets", "endpoint_name", "base_endpoint"}
OVERRIDE_FIELDS = set(DeploymentRequest.model_fields) - {"artifact_uri", "source"} - MARKER_ONLY_BY_DIRECT_START


class S3Object(BaseModel):
    key: str
    version_id: str | None = None
    size: int | None = None

    @classmethod
    def from_event(cls, event: dict[str, Any]) -> tuple[str, S3Object]:
        """(bucket, object) of an S3 'Object Created' EventBridge event. S3 sends the key URL-encoded
        (`runs/exp+1%2Bb/model.tar.gz`); Powertools' own data class decodes it, as every AWS consumer does."""
        from aws_lambda_powertools.utilities.data_classes import S3EventBridgeNotificationEvent

        detail = S3EventBridgeNotificationEvent(event).detail
        raw = event["detail"]["object"]
        return detail.bucket.name, cls(key=detail.object.key, version_id=raw.get("version-id"), size=raw.get("size"))


class StartOutcome(BaseModel):
    status: Literal["started", "duplicate", "ignored", "rejected"]
    execution_name: str | None = None
    execution_arn: str | None = None
    artifact_uri: str | None = None
    reason: str | None = None


# Keys under this prefix never start a deployment from their upload event: a pipeline that writes
# its model here starts (and waits for) the deployment itself, so one artifact is deployed once.
DIRECT_PREFIX = "direct/"


def classify_key(key: str) -> Literal["archive", "marker"] | None:
    base = posixpath.basename(key)
    if base == ARCHIVE_SUFFIX or key.endswith(ARCHIVE_SUFFIX):
        return "archive"
    if base == MARKER_NAME:
        return "marker"
    return None


def execution_name(bucket: str, key: str, version_id: str | None) -> str:
    digest = hashlib.sha256(f"{bucket}/{key}#{version_id or 'null'}".encode()).hexdigest()
    return f"s3-{digest[:24]}"


# A marker is a few overrides: anything larger, or nested deeper, is not one (and a deep one would
# exhaust the parser's recursion).
MAX_MARKER_BYTES = 64 * 1024
MAX_MARKER_DEPTH = 32


def parse_marker(raw: bytes, uri: str) -> dict[str, Any]:
    """The marker's overrides, read as schemas/modeldrop-marker.schema.json states them: UTF-8 JSON (RFC
    8259: no byte-order mark, no UTF-16), one object, only the fields a marker may set. Anything else is
    RequestInvalid naming what is wrong -- never an exception."""
    fix = f'{MARKER_NAME} holds {{}} or overrides such as {{"engine": "vllm"}} (UTF-8 JSON)'
    if len(raw) > MAX_MARKER_BYTES:
        raise RequestInvalid(f"{uri} is {len(raw)} bytes, over {MAX_MARKER_BYTES}: a marker holds a few overrides", fix)
    if raw.startswith(b"\xef\xbb\xbf"):
        raise RequestInvalid(f"{uri} starts with a UTF-8 byte-order mark, which JSON (RFC 8259) does not allow", fix)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestInvalid(f"{uri} is not UTF-8 (UTF-16 or another encoding?)", fix) from None
    if not text.strip():
        raise RequestInvalid(
            f"{uri} is empty: a marker is a JSON object", "write {} to close the prefix with no overrides"
        )
    if _depth(text) > MAX_MARKER_DEPTH:
        raise RequestInvalid(f"{uri} nests deeper than {MAX_MARKER_DEPTH} levels: not a marker", fix)
    try:
        data = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, NaN/Infinity, an integer of 4,300+ digits
        raise RequestInvalid(f"{uri} is not valid JSON: {str(exc)[:200]}", fix) from None
    if not isinstance(data, dict):
        raise RequestInvalid(f"{uri} must hold a JSON object")
    reserved = sorted(set(data) & MARKER_ONLY_BY_DIRECT_START)
    if reserved:
        raise RequestInvalid(
            f"{uri}: a marker may not set {reserved}: anyone who can write to the bucket could",
            "start the deployment directly (StartExecution / modeldrop deploy) to use them",
        )
    unknown = set(data) - OVERRIDE_FIELDS
    if unknown:
        close = {
            k: m[0] for k in sorted(unknown)[:10] if (m := difflib.get_close_matches(str(k), OVERRIDE_FIELDS, n=1))
        }
        meant = "; ".join(f"{k!r}: did you mean {v!r}?" for k, v in close.items())
        raise RequestInvalid(
            f"{uri}: unknown override(s) {sorted(unknown)[:10]}" + (f" ({meant})" if meant else ""),
            f"allowed: {sorted(OVERRIDE_FIELDS)}",
        )
    _gate_not_loosened(data.get("gate"), uri)
    return data


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _depth(text: str) -> int:
    """How deep TEXT's arrays and objects nest (brackets inside strings do not count)."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (char == "\\", char != '"')
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _gate_not_loosened(gate: Any, uri: str) -> None:
    """A marker may tighten a channel's gate, never loosen it: anyone who can write to the bucket could
    otherwise wave a regression onto a channel (a direct start may, within the stack's limits). Its
    latency slack is noise in seconds, bounded for every request by the stack's MaxGateLatencySlack."""
    if not isinstance(gate, dict):
        return  # absent, or not an object: the request's own validation says what is wrong
    try:
        looser = GateThresholds.model_validate(gate).looser_than(GateThresholds())
    except ValidationError:
        return
    if looser:
        raise RequestInvalid(
            f"{uri}: a marker may not loosen the channel's gate ({', '.join(looser)} past the defaults)",
            "tighten it only, or start the deployment directly (StartExecution / modeldrop deploy)",
        )


def request_for(bucket: str, key: str, marker: dict[str, Any] | None) -> DeploymentRequest:
    kind = classify_key(key)
    if kind == "archive":
        raw: dict[str, Any] = {"artifact_uri": f"s3://{bucket}/{key}", "source": "s3-event"}
    else:
        prefix = posixpath.dirname(key)
        raw = {
            "artifact_uri": f"s3://{bucket}/{prefix + '/' if prefix else ''}",
            "source": "s3-event",
            **(marker or {}),
        }
    try:
        return parse_request(raw)
    except ValidationError as exc:
        raise RequestInvalid(f"s3://{bucket}/{key}: {describe_validation(exc)}") from None


def start_from_event(
    event: dict[str, Any], s3: S3Client, sfn: SFNClient, state_machine_arn: str, artifact_bucket: str
) -> StartOutcome:
    """Start at most one execution. A bad marker or event is rejected rather than raised: a retry
    would only read the same bad input, and nothing must start for it. An AWS error (StartExecution
    throttled or denied, the marker unreadable) is raised: Lambda retries the event, then hands it to
    the starter's failure queue, where it can be redriven."""
    try:
        return _start(event, s3, sfn, state_machine_arn, artifact_bucket)
    except ModeldropError as exc:
        rejected = StartOutcome(status="rejected", reason=f"{type(exc).__name__}: {exc}")
        try:  # which upload it was, when the event says: the rejection is recorded under it
            bucket, obj = S3Object.from_event(event)
        except (KeyError, TypeError, ValueError):
            return rejected
        if bucket != artifact_bucket:
            return rejected
        name = execution_name(bucket, obj.key, obj.version_id)
        return rejected.model_copy(update={"execution_name": name, "artifact_uri": f"s3://{bucket}/{obj.key}"})


def record_rejected(outcome: StartOutcome, registry: Registry, announce: Callable[[dict[str, Any]], None]) -> bool:
    """A rejected upload made visible: a closed `rejected-*` record `modeldrop list` shows (once per upload:
    a redelivered event records nothing new) and, when it is new, ANNOUNCE (a Deployment Rejected event).
    False when the outcome names no upload (an event of another shape) or the record exists already."""
    if outcome.status != "rejected" or not outcome.execution_name or not outcome.artifact_uri:
        return False
    deployment_id, reason = rejection_id(outcome.execution_name), str(outcome.reason)
    if not registry.record_rejection(deployment_id, outcome.execution_name, outcome.artifact_uri, reason):
        return False
    announce({"artifact_uri": outcome.artifact_uri, "reason": reason, "deployment_id": deployment_id})
    return True


def rejection_id(name: str) -> str:
    """The record id of a rejected upload (the starter's role may write only ids of this form)."""
    return "rejected-" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _start(
    event: dict[str, Any], s3: S3Client, sfn: SFNClient, state_machine_arn: str, artifact_bucket: str
) -> StartOutcome:
    try:
        bucket, obj = S3Object.from_event(event)
    except (KeyError, TypeError):
        raise RequestInvalid("event is not an S3 'Object Created' EventBridge event") from None
    if bucket != artifact_bucket:
        return StartOutcome(status="ignored", reason=f"bucket {bucket} is not the artifact bucket")
    if obj.key.startswith(SERVED_PREFIX):
        return StartOutcome(status="ignored", reason=f"{obj.key} is a copy modeldrop serves, not an upload")
    if obj.key.startswith(DIRECT_PREFIX):
        return StartOutcome(
            status="ignored", reason=f"{obj.key} is under {DIRECT_PREFIX}: whoever uploaded it starts it directly"
        )
    kind = classify_key(obj.key)
    if kind is None:
        return StartOutcome(
            status="ignored", reason=f"{obj.key} is neither *{ARCHIVE_SUFFIX} nor a {MARKER_NAME} marker"
        )
    marker = None
    if kind == "marker":
        kwargs: dict[str, Any] = {"Bucket": bucket, "Key": obj.key}
        if obj.version_id and obj.version_id != "null":
            kwargs["VersionId"] = obj.version_id
        marker = parse_marker(s3.get_object(**kwargs)["Body"].read(), f"s3://{bucket}/{obj.key}")
    request = request_for(bucket, obj.key, marker)
    name = execution_name(bucket, obj.key, obj.version_id)
    try:
        arn = sfn.start_execution(
            stateMachineArn=state_machine_arn,
            name=name,
            input=request.model_dump_json(exclude_none=True),
        )["executionArn"]
    except sfn.exceptions.ExecutionAlreadyExists:
        return StartOutcome(
            status="duplicate", execution_name=name, artifact_uri=str(request.artifact_uri), reason="already handled"
        )
    return StartOutcome(
        status="started", execution_name=name, execution_arn=arn, artifact_uri=str(request.artifact_uri)
    )
