"""The deployment record: what the registry holds about one deployment, as one typed value.

The table stores each step's result and the request as JSON strings (floats survive DynamoDB's
number type, and one step's shape cannot break another's); `DeploymentRecord.from_item` decodes
them once, so no reader picks a raw item apart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modeldrop.contracts import clock
from modeldrop.contracts.artifact import ArtifactUri

# Every step that writes the record. A fallback attempt's plan is stored as build_env_2, build_env_3...
StepName = Literal[
    "preflight",
    "validate",
    "resolve_image",
    "engine_check",
    "build_env",
    "quota_wait",
    "create_endpoint",
    "attempts",
    "smoke_eval",
    "failure",
    "teardown",
    "result",
    "execution_ended",
    "extended",
    "torn_down",
    "expired",
    "reaped",
    "stranded",
    "adapters_removed",
    "reconciled",
    "promoted",
    "not_promoted",
    "retired",
    "channel_waking",
]

# Nothing moves a record out of these: a Lambda still running after its execution ended cannot
# bring it back, and its artifact claim passes on.
# "rejected": an upload the starter refused (a marker it could not read): nothing started, nothing held.
ENDED = frozenset({"failed", "expired", "torn_down", "aborted", "timed_out", "rejected"})
TERMINAL = ENDED | {"succeeded"}
# A holder in one of these states has no endpoint (or never will): its artifact claim may be taken over.
RELEASED = ENDED
# A deployment on its way: what the pipeline's own steps move between.
IN_FLIGHT = frozenset({"registered", "validated", "refused", "planned", "waiting-for-quota", "creating", "failing"})

# Each status, and the statuses a record may reach it from (the registry's conditional writes hold it).
TRANSITIONS: dict[str, frozenset[str]] = {
    "validated": frozenset({"registered"}),
    "refused": frozenset({"registered"}),
    "planned": frozenset({"validated", "planned", "waiting-for-quota", "creating"}),
    "waiting-for-quota": frozenset({"planned", "waiting-for-quota"}),
    "creating": frozenset({"planned", "waiting-for-quota", "creating"}),
    "failing": IN_FLIGHT,
    "succeeded": frozenset({"creating", "succeeded"}),
    "failed": IN_FLIGHT,
    "aborted": IN_FLIGHT,
    "timed_out": IN_FLIGHT,
    "expired": IN_FLIGHT | {"succeeded"},
    "torn_down": IN_FLIGHT | {"succeeded"},
}


def step_key(step: StepName, attempt: int = 0) -> str:
    """The record key of STEP; attempts after the first keep their own (build_env_2, ...)."""
    return step if attempt == 0 else f"{step}_{attempt + 1}"


class DeploymentRecord(BaseModel):
    # Unknown attributes are kept (a record written by a newer version reads back whole).
    model_config = ConfigDict(extra="allow")

    deployment_id: str
    execution_name: str | None = None
    execution_arn: str | None = None
    status: str = "registered"
    request: dict[str, Any] | None = None
    steps: dict[str, Any] = Field(default_factory=dict)
    created_at: str | None = None
    updated_at: str | None = None
    artifact_uri: ArtifactUri | None = None
    artifact_version: str | None = None
    engine: str | None = None
    instance_type: str | None = None
    instance_count: int = 1
    endpoint_name: str | None = None
    region: str | None = None
    hourly_price: str | None = None
    price_read_on: str | None = None
    image_uri: str | None = None
    validation_report_uri: str | None = None
    eval_report_uri: str | None = None
    started_at: str | None = None
    expires_at: str | None = None
    succeeded_at: str | None = None
    ended_at: str | None = None
    error: str | None = None
    failure_class: str | None = None
    failure_reason: str | None = None
    served_uri: ArtifactUri | None = None
    # Set when teardown left something behind: the reaper deletes it on a later run.
    reaper_retry: bool = False

    @classmethod
    def from_item(cls, item: Mapping[str, Any]) -> DeploymentRecord:
        """A DynamoDB item (JSON-string request and steps, Decimal numbers) as a record."""
        fields = {k: _plain(v) for k, v in item.items() if k not in ("request", "steps")}
        request = item.get("request")
        fields["request"] = json.loads(request) if isinstance(request, str) and request else None
        fields["steps"] = {k: json.loads(v) for k, v in (item.get("steps") or {}).items()}
        return cls.model_validate(fields)

    def step(self, step: StepName, attempt: int = 0) -> Any:
        """One step's stored result, or None when that step has not written."""
        return self.steps.get(step_key(step, attempt))

    def step_dict(self, step: StepName, attempt: int = 0) -> dict[str, Any]:
        result = self.step(step, attempt)
        return result if isinstance(result, dict) else {}

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def released(self) -> bool:
        return self.status in RELEASED

    def cost_so_far(self) -> float | None:
        """Dollars billed from endpoint creation to its end (or now), at the recorded hourly price of
        each of its instances."""
        if not self.hourly_price or not self.started_at:
            return None
        end = clock.parse_iso(self.ended_at) if self.ended_at else clock.utcnow()
        hours = max(0.0, (end - clock.parse_iso(self.started_at)).total_seconds() / 3600)
        return round(hours * float(self.hourly_price) * self.instance_count, 4)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def _plain(value: Any) -> Any:
    """DynamoDB's Decimal as int or float, so the record's JSON is plain numbers."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
