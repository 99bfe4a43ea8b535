"""Every patch modeldrop needs on moto 5.2.5 to run the real ASL and handlers in-process.

One place, used by the tests and by `modeldrop run-local`:
- JSONata: moto's evaluator is a JVM bridge; plug in the pure-Python jsonata-python package.
- Lambda: moto runs functions in Docker; dispatch them to the handlers in this process instead,
  returning (payload, errored, logs) with errored payloads shaped like the Lambda runtime's.
- Time: Wait states advance modeldrop.contracts.clock instead of sleeping; Retry backoff does not sleep.
- SageMaker, as strict as the API reference: instance types from botocore's own service model
  (moto's list has no GPU types), no second model / endpoint config / endpoint of one name,
  ModelDataUrl only as a .tar.gz and an uncompressed model only as an S3 prefix; the local
  hosting runs a server per endpoint and decides its status (and may throttle a create);
  CreateEndpoint past the account's "ml.X for endpoint usage" quota is ResourceLimitExceeded, and a
  deleted endpoint is Deleting (listed, described, its name taken) until it is described once more.
- Step Functions, as strict as the service: no `$eval` in a JSONata definition (a function Step
  Functions does not provide), and a Wait state's JSONata Seconds must be a whole number.
- EventBridge: moto does not deliver rule targets that are Lambda functions; deliver them.
- Step Functions emits no "Execution Status Change" events in moto; put them on the default bus --
  for a stopped execution at stop time, while its running Lambda task goes on, as AWS does.
- Service Quotas: moto lists no SageMaker quotas; serve "ml.X for endpoint usage" from a local table.
- S3 (copy checksums and preconditions, bucket policies) and inference components: s3_shims, sagemaker_components.
"""

# mypy: disable-error-code="method-assign,assignment,unused-ignore,attr-defined,typeddict-item"
from __future__ import annotations

import json
import logging
import threading
import traceback
import warnings
from collections.abc import Callable
from typing import Any, Protocol, cast

from modeldrop.contracts import clock
from modeldrop.local.emulator import service_quotas
from modeldrop.local.emulator import stepfunctions as stepfunctions_shims
from modeldrop.local.emulator.autoscaling import driving as autoscaling_driving
from modeldrop.local.emulator.autoscaling import scaling as autoscaling
from modeldrop.local.emulator.iam import enforcement as iam_enforcement
from modeldrop.local.emulator.iam import simulator as iam_simulator
from modeldrop.local.emulator.s3 import file_backed as file_backed_s3
from modeldrop.local.emulator.s3 import shims as s3_shims
from modeldrop.local.emulator.sagemaker import component_scaling, endpoint_updates
from modeldrop.local.emulator.sagemaker import components as sagemaker_components

# Re-exported: run-local and the tests set the emulated account's quotas through the patches' module.

Dispatcher = Callable[[str, dict[str, Any]], tuple[str, bool, str]]

_installed = False
_lock = threading.Lock()
_dispatcher: Dispatcher | None = None
_async_invoker: Callable[[str, dict[str, Any]], None] | None = None
_hosting: Hosting | None = None


class Hosting(Protocol):
    """What decides a created endpoint's fate (modeldrop.local.emulator.sagemaker.hosting.LocalHosting)."""

    def on_create(self, name: str, backend: Any) -> None: ...

    def status(self, name: str) -> tuple[str, str | None]: ...

    def on_delete(self, name: str) -> None: ...

    def throttle_create(self, name: str, model_attempts: int) -> bool: ...

    def throttle_delete(self, name: str) -> bool: ...

    def refuse_delete(self, name: str) -> bool: ...

    def tick(self, backend: Any) -> None: ...


def set_dispatcher(dispatcher: Dispatcher | None) -> None:
    global _dispatcher
    _dispatcher = dispatcher


def dispatch(function_name: str, event: dict[str, Any]) -> tuple[str, bool, str]:
    """Run a function through whatever dispatcher is installed (the stack's, or a test's)."""
    if _dispatcher is None:
        return json.dumps({"errorType": "NoDispatcher", "errorMessage": "no in-process dispatcher"}), True, ""
    return _dispatcher(function_name, event)


def set_async_invoker(invoker: Callable[[str, dict[str, Any]], None] | None) -> None:
    """How an event source's asynchronous invocation of a function is run (the emulated stack's)."""
    global _async_invoker
    _async_invoker = invoker


def s3_event_as_sent(event: Any) -> Any:
    """An S3 EventBridge event with its object key URL-encoded, as S3 sends it (moto sends it raw):
    `runs/exp 1+b/model.tar.gz` arrives as `runs/exp+1%2Bb/model.tar.gz`."""
    from urllib.parse import quote_plus

    if not isinstance(event, dict) or event.get("source") != "aws.s3":
        return event
    sent = json.loads(json.dumps(event, default=str))
    obj = (sent.get("detail") or {}).get("object") or {}
    if "key" in obj:
        obj["key"] = quote_plus(str(obj["key"]), safe="/")
    return sent


def set_hosting(hosting: Hosting | None) -> None:
    global _hosting
    _hosting = hosting
    sagemaker_components.set_component_host(getattr(hosting, "components", None))
    autoscaling_driving.reset()
    refusing = {"eu-west-3"}
    if hosting is not None and "zero-refused" in getattr(hosting, "faults", ()):
        refusing.add(str(getattr(hosting, "region", "")))
    component_scaling.zero_refused_regions = refusing


def install() -> None:
    """Apply the patches once per process (they only route through hooks set per run)."""
    global _installed
    with _lock:
        if _installed:
            return
        _patch_jsonata()
        _patch_lambda()
        _patch_timing()
        _patch_sagemaker()
        _patch_events()
        service_quotas.install()
        stepfunctions_shims.install()
        iam_simulator.install()
        s3_shims.install()
        sagemaker_components.install()
        iam_enforcement.register_tag_table("inference-component", sagemaker_components.components_of)
        endpoint_updates.install(
            lambda: _hosting, lambda backend, config: service_quotas.check(backend, config, _in_flight())
        )
        component_scaling.install()
        autoscaling.install()
        clock.use_virtual_sleep()
        file_backed_s3.install()
        # A ThrottlingException is real SageMaker behaviour even though moto's error shapes lack it.
        warnings.filterwarnings("ignore", message=".*does not match an error shape", category=UserWarning)
        for name in ("moto.stepfunctions", "moto.stepfunctions.parser"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
        _installed = True


def _patch_jsonata() -> None:
    import jsonata
    from moto.stepfunctions.parser.asl.jsonata import jsonata as moto_jsonata

    def evaluate(expression: str) -> Any:
        try:
            return jsonata.Jsonata(expression).evaluate(None)
        except Exception as exc:
            raise moto_jsonata.JSONataException("UNKNOWN", str(exc)) from None

    moto_jsonata._eval_jsonata = evaluate


def _patch_lambda() -> None:
    from moto.awslambda.models import LambdaFunction

    def invoke_in_process(self: Any, event: Any = None) -> tuple[str, bool, str]:
        payload = json.loads(event) if isinstance(event, str | bytes) else (event or {})
        if _dispatcher is None:
            return json.dumps({"errorType": "NoDispatcher", "errorMessage": "no in-process dispatcher"}), True, ""
        return _dispatcher(self.function_name, payload)

    LambdaFunction._invoke_lambda = invoke_in_process


def _patch_timing() -> None:
    import types

    from moto.stepfunctions.parser.asl.component.common.retry import retrier_decl
    from moto.stepfunctions.parser.asl.component.state.wait.wait_function import wait_function

    def wait_virtually(self: Any, env: Any, wait_seconds: int) -> None:
        clock.advance(wait_seconds)

    wait_function.WaitFunction._wait_interval = wait_virtually
    # Retry backoff: keep the interpreter's arithmetic, skip the sleep.
    retrier_decl.time = types.SimpleNamespace(sleep=lambda _s: None)  # type: ignore[attr-defined]
    # The SDK's own retry backoff too: every AWS call here goes to the in-process emulator.
    import botocore.endpoint

    botocore.endpoint.time = types.SimpleNamespace(sleep=lambda _s: None)  # type: ignore[attr-defined]


def _patch_sagemaker() -> None:
    from moto.sagemaker import models as sm
    from moto.sagemaker.exceptions import SagemakerClientError, ValidationError
    from moto.sagemaker.utils import arn_formatter

    from modeldrop.contracts.instance_types import hosting_instance_types

    class Throttled(SagemakerClientError):
        code = "ThrottlingException"

    ResourceLimitExceeded = service_quotas.limit_error()

    def validate_instance_type(self: Any, instance_type: str) -> None:
        if instance_type not in hosting_instance_types():
            raise ValidationError(
                message=f"1 validation error detected: Value '{instance_type}' at "
                "'productionVariants.1.member.instanceType' failed to satisfy constraint: Member must satisfy "
                "enum value set: [ProductionVariantInstanceType]"
            )

    sm.FakeEndpointConfig.validate_instance_type = validate_instance_type

    original_create_model = sm.SageMakerModelBackend.create_model
    original_create_config = sm.SageMakerModelBackend.create_endpoint_config
    original_create = sm.SageMakerModelBackend.create_endpoint
    original_describe = sm.SageMakerModelBackend.describe_endpoint
    original_delete = sm.SageMakerModelBackend.delete_endpoint
    original_list = sm.SageMakerModelBackend.list_endpoints

    def refuse_existing(self: Any, kind: str, resource: str, name: str) -> None:
        # moto silently overwrites; SageMaker refuses.
        arn = arn_formatter(resource, name, self.account_id, self.region_name)
        raise ValidationError(message=f'Cannot create already existing {kind} "{arn}".')

    model_attempts: dict[str, int] = {}

    def create_model(self: Any, model_name: str, **kw: Any) -> Any:
        model_attempts[model_name] = model_attempts.get(model_name, 0) + 1
        if model_name in self._models:
            refuse_existing(self, "model", "model", model_name)
        for container in [kw.get("primary_container") or {}, *(kw.get("containers") or [])]:
            problem = model_data_problem(container)
            if problem:
                raise ValidationError(message=problem)
        return original_create_model(self, model_name, **kw)

    def create_endpoint_config(self: Any, endpoint_config_name: str, *a: Any, **kw: Any) -> Any:
        if endpoint_config_name in self.endpoint_configs:
            refuse_existing(self, "endpoint configuration", "endpoint-config", endpoint_config_name)
        variants = kw.get("production_variants") or (a[0] if a else [])
        for variant in variants or []:
            problem = ami_problem(variant.get("InferenceAmiVersion"))
            if problem:
                raise ValidationError(message=problem)
        return original_create_config(self, endpoint_config_name, *a, **kw)

    def create_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str, tags: Any) -> Any:
        if _hosting is not None:
            _hosting.tick(self)
        if endpoint_name in self.endpoints:
            refuse_existing(self, "endpoint", "endpoint", endpoint_name)
        if _hosting is not None and _hosting.throttle_create(endpoint_name, model_attempts.get(endpoint_name, 0)):
            raise Throttled("Rate exceeded")
        over = service_quotas.quota_problem(self, endpoint_config_name, _in_flight())
        if over:
            raise ResourceLimitExceeded(over)
        endpoint = original_create(self, endpoint_name, endpoint_config_name, tags)
        if _hosting is not None:
            endpoint.endpoint_status = "Creating"
            _hosting.on_create(endpoint_name, self)
        return endpoint

    def describe_endpoint(self: Any, endpoint_name: str) -> Any:
        if _hosting is not None:
            _hosting.tick(self)
        if endpoint_name in (deleting := _deleting(self)):
            deleting[endpoint_name] += 1
            if deleting[endpoint_name] > 1:  # seen Deleting once: now it is gone
                deleting.pop(endpoint_name)
                original_delete(self, endpoint_name)
            return original_describe(self, endpoint_name)
        endpoint = self.endpoints.get(endpoint_name)
        if endpoint is not None and _hosting is not None:
            endpoint_updates.refresh(_hosting, self, endpoint)
        return original_describe(self, endpoint_name)

    def delete_endpoint(self: Any, endpoint_name: str) -> None:
        if _hosting is not None and _hosting.throttle_delete(endpoint_name):
            raise Throttled("Rate exceeded")
        if _hosting is not None and _hosting.refuse_delete(endpoint_name):
            arn = arn_formatter("endpoint", endpoint_name, self.account_id, self.region_name)
            raise ValidationError(message=f'Cannot delete endpoint "{arn}" while it is Creating.')
        endpoint = self.endpoints.get(endpoint_name)
        if endpoint is None or _hosting is None:
            original_delete(self, endpoint_name)  # moto's own not-found error, or no hosting to emulate
            return
        deleting = _deleting(self)
        if endpoint_name not in deleting:
            deleting[endpoint_name] = 0
            endpoint.endpoint_status = "Deleting"
            endpoint.failure_reason = None
            endpoint_updates.forget(_hosting, endpoint_name)
            _hosting.on_delete(endpoint_name)

    def list_endpoints(self: Any, *a: Any, **kw: Any) -> Any:
        if _hosting is not None:
            _hosting.tick(self)
        return original_list(self, *a, **kw)

    sm.SageMakerModelBackend.create_model = create_model
    sm.SageMakerModelBackend.create_endpoint_config = create_endpoint_config
    sm.SageMakerModelBackend.create_endpoint = create_endpoint
    sm.SageMakerModelBackend.describe_endpoint = describe_endpoint
    sm.SageMakerModelBackend.delete_endpoint = delete_endpoint
    sm.SageMakerModelBackend.list_endpoints = list_endpoints


def _deleting(backend: Any) -> dict[str, int]:
    """Endpoints BACKEND shows Deleting, per backend: a name reused by the next emulated account stays."""
    return cast("dict[str, int]", backend.__dict__.setdefault("_modeldrop_deleting", {}))


def _in_flight() -> list[str]:
    """The configs of the new fleets updates are starting beside their endpoints' serving ones."""
    return [u.config for u in getattr(_hosting, "updates", {}).values()]


def ami_problem(ami: str | None) -> str | None:
    """What CreateEndpointConfig refuses in an InferenceAmiVersion: a value not in botocore's enum."""
    if ami is None:
        return None
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    allowed = model.shape_for("ProductionVariantInferenceAmiVersion").enum
    if ami not in allowed:
        return (
            f"1 validation error detected: Value '{ami}' at 'productionVariants.1.member.inferenceAmiVersion' failed "
            f"to satisfy constraint: Member must satisfy enum value set: [{', '.join(allowed)}]"
        )
    return None


def model_data_problem(container: dict[str, Any]) -> str | None:
    """What CreateModel refuses in a container's model data (the SageMaker API reference), or None."""
    url = container.get("ModelDataUrl")
    if url is not None and not (str(url).startswith("s3://") and str(url).endswith(".tar.gz")):
        return f"ModelDataUrl {url!r} must point to a single gzip-compressed tar archive (.tar.gz suffix)"
    source = (container.get("ModelDataSource") or {}).get("S3DataSource")
    if source is not None:
        if url is not None:
            return "specify either ModelDataUrl or ModelDataSource, not both"
        uri, kind, compression = source.get("S3Uri", ""), source.get("S3DataType"), source.get("CompressionType")
        if compression == "Gzip" and (kind != "S3Object" or not uri.endswith(".tar.gz")):
            return "CompressionType Gzip needs S3DataType S3Object and an S3Uri ending in .tar.gz"
        if compression == "None" and kind == "S3Prefix" and not uri.endswith("/"):
            return f"an S3Prefix S3Uri for uncompressed model data must end with a slash: {uri!r}"
        if compression not in ("Gzip", "None"):
            return f"CompressionType must be Gzip or None, not {compression!r}"
    return None


def _patch_events() -> None:
    from moto.events import models as ev
    from moto.utilities.arns import parse_arn

    original = ev.Rule.send_to_targets

    def send_to_targets(self: Any, original_event: Any, transform_input: bool = True) -> None:
        original_event = s3_event_as_sent(original_event)
        if self.event_pattern.matches_event(original_event):
            for target in self.targets:
                arn = parse_arn(target["Arn"])
                if arn.service == "lambda" and _async_invoker is not None:
                    # EventBridge invokes a function asynchronously: Lambda retries a failed run and
                    # hands the event to the function's on-failure destination.
                    _async_invoker(arn.resource_id.split(":")[0], json.loads(json.dumps(original_event, default=str)))
        original(self, original_event, transform_input)

    ev.Rule.send_to_targets = send_to_targets


def error_payload(exc: BaseException) -> str:
    """What the Lambda runtime returns for an unhandled exception."""
    return json.dumps(
        {
            "errorType": getattr(exc, "error_type", type(exc).__name__),
            "errorMessage": str(exc),
            "stackTrace": traceback.format_exception(exc)[-3:],
        }
    )
