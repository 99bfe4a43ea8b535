"""What the reaper does for channels, apart from promotion (so that it imports no eval or
template code): the versions a channel keeps for a rollback are deleted once their grace ends, and
what channels serve or keep is left out of its TTL and orphan sweeps."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from modeldrop.aws.dynamodb.channel_store import ChannelStore
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.s3.served_copy import delete_served_for
from modeldrop.aws.sagemaker.sagemaker_resources import delete_all
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord, ChannelVersion
from modeldrop.contracts.errors import TeardownIncomplete
from modeldrop.pipeline.adapters.adapter_release import release_adapter_component
from modeldrop.pipeline.deployment.teardown import held_by, teardown

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient


def channel_held(channels: list[ChannelRecord]) -> tuple[set[str], set[str], set[str]]:
    """(channel endpoints, configs and models they still need, deployments they hold): what the reaper leaves."""
    endpoints = {c.endpoint_name for c in channels}
    names: set[str] = set()
    deployments: set[str] = set()
    for channel in channels:
        names |= channel.holds()
        deployments |= channel.deployments()
    return endpoints, names, deployments


def delete_version(
    sm: SageMakerClient, registry: Registry, s3: S3Client | None, version: ChannelVersion, base: str | None = None
) -> list[str]:
    """VERSION's endpoint config, models and served copy (each only if tagged for its deployment), and
    its record ended. Its own endpoint went when it was promoted; the channel's is not touched here.
    An adapter version: its component (and an attached deployment's served copy); BASE's own
    component goes alone, its base serving on."""
    owner = version.deployment_id
    if version.component:
        return _delete_component_version(sm, registry, s3, version, base)
    deleted: list[str] = []
    failed: list[str] = []
    for i, model in enumerate(version.models or [None]):
        done, _gone, not_deleted, _not_ours = delete_all(
            sm, None, version.endpoint_config if i == 0 else None, model, owner=owner
        )
        deleted, failed = deleted + done, failed + not_deleted
    if failed:
        raise TeardownIncomplete(f"could not delete: {'; '.join(failed)}")
    record = registry.get(owner)
    if s3 is not None and record is not None:
        deleted += delete_served_for(s3, record.artifact_uri, owner)
    if record is not None and record.status == "succeeded":
        registry.record(owner, "retired", {"deleted": deleted}, status="torn_down", ended_at=clock.iso(clock.utcnow()))
    return deleted


def _delete_component_version(
    sm: SageMakerClient, registry: Registry, s3: S3Client | None, version: ChannelVersion, base: str | None
) -> list[str]:
    owner = version.deployment_id
    record = registry.get(owner)
    if record is None or record.ended_at is not None:
        return []
    if owner == base:  # the base deployment's own adapter: only its component goes
        released = release_adapter_component(sm, registry, record, str(version.adapter), str(version.component))
        if released.failed:
            raise TeardownIncomplete(f"could not delete: {'; '.join(released.failed)}")
        return released.deleted
    done = teardown(sm, registry, owner, held_by(record), s3=s3, artifact_uri=record.artifact_uri)
    if record.status == "succeeded":
        registry.record(owner, "retired", {"deleted": done.deleted}, status="torn_down",
                        ended_at=clock.iso(clock.utcnow()))  # fmt: skip
    return list(done.deleted)


def retire_due(
    sm: SageMakerClient, registry: Registry, store: ChannelStore, channels: list[ChannelRecord], s3: S3Client | None
) -> list[str]:
    """CHANNELS' kept versions past their grace, deleted (the reaper runs it); returns what was deleted.
    A channel with a claim under way waits for the next run: a rollback may be moving onto its kept version."""
    deleted: list[str] = []
    now = clock.utcnow()
    for channel in channels:
        if channel.candidate is not None:  # a claim under way may move the endpoint onto a kept version
            continue
        due = [v for v in channel.kept if v.remove_after and clock.parse_iso(v.remove_after) <= now]
        if not due:
            continue
        for version in due:
            deleted += delete_version(sm, registry, s3, version, channel.base_deployment)
            kept = (now - clock.parse_iso(version.retired_at)).total_seconds() if version.retired_at else None
            channel.history.append(
                ChannelEvent(at=clock.iso(now), kind="retired", deployment_id=version.deployment_id,
                             reason="its grace period ended", seconds=round(kept, 1) if kept is not None else None)
            )  # fmt: skip
        channel.kept = [v for v in channel.kept if v not in due]
        store.save(channel)
    return deleted


def arm_idle_channels(
    cw: CloudWatchClient,
    channels: list[ChannelRecord],
    now: datetime,
    aas: ApplicationAutoScalingClient | None = None,
    store: ChannelStore | None = None,
) -> list[str]:
    """Each scaled channel that has existed its idle period, with no change under way: its idle alarm's
    actions on (they were created off, or a never-called channel would sleep at its first minute). With
    AAS, scale-in is given back to each scaled channel no change holds (read again just before): an update
    whose Lambda stopped before its last check would otherwise leave it suspended, and the channel would
    never sleep again."""
    from modeldrop.aws.autoscaling.idle_scaling import arm_idle, suspend_scale_in

    armed = []
    for channel in channels:
        idle = channel.idle
        if not channel.scales_to_zero or idle is None or not idle.since or channel.candidate is not None:
            continue
        if aas is not None and store is not None and (fresh := store.get(channel.name)) and fresh.candidate is None:
            suspend_scale_in(aas, str(idle.component), False)
        if (now - clock.parse_iso(idle.since)).total_seconds() >= idle.after_seconds and arm_idle(
            cw, str(idle.component)
        ):
            armed.append(channel.name)
    return armed
