"""Delete managed endpoints past their expiry, and what ended deployments left behind.

Only resources tagged managed-by = this stack are ever touched.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.channel_store import ChannelStore
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.s3.served_copy import SERVED_PREFIX, delete_served, delete_served_for
from modeldrop.aws.sagemaker.inference_components import Released, on_endpoint, release, release_all
from modeldrop.aws.sagemaker.sagemaker_resources import (
    DEPLOYMENT_TAG,
    EXPIRES_TAG,
    MANAGED_BY_TAG,
    delete_all,
    list_endpoints,
    list_tags,
)
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ModeldropError, StepContractViolated
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.deployment.teardown import stranded_of

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.type_defs import DescribeEndpointOutputTypeDef

from modeldrop.pipeline.channels.channel_close import close_stale
from modeldrop.pipeline.channels.channel_context import ChannelContext
from modeldrop.pipeline.channels.channel_upkeep import arm_idle_channels, channel_held, retire_due
from modeldrop.pipeline.channels.promotion_settle import settle_all
from modeldrop.pipeline.reaper.reap_model import BUSY_STATES, ORPHAN_GRACE, ReapResult, _dead, _ended_at, _managed
from modeldrop.pipeline.reaper.reaper_orphans import _remove_orphans


def expiry_of(tags: dict[str, str], created: Any, default_ttl: timedelta) -> tuple[datetime | None, str | None]:
    """(when the endpoint expires, what was wrong with its tag). A missing, empty or unreadable
    expires-at tag never means 'never': the stack's default TTL from CreationTime applies."""
    raw = (tags.get(EXPIRES_TAG) or "").strip()
    if raw:
        try:
            return clock.parse_iso(raw.replace("z", "Z")), None
        except ValueError:
            problem = f"unreadable {EXPIRES_TAG} tag {raw!r}"
    else:
        problem = f"no {EXPIRES_TAG} tag"
    if isinstance(created, datetime):
        start = created if created.tzinfo else created.replace(tzinfo=UTC)
        return start + default_ttl, f"{problem}: the default TTL from CreationTime applies"
    return None, f"{problem} and no CreationTime"


def reap(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    stack_tag: str,
    resource_prefix: str,
    now: datetime | None = None,
    period: timedelta = timedelta(minutes=15),
    default_ttl: timedelta = timedelta(hours=4),
    s3: S3Client | None = None,
    bucket: str | None = None,
    max_ttl: timedelta = timedelta(hours=72),
    cloudwatch: CloudWatchClient | None = None,
    autoscaling: ApplicationAutoScalingClient | None = None,
) -> ReapResult:
    """One reaper run. `period` is how often it runs: an endpoint two periods past expiry is overdue.

    Every resource is handled on its own: a throttled or refused delete is counted in `errors`
    and retried next run, never the end of the run."""
    overdue_after = 2 * period
    now = now or clock.utcnow()
    result = ReapResult()
    live: set[str] = set()
    deleting: set[str] = set()
    # A channel's endpoint has no TTL, and what it keeps for a rollback is no orphan: as its record says.
    store = ChannelStore(registry.table)
    channels = store.all()
    if cloudwatch is not None:  # a claim nobody completed within its budget does not hold its channel
        try:
            ctx = ChannelContext(sm=sm, runtime=None, cloudwatch=cloudwatch, registry=registry, channels=store,
                                 resource_prefix=resource_prefix, stack_tag=stack_tag, s3=s3,
                                 autoscaling=autoscaling)  # fmt: skip
            result.settled = settle_all(ctx, channels) + close_stale(ctx, channels)
        except (ClientError, ModeldropError) as exc:
            result.errors.append(f"channel claims: {exc}")
    # A channel closed just now leaves its endpoint Deleting: still the channel's for this run, not a
    # managed endpoint with no TTL.
    closed_now = {c.endpoint_name for c in channels}
    channels = store.all() if result.settled else channels
    channel_endpoints, channel_names, channel_deployments = channel_held(channels)
    channel_endpoints |= closed_now
    for ep in list_endpoints(sm):
        name = ep["EndpointName"]
        live.add(name)
        if ep.get("EndpointStatus") == "Deleting":
            deleting.add(name)
        if not _managed(name, resource_prefix):
            continue
        try:
            # An adapter channel's base: the components the channel does not hold still have TTLs.
            _reap_attached(sm, registry, stack_tag, ep, now, default_ttl, result, s3, keep=channel_deployments)
            if name in channel_endpoints:
                continue
            _reap_endpoint(
                sm, registry, events, bus, stack_tag, ep, now, overdue_after, default_ttl, result, s3, max_ttl
            )
        except (ClientError, ModeldropError) as exc:
            result.errors.append(f"{name}: {exc}")
    try:
        _reconcile_records(sm, registry, live - deleting, now, result, s3, channel_deployments)
    except (ClientError, ModeldropError) as exc:
        result.errors.append(f"records: {exc}")
    try:
        result.retired = retire_due(sm, registry, store, channels, s3)
        if cloudwatch is not None:
            result.armed = arm_idle_channels(cloudwatch, channels, now, autoscaling, store)
    except (ClientError, ModeldropError) as exc:
        result.errors.append(f"channels: {exc}")
    try:
        _remove_orphans(sm, registry, stack_tag, resource_prefix, live, now, result, keep=channel_names)
    except (ClientError, ModeldropError) as exc:
        result.errors.append(f"orphans: {exc}")
    if s3 is not None and bucket:
        try:
            _sweep_served_copies(s3, registry, bucket, now, result)
        except (ClientError, ModeldropError) as exc:
            result.errors.append(f"served copies: {exc}")
    try:
        result.budget_released = registry.release_stale_reservations()
    except (ClientError, ModeldropError) as exc:
        result.errors.append(f"stack budget: {exc}")
    return result


def _reconcile_records(
    sm: SageMakerClient,
    registry: Registry,
    live: set[str],
    now: datetime,
    result: ReapResult,
    s3: S3Client | None,
    held: frozenset[str] | set[str] = frozenset(),
) -> None:
    """A deployment that succeeded but whose endpoint is gone (deleted outside modeldrop): its record
    closes, so its artifact claim, its served copy and its share of the stack's ceiling go too. One a
    channel serves or keeps (HELD) lost its own endpoint to the channel's on purpose."""
    for record in registry.deployments():
        name = record.endpoint_name
        if record.status != "succeeded" or not name or name in live or record.deployment_id in held:
            continue
        try:
            if sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "Deleting":
                continue  # listed late: still there
        except ClientError as exc:
            if "Could not find" not in str(exc) and exc.response.get("Error", {}).get("Code") != "ValidationException":
                raise
        try:
            registry.record(
                record.deployment_id,
                "reconciled",
                {"reason": f"endpoint {name} was deleted outside modeldrop"},
                status="torn_down",
                ended_at=clock.iso(now),
            )
        except StepContractViolated:
            continue  # it ended some other way since it was read (a teardown racing this run): theirs
        _delete_served_copy(s3, record, record.deployment_id)
        result.reconciled.append(record.deployment_id)


def _sweep_served_copies(s3: S3Client, registry: Registry, bucket: str, now: datetime, result: ReapResult) -> None:
    """Delete the served copy of every deployment that ended, and of any no deployment registered
    (once older than the orphan grace); a deployment in flight or serving keeps its copy. A copy may
    be only incomplete uploads (a Lambda killed before any object was complete): found too."""
    with_objects: set[str] = set()
    listed = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=SERVED_PREFIX, Delimiter="/")
    for page in listed:
        for common in page.get("CommonPrefixes", []):
            with_objects.add(common["Prefix"][len(SERVED_PREFIX) :].rstrip("/"))
    uploads: dict[str, datetime] = {}  # deployment id -> its newest open upload's start
    for open_page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=SERVED_PREFIX):
        for upload in open_page.get("Uploads", []):
            deployment_id = upload["Key"][len(SERVED_PREFIX) :].split("/", 1)[0]
            initiated = upload.get("Initiated")
            started = initiated if isinstance(initiated, datetime) else now
            uploads[deployment_id] = max(uploads.get(deployment_id, started), started)
    for deployment_id in sorted((with_objects | set(uploads)) - {""}):
        record = registry.get(deployment_id)
        if record is not None and not record.released:
            continue
        if record is None:
            cutoff = now - ORPHAN_GRACE
            if uploads.get(deployment_id, cutoff) > cutoff:
                continue
            if deployment_id in with_objects and not _older_than(
                s3, bucket, f"{SERVED_PREFIX}{deployment_id}/", cutoff
            ):
                continue
        result.served_copies_deleted += delete_served(s3, bucket, deployment_id)


def _older_than(s3: S3Client, bucket: str, prefix: str, cutoff: datetime) -> bool:
    """Every version under PREFIX was written before CUTOFF."""
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        for entry in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]:
            modified = entry.get("LastModified")
            if not isinstance(modified, datetime) or modified > cutoff:
                return False
    return True


def _reap_endpoint(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    stack_tag: str,
    ep: dict[str, Any],
    now: datetime,
    overdue_after: timedelta,
    default_ttl: timedelta,
    result: ReapResult,
    s3: S3Client | None = None,
    max_ttl: timedelta = timedelta(hours=72),
) -> None:
    name = ep["EndpointName"]
    tags = list_tags(sm, ep["EndpointArn"])
    if tags.get(MANAGED_BY_TAG) != stack_tag:
        return
    expires, problem = expiry_of(tags, ep.get("CreationTime"), default_ttl)
    result.errors += [f"{name}: {problem}"] if problem else []
    deployment_id = tags.get(DEPLOYMENT_TAG)
    record = _own_record(registry, deployment_id, name)
    expires = _bounded(expires, record, ep.get("CreationTime"), max_ttl)
    # An earlier attempt's endpoint that could not be deleted while Creating: its deployment never uses it.
    dead = _dead(record, now) or (record is not None and record.endpoint_name != name)
    if not dead and (expires is None or expires > now):
        return
    try:
        desc = sm.describe_endpoint(EndpointName=name)
    except ClientError:
        return  # deleted since it was listed
    if desc["EndpointStatus"] in BUSY_STATES and not dead:
        result.retry_next_run.append(f"{name} ({desc['EndpointStatus']})")
    else:
        _expire(sm, registry, events, bus, desc, deployment_id if record else None, result, dead)
        if record and name in result.expired:
            _delete_served_copy(s3, record, str(deployment_id))
    _note_overdue(name, expires, _ended_at(record) if dead else None, now, overdue_after, result)


def _note_overdue(
    name: str, expires: datetime | None, ended: datetime | None, now: datetime, after: timedelta, result: ReapResult
) -> None:
    """Overdue: still up past its expiry, or past its own deployment's end, by two reaper periods --
    a delete that keeps failing included, whatever the endpoint's TTL says."""
    if name in result.expired or any(k.startswith(f"{name}:") for k in result.kept):
        return
    if any(moment is not None and moment + after < now for moment in (expires, ended)):
        result.overdue.append(name)


def _reap_attached(
    sm: SageMakerClient,
    registry: Registry,
    stack_tag: str,
    ep: dict[str, Any],
    now: datetime,
    default_ttl: timedelta,
    result: ReapResult,
    s3: S3Client | None,
    keep: set[str] | frozenset[str] = frozenset(),
) -> None:
    """Adapter components another deployment attached to this endpoint (base_endpoint), past their own
    expiry or their deployment's end: deleted, and that deployment marked expired (its served copy
    goes too). The endpoint and its own components are its owner's, handled by _reap_endpoint."""
    name = ep["EndpointName"]
    listed = on_endpoint(sm, name)
    if not listed:
        return
    endpoint_owner = list_tags(sm, ep["EndpointArn"]).get(DEPLOYMENT_TAG)
    for item in listed:
        tags = list_tags(sm, str(item["InferenceComponentArn"]))
        owner = tags.get(DEPLOYMENT_TAG)
        if tags.get(MANAGED_BY_TAG) != stack_tag or owner is None or owner == endpoint_owner or owner in keep:
            continue
        expires, _problem = expiry_of(tags, item.get("CreationTime"), default_ttl)
        record = registry.get(owner)
        if not _dead(record, now) and (expires is None or expires > now):
            continue
        released = release(sm, name, owner, only=str(item["InferenceComponentName"]))
        if released.failed:
            result.errors.extend(released.failed)
            continue
        result.expired += released.deleted
        if record is None or record.ended_at is not None:
            continue
        try:
            registry.record(owner, "expired", {"deleted": released.deleted}, status="expired", ended_at=clock.iso(now))
        except StepContractViolated:
            continue
        _delete_served_copy(s3, record, owner)


def _bounded(
    expires: datetime | None, record: DeploymentRecord | None, created: Any, max_ttl: timedelta
) -> datetime | None:
    """The expiry the reaper honours: never later than the record's own (which only the stack writes:
    a tag edited by anyone with sagemaker:AddTags does not outlive it), nor than MaxTtlHours from
    creation when there is no record."""
    own = None
    if record is not None and record.expires_at:
        try:
            own = clock.parse_iso(record.expires_at)
        except ValueError:
            own = None
    if own is None and isinstance(created, datetime):
        own = (created if created.tzinfo else created.replace(tzinfo=UTC)) + max_ttl
    if expires is None or own is None:
        return expires or own
    return min(expires, own)


def _own_record(registry: Registry, deployment_id: str | None, endpoint_name: str) -> DeploymentRecord | None:
    """The deployment's record, if this endpoint is one it names (its endpoint, or an earlier attempt's
    stranded one): a copy with its tags changes nothing in it."""
    record = registry.get(deployment_id) if deployment_id else None
    if record is None:
        return None
    owned = {record.endpoint_name, *(held.endpoint for held in stranded_of(record))}
    return record if endpoint_name in owned else None


def _delete_served_copy(s3: S3Client | None, record: DeploymentRecord, deployment_id: str) -> None:
    if s3 is not None and record.artifact_uri:
        delete_served_for(s3, record.artifact_uri, deployment_id)


def _expire(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    desc: DescribeEndpointOutputTypeDef,
    deployment_id: str | None,
    result: ReapResult,
    dead: bool = False,
) -> None:
    name = desc["EndpointName"]
    config = desc.get("EndpointConfigName", name)
    components = Released()
    try:
        variant = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]
        model = variant.get("ModelName") or config  # shared: the model its base component runs
        if not variant.get("ModelName"):
            components = release_all(sm, name, deployment_id)
    except (ClientError, KeyError, IndexError):
        model = name
    if components.blocked:  # another deployment's adapters still on its base: kept for them, not overdue
        result.kept.append(f"{name}: {'; '.join(components.blocked)}")
        return
    if components.waiting:  # still deleting when this run's time ran out: the next run goes on
        result.retry_next_run.append(f"{name}: waiting for {', '.join(components.waiting)} to delete")
        return
    deleted, _gone, failed, _not_ours = delete_all(sm, name, config, model)
    deleted, failed = [*components.deleted, *deleted], [*components.failed, *failed]
    if failed:
        result.errors.extend(failed)
        return
    result.expired.append(name)
    if not deployment_id:
        return
    if dead:  # its own deployment already ended (or never will): say what the reaper did, keep its status
        registry.record(deployment_id, "reaped", {"deleted": deleted, "reason": "deployment ended"})
        return
    try:
        item = registry.record(
            deployment_id, "expired", {"deleted": deleted}, status="expired", ended_at=clock.iso(clock.utcnow())
        )
    except StepContractViolated:
        return  # no record (e.g. created by hand with our tags), or it ended meanwhile: nothing to mark
    publish(events, bus, "Deployment Expired", {**lifecycle_detail(item, "expired"), "deleted": deleted})
