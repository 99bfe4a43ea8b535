"""Every AWS client the pipeline uses, typed, built once per Lambda container, with one retry policy.

A client is made on first use (never at import: the local run and the tests start their emulator
first) and kept for the container's life, so a poll loop does not rebuild its client and the
deployments table on every round. `reset()` forgets them (tests, after the emulator is replaced).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any, TypeVar

import boto3
from botocore.config import Config

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_dynamodb.service_resource import Table
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient
    from mypy_boto3_ssm import SSMClient
    from mypy_boto3_stepfunctions import SFNClient

# Standard mode: retries throttling and transient errors with backoff, the same for every service.
RETRIES = Config(retries={"mode": "standard", "max_attempts": 8})
# The smoke eval counts and retries throttling itself; a streamed answer may take past the 60 s default.
RUNTIME = Config(retries={"mode": "standard", "total_max_attempts": 1}, read_timeout=70)

_Factory = TypeVar("_Factory", bound=Callable[..., Any])
_KEPT: list[Any] = []


def _kept(factory: _Factory) -> _Factory:
    """Build on first use, keep for the container's life, and let `reset()` forget it."""
    cached = cache(factory)
    _KEPT.append(cached)
    return cached  # type: ignore[return-value]


@_kept
def sagemaker() -> SageMakerClient:
    return boto3.client("sagemaker", config=RETRIES)


@_kept
def sagemaker_runtime() -> SageMakerRuntimeClient:
    return boto3.client("sagemaker-runtime", config=RUNTIME)


@_kept
def s3() -> S3Client:
    return boto3.client("s3", config=RETRIES)


@_kept
def events() -> EventBridgeClient:
    return boto3.client("events", config=RETRIES)


@_kept
def cloudwatch() -> CloudWatchClient:
    return boto3.client("cloudwatch", config=RETRIES)


@_kept
def application_autoscaling() -> ApplicationAutoScalingClient:
    return boto3.client("application-autoscaling", config=RETRIES)


@_kept
def logs() -> CloudWatchLogsClient:
    return boto3.client("logs", config=RETRIES)


@_kept
def iam() -> IAMClient:
    return boto3.client("iam", config=RETRIES)


@_kept
def service_quotas() -> ServiceQuotasClient:
    return boto3.client("service-quotas", config=RETRIES)


@_kept
def secretsmanager() -> SecretsManagerClient:
    return boto3.client("secretsmanager", config=RETRIES)


@_kept
def ssm() -> SSMClient:
    return boto3.client("ssm", config=RETRIES)


@_kept
def stepfunctions() -> SFNClient:
    return boto3.client("stepfunctions", config=RETRIES)


@_kept
def cloudformation() -> CloudFormationClient:
    return boto3.client("cloudformation", config=RETRIES)


@_kept
def table(name: str) -> Table:
    return boto3.resource("dynamodb", config=RETRIES).Table(name)


def reset() -> None:
    for factory in _KEPT:
        factory.cache_clear()
