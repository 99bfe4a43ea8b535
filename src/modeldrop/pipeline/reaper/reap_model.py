"""What a reaper run reports, and the judgements on a record it shares with the orphan sweep: whether a
name is managed, when a record ended, whether its deployment is dead."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord

if TYPE_CHECKING:
    pass

BUSY_STATES = {"Creating", "Updating", "SystemUpdating", "RollingBack", "Deleting", "UpdateRollbackFailed"}


ORPHAN_GRACE = timedelta(hours=1)


class ReapResult(BaseModel):
    expired: list[str] = Field(default_factory=list)
    retry_next_run: list[str] = Field(default_factory=list)
    orphans_deleted: list[str] = Field(default_factory=list)
    # Managed endpoints still up past expiry + the grace: what the OverdueEndpoints alarm counts.
    overdue: list[str] = Field(default_factory=list)
    # Served copies of deployments that ended (or never registered): a Lambda that ran on after its
    # execution stopped may have written one after the cleanup.
    served_copies_deleted: list[str] = Field(default_factory=list)
    # Past their expiry but holding other deployments' adapters: kept for them, retried every run.
    kept: list[str] = Field(default_factory=list)
    # Records of deployments whose endpoint was deleted outside modeldrop, closed.
    reconciled: list[str] = Field(default_factory=list)
    # Stack-ceiling reservations of deployments that ended without giving theirs back (a killed Lambda).
    budget_released: list[str] = Field(default_factory=list)
    # Versions a channel kept for a rollback whose grace ended: their configs, models and served copies.
    retired: list[str] = Field(default_factory=list)
    # Channel claims (a promotion, a rollback, a close) nobody completed within their budget, settled.
    settled: list[str] = Field(default_factory=list)
    # Scaled channels whose idle period has passed since they were created: their idle alarm armed.
    armed: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)


def _managed(name: str, resource_prefix: str) -> bool:
    # Only names under the stack's prefix can be ours (IAM allows nothing else): skip the rest unlisted.
    return name.startswith(f"{resource_prefix}-")


def _ended_at(record: DeploymentRecord | None) -> datetime | None:
    raw = (record.ended_at or record.updated_at) if record else None
    try:
        return clock.parse_iso(raw) if raw else None
    except ValueError:
        return None


def _dead(record: DeploymentRecord | None, now: datetime) -> bool:
    """The record's deployment will never tear this endpoint down: it ended without it (failed,
    aborted, torn down), or it is still 'in flight' past its own deploy deadline."""
    if record is None:
        return False
    if record.released:
        return True
    if record.terminal:
        return False
    if record.step_dict("smoke_eval").get("passed"):
        return False  # evaluated and healthy, only its bookkeeping failed: its TTL applies
    deadline = _deadline_of(record)
    return deadline is not None and now > deadline


def _deadline_of(record: DeploymentRecord) -> datetime | None:
    raw = record.step_dict("create_endpoint").get("deadline_at")
    try:
        return clock.parse_iso(raw) if raw else None
    except ValueError:
        return None
