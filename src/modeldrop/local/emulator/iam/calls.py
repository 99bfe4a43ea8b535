"""What IAM authorizes for each AWS call the functions make: action, resource ARN, condition keys.

Read off the Service Authorization Reference and the services' API references, one row per
operation: a call whose operation has no row here is refused loudly in the emulator, so a handler
that starts calling something new gets a row (and a template statement) before it passes a test.
Only the keys modeldrop's template conditions on, and the global ones, are filled in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from modeldrop.local.emulator.iam.policy import AuthRequest, ContextValue
from modeldrop.local.emulator.iam.sar import NotInReference, check


class Lookups(Protocol):
    """What only the service knows about a resource the call names (read from the emulator)."""

    def sagemaker_tags(self, arn: str) -> dict[str, str] | None: ...

    def secret(self, secret_id: str) -> tuple[str, str | None] | None: ...  # (ARN, KMS key ARN or None)

    def parameter_key(self, name: str) -> str | None: ...  # a SecureString's KMS key ARN


@dataclass(frozen=True)
class Call:
    service: str
    operation: str
    params: Mapping[str, Any]
    region: str
    account: str


Rule = Callable[[Call, Lookups], list[AuthRequest]]


class UnmappedCall(LookupError):
    """A call the emulator does not know how to authorize: add a row to RULES."""


def _arn(call: Call, service: str, resource: str, region: bool = True, account: bool = True) -> str:
    return f"arn:aws:{service}:{call.region if region else ''}:{call.account if account else ''}:{resource}"


# ---- S3 -------------------------------------------------------------------------------------------


def _object(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def _s3_read(call: Call, bucket: str, key: str, version: str | None) -> AuthRequest:
    return AuthRequest("s3:GetObjectVersion" if version else "s3:GetObject", _object(bucket, key))


def _copy_source(call: Call) -> AuthRequest:
    source = call.params["CopySource"]
    if isinstance(source, str):
        path, _, query = source.lstrip("/").partition("?versionId=")
        bucket, _, key = path.partition("/")
        return _s3_read(call, bucket, key, query or None)
    return _s3_read(call, source["Bucket"], source["Key"], source.get("VersionId"))


def _s3_get(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    p = call.params
    return [_s3_read(call, p["Bucket"], p["Key"], p.get("VersionId"))]


def _s3_put(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    return [AuthRequest("s3:PutObject", _object(call.params["Bucket"], call.params["Key"]))]


def _s3_copy(call: Call, lookups: Lookups) -> list[AuthRequest]:
    return [*_s3_put(call, lookups), _copy_source(call)]


def _s3_list_context(p: Mapping[str, Any]) -> dict[str, ContextValue]:
    context: dict[str, ContextValue] = {}
    for param, key in (("Prefix", "s3:prefix"), ("Delimiter", "s3:delimiter")):
        if p.get(param) is not None:
            context[key] = str(p[param])
    if p.get("MaxKeys") is not None:
        context["s3:max-keys"] = str(p["MaxKeys"])
    return context


def _s3_list(action: str, keyed: bool = True) -> Rule:
    """KEYED: the SAR gives the action the s3:prefix/delimiter/max-keys keys (ListBucket and
    ListBucketVersions; ListBucketMultipartUploads has none, so a policy cannot narrow it by prefix)."""

    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        p = call.params
        return [AuthRequest(action, f"arn:aws:s3:::{p['Bucket']}", _s3_list_context(p) if keyed else {})]

    return rule


def _s3_delete(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    p = call.params
    action = "s3:DeleteObjectVersion" if p.get("VersionId") else "s3:DeleteObject"
    return [AuthRequest(action, _object(p["Bucket"], p["Key"]))]


def _s3_delete_many(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    # DeleteObjects is authorized object by object, as the single delete of each would be.
    p = call.params
    return [
        AuthRequest(
            "s3:DeleteObjectVersion" if o.get("VersionId") else "s3:DeleteObject", _object(p["Bucket"], o["Key"])
        )
        for o in p["Delete"]["Objects"]
    ]


def _s3_object(action: str) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        return [AuthRequest(action, _object(call.params["Bucket"], call.params["Key"]))]

    return rule


def _s3_bucket(action: str) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        return [AuthRequest(action, f"arn:aws:s3:::{call.params['Bucket']}")]

    return rule


# ---- SageMaker -----------------------------------------------------------------------------------


def _sm_arn(call: Call, kind: str, name: str) -> str:
    # SageMaker writes resource names in lower case in its ARNs.
    return _arn(call, "sagemaker", f"{kind}/{name.lower()}")


def _request_tags(tags: list[Mapping[str, str]] | None) -> dict[str, ContextValue]:
    if not tags:
        return {}
    context: dict[str, ContextValue] = {f"aws:RequestTag/{t['Key']}": t.get("Value", "") for t in tags}
    context["aws:TagKeys"] = [t["Key"] for t in tags]
    return context


def _resource_tags(lookups: Lookups, arn: str) -> dict[str, ContextValue]:
    return {f"aws:ResourceTag/{k}": v for k, v in (lookups.sagemaker_tags(arn) or {}).items()}


def _sm_create(kind: str, name_param: str, also: Callable[[Call], list[tuple[str, str]]] | None = None) -> Rule:
    """A create with tags: the action and AddTags (tagging on create needs it) on the new resource; ALSO: more."""

    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        arn = _sm_arn(call, kind, call.params[name_param])
        tags = _request_tags(call.params.get("Tags"))
        action = f"sagemaker:Create{''.join(w.capitalize() for w in kind.split('-'))}"
        isolation = {"sagemaker:NetworkIsolation": str(call.params.get("EnableNetworkIsolation") is True).lower()}
        requests = [AuthRequest(action, arn, {**tags, **isolation} if kind == "model" else tags)]  # CreateModel's key
        requests += [AuthRequest(action, _sm_arn(call, k, n), tags) for k, n in (also(call) if also else [])]
        if call.params.get("Tags"):
            requests.append(AuthRequest("sagemaker:AddTags", arn, tags))
        return requests

    return rule


def _sm_create_passing_role(kind: str, name_param: str) -> Rule:
    """A create that may carry the role SageMaker assumes (a model, a component endpoint config): PassRole too."""

    def rule(call: Call, lookups: Lookups) -> list[AuthRequest]:
        requests = _sm_create(kind, name_param)(call, lookups)
        role = call.params.get("ExecutionRoleArn")
        if role:
            requests.append(AuthRequest("iam:PassRole", role, {"iam:PassedToService": "sagemaker.amazonaws.com"}))
        return requests

    return rule


def _sm_create_component(call: Call, lookups: Lookups) -> list[AuthRequest]:
    """CreateInferenceComponent covers the component and its endpoint (the SAR's two resource types;
    a base component's model is the condition key sagemaker:ModelArn, not a resource)."""
    also = [("endpoint", str(call.params["EndpointName"]))]
    return _sm_create("inference-component", "InferenceComponentName", lambda _c: also)(call, lookups)


def _sm_on(action: str, kind: str, name_param: str, tagged: bool = False) -> Rule:
    def rule(call: Call, lookups: Lookups) -> list[AuthRequest]:
        arn = _sm_arn(call, kind, call.params[name_param])
        return [AuthRequest(f"sagemaker:{action}", arn, _resource_tags(lookups, arn) if tagged else {})]

    return rule


def _sm_by_arn(action: str) -> Rule:
    def rule(call: Call, lookups: Lookups) -> list[AuthRequest]:
        kind, _, name = str(call.params["ResourceArn"]).rsplit(":", 1)[-1].partition("/")
        arn = _sm_arn(call, kind, name)
        context = {**_resource_tags(lookups, arn), **_request_tags(call.params.get("Tags"))}
        return [AuthRequest(f"sagemaker:{action}", arn, context)]

    return rule


def _any_resource(action: str) -> Rule:
    def rule(_call: Call, _lookups: Lookups) -> list[AuthRequest]:
        return [AuthRequest(action, "*")]

    return rule


def _scaling(action: str) -> Rule:
    """Application Auto Scaling: a target's ARN ends in an id the service makes (no caller knows it before it
    exists), so a grant is held to the namespace and dimension (the SAR's condition keys)."""

    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        keys = {"ServiceNamespace": "service-namespace", "ScalableDimension": "scalable-dimension"}
        context: dict[str, ContextValue] = {f"application-autoscaling:{k}": str(call.params[p])
                                            for p, k in keys.items() if p in call.params}  # fmt: skip
        if action == "DescribeScalingActivities":  # no resource type in the SAR
            return [AuthRequest(f"application-autoscaling:{action}", "*", context)]
        named = "|".join(str(call.params.get(k)) for k in ("ServiceNamespace", "ResourceId", "ScalableDimension"))
        target_id = hashlib.sha256(named.encode()).hexdigest()[:32]
        target = _arn(call, "application-autoscaling", f"scalable-target/{target_id}")
        return [AuthRequest(f"application-autoscaling:{action}", target, context)]

    return rule


def _invoke(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    """The Service Authorization Reference lists InvokeEndpointWithResponseStream as an action of its
    own, and inference-component as a resource type of both invoke actions beside endpoint: a call
    naming a component is authorized on the endpoint and on the component."""
    action = (
        "sagemaker:InvokeEndpointWithResponseStream"
        if call.operation.endswith("Stream")
        else "sagemaker:InvokeEndpoint"
    )
    wanted = [AuthRequest(action, _sm_arn(call, "endpoint", call.params["EndpointName"]))]
    component = call.params.get("InferenceComponentName")
    if component:
        wanted.append(AuthRequest(action, _sm_arn(call, "inference-component", component)))
    return wanted


# ---- the rest ------------------------------------------------------------------------------------


def _table(action: str) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        arn = _arn(call, "dynamodb", f"table/{call.params['TableName']}")
        return [AuthRequest(f"dynamodb:{action}", arn, _leading_keys(call.params))]

    return rule


def _leading_keys(params: Mapping[str, Any]) -> dict[str, ContextValue]:
    """dynamodb:LeadingKeys of a Get, Update or DeleteItem: the partition key value it reaches (the tables
    here have a one-attribute key; on the wire a value is typed, {"S": "..."})."""
    key = params.get("Key")
    if not isinstance(key, dict) or len(key) != 1:
        return {}
    value = next(iter(key.values()))
    value = next(iter(value.values()), None) if isinstance(value, dict) else value
    return {"dynamodb:LeadingKeys": [str(value)]} if value is not None else {}


def _log_group(action: str, stream: bool = False) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        resource = f"log-group:{call.params['logGroupName']}"
        if stream:
            resource += f":log-stream:{call.params['logStreamName']}"
        return [AuthRequest(f"logs:{action}", _arn(call, "logs", resource))]

    return rule


def _put_events(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    buses = {str(e.get("EventBusName") or "default") for e in call.params["Entries"]}
    return [
        AuthRequest("events:PutEvents", bus if bus.startswith("arn:") else _arn(call, "events", f"event-bus/{bus}"))
        for bus in sorted(buses)
    ]


def _states(action: str, param: str) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        return [AuthRequest(f"states:{action}", str(call.params[param]))]

    return rule


def _get_role(call: Call, _lookups: Lookups) -> list[AuthRequest]:
    return [AuthRequest("iam:GetRole", _arn(call, "iam", f"role/{call.params['RoleName']}", region=False))]


def _kms_via(call: Call, service: str, key: str | None) -> list[AuthRequest]:
    """A customer-managed key behind a secret or parameter: the caller needs kms:Decrypt on it too."""
    if not key:
        return []
    return [AuthRequest("kms:Decrypt", key, {"kms:ViaService": f"{service}.{call.region}.amazonaws.com"})]


def _get_secret(call: Call, lookups: Lookups) -> list[AuthRequest]:
    found = lookups.secret(str(call.params["SecretId"]))
    arn, key = found if found else (_arn(call, "secretsmanager", f"secret:{call.params['SecretId']}"), None)
    return [AuthRequest("secretsmanager:GetSecretValue", arn), *_kms_via(call, "secretsmanager", key)]


def _get_parameter(call: Call, lookups: Lookups) -> list[AuthRequest]:
    name = str(call.params["Name"])
    arn = _arn(call, "ssm", f"parameter/{name.lstrip('/')}")
    return [AuthRequest("ssm:GetParameter", arn), *_kms_via(call, "ssm", lookups.parameter_key(name))]


def _update_endpoint(call: Call, lookups: Lookups) -> list[AuthRequest]:
    """Both required resource types: the endpoint updated and the config it moves onto."""
    return [
        AuthRequest("sagemaker:UpdateEndpoint", arn, _resource_tags(lookups, arn))
        for arn in (
            _sm_arn(call, "endpoint", call.params["EndpointName"]),
            _sm_arn(call, "endpoint-config", call.params["EndpointConfigName"]),
        )
    ]


def _alarms(action: str) -> Rule:
    """Each alarm the call names (AlarmName, or the AlarmNames list)."""

    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        names = call.params.get("AlarmNames") or [call.params.get("AlarmName")]
        if not any(names):
            return [AuthRequest(f"cloudwatch:{action}", "*")]
        return [AuthRequest(f"cloudwatch:{action}", _arn(call, "cloudwatch", f"alarm:{n}")) for n in names]

    return rule


def _sqs_queue(action: str) -> Rule:
    def rule(call: Call, _lookups: Lookups) -> list[AuthRequest]:
        name = str(call.params["QueueUrl"]).rstrip("/").rsplit("/", 1)[-1]
        return [AuthRequest(f"sqs:{action}", _arn(call, "sqs", name))]

    return rule


RULES: dict[tuple[str, str], Rule] = {
    ("s3", "PutBucketPolicy"): _s3_bucket("s3:PutBucketPolicy"),
    ("s3", "DeleteBucketPolicy"): _s3_bucket("s3:DeleteBucketPolicy"),
    ("s3", "GetObject"): _s3_get,
    ("s3", "HeadObject"): _s3_get,
    ("s3", "PutObject"): _s3_put,
    ("s3", "CreateMultipartUpload"): _s3_put,
    ("s3", "UploadPart"): _s3_put,
    ("s3", "CompleteMultipartUpload"): _s3_put,
    ("s3", "CopyObject"): _s3_copy,
    ("s3", "UploadPartCopy"): _s3_copy,
    ("s3", "AbortMultipartUpload"): _s3_object("s3:AbortMultipartUpload"),
    ("s3", "ListParts"): _s3_object("s3:ListMultipartUploadParts"),
    ("s3", "ListObjectsV2"): _s3_list("s3:ListBucket"),
    ("s3", "ListObjects"): _s3_list("s3:ListBucket"),
    ("s3", "ListObjectVersions"): _s3_list("s3:ListBucketVersions"),
    ("s3", "ListMultipartUploads"): _s3_list("s3:ListBucketMultipartUploads", keyed=False),
    ("s3", "HeadBucket"): _s3_bucket("s3:ListBucket"),
    ("s3", "DeleteObject"): _s3_delete,
    ("s3", "DeleteObjects"): _s3_delete_many,
    ("dynamodb", "GetItem"): _table("GetItem"),
    ("dynamodb", "PutItem"): _table("PutItem"),
    ("dynamodb", "UpdateItem"): _table("UpdateItem"),
    ("dynamodb", "DeleteItem"): _table("DeleteItem"),
    ("dynamodb", "Scan"): _table("Scan"),
    ("dynamodb", "Query"): _table("Query"),
    ("sagemaker", "CreateModel"): _sm_create_passing_role("model", "ModelName"),
    ("sagemaker", "CreateEndpointConfig"): _sm_create_passing_role("endpoint-config", "EndpointConfigName"),
    ("sagemaker", "CreateInferenceComponent"): _sm_create_component,
    ("sagemaker", "DescribeInferenceComponent"): _sm_on(
        "DescribeInferenceComponent", "inference-component", "InferenceComponentName"
    ),
    ("sagemaker", "DeleteInferenceComponent"): _sm_on(
        "DeleteInferenceComponent", "inference-component", "InferenceComponentName", tagged=True
    ),
    ("sagemaker", "UpdateInferenceComponent"): _sm_on(
        "UpdateInferenceComponent", "inference-component", "InferenceComponentName", tagged=True
    ),
    ("sagemaker", "UpdateInferenceComponentRuntimeConfig"): _sm_on(
        "UpdateInferenceComponentRuntimeConfig", "inference-component", "InferenceComponentName", tagged=True
    ),
    ("sagemaker", "ListInferenceComponents"): _any_resource("sagemaker:ListInferenceComponents"),
    ("application-autoscaling", "RegisterScalableTarget"): _scaling("RegisterScalableTarget"),
    ("application-autoscaling", "DeregisterScalableTarget"): _scaling("DeregisterScalableTarget"),
    ("application-autoscaling", "PutScalingPolicy"): _scaling("PutScalingPolicy"),
    ("application-autoscaling", "DeleteScalingPolicy"): _scaling("DeleteScalingPolicy"),
    ("application-autoscaling", "DescribeScalingActivities"): _scaling("DescribeScalingActivities"),
    (
        "sagemaker",
        "CreateEndpoint",
    ): _sm_create(
        "endpoint", "EndpointName", lambda call: [("endpoint-config", str(call.params["EndpointConfigName"]))]
    ),
    ("sagemaker", "UpdateEndpoint"): _update_endpoint,
    ("sagemaker", "DescribeEndpoint"): _sm_on("DescribeEndpoint", "endpoint", "EndpointName"),
    ("sagemaker", "DescribeEndpointConfig"): _sm_on("DescribeEndpointConfig", "endpoint-config", "EndpointConfigName"),
    ("sagemaker", "DescribeModel"): _sm_on("DescribeModel", "model", "ModelName"),
    ("sagemaker", "DeleteEndpoint"): _sm_on("DeleteEndpoint", "endpoint", "EndpointName", tagged=True),
    ("sagemaker", "DeleteEndpointConfig"): _sm_on(
        "DeleteEndpointConfig", "endpoint-config", "EndpointConfigName", tagged=True
    ),
    ("sagemaker", "DeleteModel"): _sm_on("DeleteModel", "model", "ModelName", tagged=True),
    ("sagemaker", "ListEndpoints"): _any_resource("sagemaker:ListEndpoints"),
    ("sagemaker", "ListEndpointConfigs"): _any_resource("sagemaker:ListEndpointConfigs"),
    ("sagemaker", "ListModels"): _any_resource("sagemaker:ListModels"),
    ("sagemaker", "ListTags"): _sm_by_arn("ListTags"),
    ("sagemaker", "AddTags"): _sm_by_arn("AddTags"),
    ("sagemaker-runtime", "InvokeEndpoint"): _invoke,
    ("sagemaker-runtime", "InvokeEndpointWithResponseStream"): _invoke,
    ("logs", "DescribeLogStreams"): _log_group("DescribeLogStreams"),
    ("logs", "GetLogEvents"): _log_group("GetLogEvents", stream=True),
    ("logs", "FilterLogEvents"): _log_group("FilterLogEvents"),
    ("events", "PutEvents"): _put_events,
    ("cloudwatch", "PutMetricAlarm"): _alarms("PutMetricAlarm"),
    ("cloudwatch", "DescribeAlarms"): _alarms("DescribeAlarms"),
    ("cloudwatch", "DeleteAlarms"): _alarms("DeleteAlarms"),
    ("cloudwatch", "EnableAlarmActions"): _alarms("EnableAlarmActions"),
    ("stepfunctions", "StartExecution"): _states("StartExecution", "stateMachineArn"),
    ("stepfunctions", "DescribeExecution"): _states("DescribeExecution", "executionArn"),
    ("iam", "GetRole"): _get_role,
    ("service-quotas", "ListServiceQuotas"): _any_resource("servicequotas:ListServiceQuotas"),
    ("service-quotas", "ListAWSDefaultServiceQuotas"): _any_resource("servicequotas:ListAWSDefaultServiceQuotas"),
    ("secretsmanager", "GetSecretValue"): _get_secret,
    ("ssm", "GetParameter"): _get_parameter,
    ("sqs", "SendMessage"): _sqs_queue("SendMessage"),
    ("sts", "GetCallerIdentity"): lambda _call, _lookups: [],  # needs no permission
}


def requests_for(call: Call, lookups: Lookups) -> list[AuthRequest]:
    rule = RULES.get((call.service, call.operation))
    if rule is None:
        raise UnmappedCall(f"the emulator cannot authorize {call.service}:{call.operation}: add it to iam_calls.RULES")
    requests = rule(call, lookups)
    try:
        check(call.service, call.operation, call.params, requests)
    except NotInReference as e:
        raise UnmappedCall(f"{call.service}:{call.operation}: {e}") from e
    return requests
