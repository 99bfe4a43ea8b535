"""Every patch modeldrop needs on moto 5.2.5 to run the real ASL and handlers in-process.

One place, used by the tests and by `modeldrop run-local`:
- JSONata: moto's evaluator is a JVM bridge; plug in the pure-Python jsonata-python package.
- Lambda: moto runs functions in Docker; dispatch them to the handlers in this process instead,
  returning (payload, errored, logs) with errored payloads shaped like the Lambda runtime's.
- Time: Wait states advance modeldrop.clock instead of sleeping; Retry backoff does not sleep.
- SageMaker: accept GPU instance types; let the local hosting run a server per endpoint and decide
  its status; refuse a duplicate endpoint name as SageMaker does.
- EventBridge: moto does not deliver rule targets that are Lambda functions; deliver them.
- Service Quotas: moto lists no SageMaker quotas; serve "ml.X for endpoint usage" from a local table.
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,unused-ignore,attr-defined"
from __future__ import annotations

import hashlib
import json
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol

from modeldrop import clock

Dispatcher = Callable[[str, dict[str, Any]], tuple[str, bool, str]]

_installed = False
_lock = threading.Lock()
_dispatcher: Dispatcher | None = None
_hosting: Hosting | None = None
_endpoint_quotas: dict[str, float] = {}


class Hosting(Protocol):
    """What decides a created endpoint's fate (modeldrop.local.hosting.LocalHosting)."""

    def on_create(self, name: str, backend: Any) -> None: ...

    def status(self, name: str) -> tuple[str, str | None]: ...

    def on_delete(self, name: str) -> None: ...


def set_dispatcher(dispatcher: Dispatcher | None) -> None:
    global _dispatcher
    _dispatcher = dispatcher


def set_endpoint_quotas(quotas: dict[str, float]) -> None:
    """The local account's 'ml.X for endpoint usage' quotas (instance type -> instances)."""
    _endpoint_quotas.clear()
    _endpoint_quotas.update(quotas)


def local_quota_code(instance_type: str) -> str:
    return "L-" + hashlib.sha256(instance_type.encode()).hexdigest()[:8].upper()


def set_hosting(hosting: Hosting | None) -> None:
    global _hosting
    _hosting = hosting


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
        _patch_service_quotas()
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


def _patch_sagemaker() -> None:
    from moto.sagemaker import models as sm

    sm.FakeEndpointConfig.validate_instance_type = lambda self, instance_type: None

    original_create = sm.SageMakerModelBackend.create_endpoint
    original_describe = sm.SageMakerModelBackend.describe_endpoint

    def create_endpoint(self: Any, endpoint_name: str, endpoint_config_name: str, tags: Any) -> Any:
        if endpoint_name in self.endpoints:
            # moto silently overwrites; SageMaker refuses.
            from moto.sagemaker.exceptions import ValidationError

            raise ValidationError(message=f'Cannot create already existing endpoint "{endpoint_name}".')
        endpoint = original_create(self, endpoint_name, endpoint_config_name, tags)
        if _hosting is not None:
            endpoint.endpoint_status = "Creating"
            _hosting.on_create(endpoint_name, self)
        return endpoint

    def describe_endpoint(self: Any, endpoint_name: str) -> Any:
        endpoint = self.endpoints.get(endpoint_name)
        if endpoint is not None and _hosting is not None:
            status, reason = _hosting.status(endpoint_name)
            endpoint.endpoint_status = status
            endpoint.failure_reason = reason
        return original_describe(self, endpoint_name)

    original_delete = sm.SageMakerModelBackend.delete_endpoint

    def delete_endpoint(self: Any, endpoint_name: str) -> None:
        original_delete(self, endpoint_name)
        if _hosting is not None:
            _hosting.on_delete(endpoint_name)

    sm.SageMakerModelBackend.create_endpoint = create_endpoint
    sm.SageMakerModelBackend.describe_endpoint = describe_endpoint
    sm.SageMakerModelBackend.delete_endpoint = delete_endpoint


def _patch_events() -> None:
    from moto.events import models as ev
    from moto.utilities.arns import parse_arn

    original = ev.Rule.send_to_targets

    def send_to_targets(self: Any, original_event: Any, transform_input: bool = True) -> None:
        if self.event_pattern.matches_event(original_event):
            for target in self.targets:
                arn = parse_arn(target["Arn"])
                if arn.service == "lambda" and _dispatcher is not None:
                    _dispatcher(arn.resource_id.split(":")[0], json.loads(json.dumps(original_event, default=str)))
        original(self, original_event, transform_input)

    ev.Rule.send_to_targets = send_to_targets


def _patch_service_quotas() -> None:
    from moto.servicequotas.responses import ServiceQuotasResponse

    def list_service_quotas(self: Any) -> str:
        params = json.loads(self.body)
        if params.get("ServiceCode") != "sagemaker":
            return json.dumps({"Quotas": []})
        quotas = [
            {
                "ServiceCode": "sagemaker",
                "ServiceName": "Amazon SageMaker",
                "QuotaCode": local_quota_code(instance_type),
                "QuotaName": f"{instance_type} for endpoint usage",
                "Value": value,
                "Unit": "None",
                "Adjustable": True,
            }
            for instance_type, value in sorted(_endpoint_quotas.items())
        ]
        return json.dumps({"Quotas": quotas})

    ServiceQuotasResponse.list_service_quotas = list_service_quotas


def error_payload(exc: BaseException) -> str:
    """What the Lambda runtime returns for an unhandled exception."""
    return json.dumps(
        {
            "errorType": type(exc).__name__,
            "errorMessage": str(exc),
            "stackTrace": traceback.format_exception(exc)[-3:],
        }
    )
