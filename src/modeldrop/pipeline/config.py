"""Handler configuration, read from the environment when a handler runs (never at import)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from modeldrop.aws import clients
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts.models import INSTANCE_TYPE_PATTERN
from modeldrop.contracts.step_payloads import Engine
from modeldrop.pipeline.limits import StackLimits


class ConfigError(RuntimeError):
    """The function is deployed with a missing or invalid environment variable."""


class _EnvSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Self:
        source = dict(os.environ if env is None else env)
        values: dict[str, Any] = {name: source[name.upper()] for name in cls.model_fields if name.upper() in source}
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ConfigError(f"{cls.__name__}: {str(first['loc'][0]).upper()}: {first['msg']}") from None


class _WithTable(_EnvSettings):
    deployments_table: str

    def registry(self) -> Registry:
        """The deployments table, built on a handler's first run and kept for the container's life."""
        return Registry(clients.table(self.deployments_table))


class RegistrySettings(_WithTable):
    event_bus_name: str
    aws_region: str


class DefaultsSettings(_EnvSettings):
    default_engine: Engine = "vllm"
    default_instance_type: str = Field("ml.g6.2xlarge", pattern=INSTANCE_TYPE_PATTERN)
    default_ttl_hours: float = Field(4.0, gt=0)
    deploy_deadline_seconds: int = Field(1800, ge=60)
    resource_prefix: str = Field("modeldrop", pattern=r"^[a-z][a-z0-9-]{0,19}$")
    secrets_prefix: str = Field("modeldrop/", min_length=1)
    # The only bucket the stack's functions may read: artifacts and eval sets must be in it.
    artifact_bucket: str | None = None
    aws_region: str = "us-east-1"  # every Lambda has AWS_REGION; it prices the instance types
    # The stack's limits (template parameters of the same names), see pipeline.limits.
    allowed_instance_types: str = "ml.g5.*,ml.g6.*,ml.g6e.*"
    max_instance_count: int = Field(2, ge=1)
    max_hourly_price: float = Field(20.0, gt=0)
    max_ttl_hours: float = Field(72.0, gt=0)
    allow_force_plan: bool = False
    allow_trust_remote_code: bool = False
    max_eval_tolerance: int = Field(1, ge=0)
    max_gate_regressions: int = Field(0, ge=0)
    max_gate_latency_slack: float = Field(5.0, ge=0)

    def limits(self) -> StackLimits:
        return StackLimits.model_validate(self.model_dump(include=set(StackLimits.model_fields)))


class NormalizeSettings(DefaultsSettings):
    deployments_table: str | None = None  # where channels are read (an adapter channel names its base)

    def channel_base(self) -> Callable[[str], str | None] | None:
        """How a request's adapter channel is resolved to its base deployment (None: no table)."""
        if not self.deployments_table:
            return None
        from modeldrop.aws.dynamodb.channel_store import ChannelStore

        return ChannelStore(clients.table(self.deployments_table)).adapter_base


class DeploySettings(_WithTable):
    sagemaker_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    stack_tag: str
    aws_region: str


class RecordSettings(_WithTable):
    aws_region: str


class RegisterSettings(RecordSettings):
    sagemaker_role_arn: str = Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:role/.+$")
    # The largest archive ValidateCheckpoint reads within its 15 minutes (template parameter MaxArchiveGB).
    max_archive_gb: float = Field(20.0, gt=0)
    # Everything live together (template parameters MaxStackHourlyPrice, MaxStackInstances).
    max_stack_hourly_price: float = Field(60.0, gt=0)
    max_stack_instances: int = Field(8, ge=1)


class EvalSettings(RecordSettings):
    pass


class PromoteSettings(_WithTable):
    stack_tag: str
    resource_prefix: str = Field("modeldrop", pattern=r"^[a-z][a-z0-9-]{0,19}$")
    # How many channels the stack may hold (template parameter MaxChannels): a marker cannot add more.
    max_channels: int = Field(20, ge=1)
    # Regions the stack's owner found refusing scale to zero (NoScaleToZeroRegions), comma-separated.
    no_scale_to_zero_regions: str = ""

    def refusing_regions(self) -> tuple[str, ...]:
        return tuple(r.strip() for r in self.no_scale_to_zero_regions.split(",") if r.strip())


class StarterSettings(_WithTable):
    state_machine_arn: str
    artifact_bucket: str
    event_bus_name: str


class ReaperSettings(_WithTable):
    event_bus_name: str
    stack_tag: str
    resource_prefix: str
    reaper_period_minutes: int = Field(15, ge=1, le=60)
    default_ttl_hours: float = Field(4.0, gt=0)
    max_ttl_hours: float = Field(72.0, gt=0)
    artifact_bucket: str | None = None
