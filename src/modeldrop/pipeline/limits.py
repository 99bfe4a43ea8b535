"""The stack's limits: what no request can raise, whoever sends it (a direct start, a pipeline, or
anyone able to write a modeldrop.json marker into the bucket).

They are stack parameters (template.yaml), read by NormalizeRequest from its environment, and
checked before anything is registered, copied or created. A request asking for more is refused
with LimitExceeded, naming the parameter that would have to change.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from modeldrop.contracts.errors import LimitExceeded
from modeldrop.contracts.models import DeploymentRequest
from modeldrop.serving.instance_choice import type_allowed
from modeldrop.serving.memory_plan import hourly_price


class StackLimits(BaseModel):
    model_config = ConfigDict(frozen=True)

    # Instance type patterns (IAM-style `*`); the GPU families the stack's owner expects to pay for.
    allowed_instance_types: tuple[str, ...] = ("ml.g5.*", "ml.g6.*", "ml.g6e.*")
    max_instance_count: int = Field(2, ge=1)
    # USD per hour for the whole deployment: every instance of it, at the catalog's price.
    max_hourly_price: float = Field(20.0, gt=0, allow_inf_nan=False)
    max_ttl_hours: float = Field(72.0, gt=0, allow_inf_nan=False)
    allow_force_plan: bool = False
    allow_trust_remote_code: bool = False
    # The most truncated answers, errors or failed checks a request may tolerate in its smoke eval.
    max_eval_tolerance: int = Field(1, ge=0)
    # The most regressed cases a channel's gate may let through, whatever a request (or marker) asks.
    max_gate_regressions: int = Field(0, ge=0)
    # The most seconds of latency difference the gate may call noise: past it, slower is a regression.
    max_gate_latency_slack: float = Field(5.0, ge=0, allow_inf_nan=False)

    @field_validator("allowed_instance_types", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    def allows_type(self, instance_type: str) -> bool:
        return type_allowed(self.allowed_instance_types, instance_type)

    def price_ceiling(self, instance_count: int, requested: float | None) -> float:
        """The most one instance may cost per hour: the request's own ceiling, and the stack's share."""
        stack_share = self.max_hourly_price / instance_count
        return stack_share if requested is None else min(requested, stack_share)

    def check(self, request: DeploymentRequest, types: list[str], region: str, ttl_hours: float) -> None:
        """Refuse (LimitExceeded) what this stack does not allow. TYPES are the instance types the
        request names, the first one first ("auto" adds only allowed ones later); REGION prices them."""
        problems = self._problems(request, types, region, ttl_hours)
        if problems:
            name, detail = problems[0]
            raise LimitExceeded(
                f"{detail} (the stack's {name})" + (f"; also {len(problems) - 1} more" if len(problems) > 1 else ""),
                f"ask within the limit, or have the stack's owner raise {name} "
                f"(sam deploy --parameter-overrides {name}=...)",
            )

    def capacity_problems(self, types: list[str], count: int, region: str) -> list[tuple[str, str]]:
        """(parameter, what passes it) for COUNT instances of each of TYPES in REGION: the allowed types,
        the hourly price ceiling (an unpriced type cannot be bounded) and the instance count."""
        problems: list[tuple[str, str]] = []
        for instance_type in types:
            if not self.allows_type(instance_type):
                allowed = ", ".join(self.allowed_instance_types)
                problems.append(("AllowedInstanceTypes", f"{instance_type} is not an allowed type ({allowed})"))
                continue
            price = hourly_price(instance_type, region)
            if price is None:
                problems.append(
                    (
                        "MaxHourlyPrice",
                        f"no price is known for {instance_type} in {region}, so its cost cannot be bounded",
                    )
                )
            elif price * count > self.max_hourly_price + 1e-9:
                problems.append(
                    (
                        "MaxHourlyPrice",
                        f"{count} x {instance_type} costs ${price * count:.2f}/h, over ${self.max_hourly_price:.2f}/h",
                    )
                )
        if count > self.max_instance_count:
            problems.append(("MaxInstanceCount", f"instance_count {count} is over {self.max_instance_count}"))
        return problems

    def _problems(
        self, request: DeploymentRequest, types: list[str], region: str, ttl_hours: float
    ) -> list[tuple[str, str]]:
        problems = self.capacity_problems(types, request.instance_count, region)
        if ttl_hours > self.max_ttl_hours:
            problems.append(("MaxTtlHours", f"ttl_hours {ttl_hours:g} is over {self.max_ttl_hours:g}"))
        if request.force_plan and not self.allow_force_plan:
            problems.append(("AllowForcePlan", "force_plan (deploying a plan predicted to run out of memory)"))
        if request.engine_settings.trust_remote_code and not self.allow_trust_remote_code:
            problems.append(
                ("AllowTrustRemoteCode", "trust_remote_code (running the checkpoint's own Python code) is not allowed")
            )
        thresholds = request.eval_thresholds
        loosest = max(thresholds.max_truncated, thresholds.max_errors, thresholds.max_check_failures)
        if loosest > self.max_eval_tolerance:
            problems.append(
                (
                    "MaxEvalTolerance",
                    f"eval_thresholds tolerate {loosest} failed cases, over {self.max_eval_tolerance}: "
                    "the smoke eval could not fail the deployment",
                )
            )
        if request.gate.max_regressed_cases > self.max_gate_regressions:
            problems.append(
                (
                    "MaxGateRegressions",
                    f"gate.max_regressed_cases {request.gate.max_regressed_cases} is over "
                    f"{self.max_gate_regressions}: the champion/challenger gate could let a regression through",
                )
            )
        if request.gate.latency_slack_s > self.max_gate_latency_slack:
            problems.append(
                (
                    "MaxGateLatencySlack",
                    f"gate.latency_slack_s {request.gate.latency_slack_s:g} is over {self.max_gate_latency_slack:g}: "
                    "the gate would call that much slower noise",
                )
            )
        if request.promotion_grace_hours > self.max_ttl_hours:
            problems.append(
                (
                    "MaxTtlHours",
                    f"promotion_grace_hours {request.promotion_grace_hours:g} is over {self.max_ttl_hours:g}",
                )
            )
        return problems
