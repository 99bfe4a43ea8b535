"""Service Quotas in the emulator (moto lists no SageMaker quotas): the account's "ml.X for endpoint
usage" quotas from a local table, listed as the service lists them (applied values, AWS defaults),
and the ResourceLimitExceeded that CreateEndpoint -- and UpdateEndpoint, whose new fleet runs beside
the serving one -- answer past them."""

# mypy: disable-error-code="method-assign,assignment,unused-ignore,attr-defined"
from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from typing import Any

_endpoint_quotas: dict[str, float] = {}
_default_endpoint_quotas: dict[str, float] = {}


def set_endpoint_quotas(quotas: dict[str, float]) -> None:
    """The local account's 'ml.X for endpoint usage' quotas (instance type -> instances), applied."""
    _endpoint_quotas.clear()
    _endpoint_quotas.update(quotas)
    _default_endpoint_quotas.clear()


def set_endpoint_quota(instance_type: str, value: float, applied: bool = True) -> None:
    """An applied quota value (listed by ListServiceQuotas), or, with APPLIED=False, only the AWS
    default (listed by ListAWSDefaultServiceQuotas alone)."""
    if applied:
        _endpoint_quotas[instance_type] = value
    else:
        _endpoint_quotas.pop(instance_type, None)
        _default_endpoint_quotas[instance_type] = value


def local_quota_code(instance_type: str) -> str:
    return "L-" + hashlib.sha256(instance_type.encode()).hexdigest()[:8].upper()


def quota_problem(backend: Any, config_name: str, in_flight: list[str]) -> str | None:
    """SageMaker's ResourceLimitExceeded message when CONFIG's instances would pass the local quota
    (endpoints count in the states the pre-check counts them in)."""
    from modeldrop.aws.sagemaker.endpoint_quota import COUNTED_STATUSES

    config = backend.endpoint_configs.get(config_name)
    if config is None:
        return None
    for variant in config.production_variants:
        instance_type = variant.get("InstanceType")
        limit = _endpoint_quotas.get(instance_type, _default_endpoint_quotas.get(instance_type))
        if limit is None:
            continue
        delta = int(variant.get("InitialInstanceCount") or 1)
        used = 0
        running = [e.endpoint_config_name for e in backend.endpoints.values() if e.endpoint_status in COUNTED_STATUSES]
        # An update's new fleet (IN_FLIGHT: its config) runs beside its endpoint's serving one: both count.
        running += in_flight
        for running_config in running:
            other = backend.endpoint_configs.get(running_config)
            for v in other.production_variants if other else []:
                if v.get("InstanceType") == instance_type:
                    used += int(v.get("InitialInstanceCount") or 1)
        if used + delta > limit:
            return (
                f"The account-level service limit '{instance_type} for endpoint usage' is {limit:g} Instances, with "
                f"current utilization of {used} Instances and a request delta of {delta} Instances. Please use AWS "
                "Service Quotas to request an increase for this quota."
            )
    return None


def check(backend: Any, config_name: str, in_flight: list[str]) -> None:
    """UpdateEndpoint's only modeled error: the new fleet past the account's endpoint quota."""
    over = quota_problem(backend, config_name, in_flight)
    if over:
        raise limit_error()(over)


@functools.cache
def limit_error() -> type[Exception]:
    from moto.sagemaker.exceptions import SagemakerClientError

    class ResourceLimitExceeded(SagemakerClientError):
        code = "ResourceLimitExceeded"

    return ResourceLimitExceeded


def install() -> None:
    from moto.servicequotas.responses import ServiceQuotasResponse

    def listing(values: dict[str, float]) -> Callable[[Any], str]:
        def respond(self: Any) -> str:
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
                for instance_type, value in sorted(values.items())
            ]
            return json.dumps({"Quotas": quotas})

        return respond

    # As Service Quotas answers: ListServiceQuotas lists only the quotas with an applied value;
    # ListAWSDefaultServiceQuotas lists the defaults, which the others are at.
    ServiceQuotasResponse.list_service_quotas = listing(_endpoint_quotas)
    ServiceQuotasResponse.list_aws_default_service_quotas = listing(_default_endpoint_quotas)
