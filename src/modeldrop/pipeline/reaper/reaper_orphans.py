"""The reaper's orphan sweep: managed models and endpoint configs no live endpoint uses, deleted once past the grace."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.pages import all_items
from modeldrop.aws.sagemaker.sagemaker_resources import (
    DEPLOYMENT_TAG,
    MANAGED_BY_TAG,
    list_tags,
)

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient


from modeldrop.pipeline.reaper.reap_model import ORPHAN_GRACE, ReapResult, _dead, _managed


def _remove_orphans(
    sm: SageMakerClient,
    registry: Registry,
    stack_tag: str,
    resource_prefix: str,
    live: set[str],
    now: datetime,
    result: ReapResult,
    keep: set[str] | frozenset[str] = frozenset(),
) -> None:
    """KEEP: configs and models a channel still serves or keeps for a rollback."""
    kinds = (
        (
            "endpoint-config",
            "list_endpoint_configs",
            "EndpointConfigs",
            "EndpointConfigName",
            "EndpointConfigArn",
            lambda n: sm.delete_endpoint_config(EndpointConfigName=n),
        ),
        ("model", "list_models", "Models", "ModelName", "ModelArn", lambda n: sm.delete_model(ModelName=n)),
    )
    in_use: set[str] | None = None  # configs and models behind live endpoints, described only if needed
    for kind, lister, key, name_key, arn_key, delete in kinds:
        for res in all_items(sm, lister, key, page_size=100):
            name = res[name_key]
            if name in live or name in keep or not _managed(name, resource_prefix):
                continue
            if in_use is None:
                in_use = _in_use(sm, live, resource_prefix)
            if name in in_use:
                continue
            tags = list_tags(sm, res[arn_key])
            if tags.get(MANAGED_BY_TAG) != stack_tag:
                continue
            deployment_id = tags.get(DEPLOYMENT_TAG)
            item = registry.get(deployment_id) if deployment_id else None
            created = res.get("CreationTime")
            old_enough = isinstance(created, datetime) and now - created > ORPHAN_GRACE
            if item is not None and not item.terminal and not _dead(item, now):
                continue  # a deployment in flight owns it (one stuck past its deadline does not)
            if item is None and not old_enough:
                continue
            try:
                delete(name)
                result.orphans_deleted.append(f"{kind}/{name}")
            except ClientError as exc:
                result.errors.append(f"{kind}/{name}: {exc}")


def _in_use(sm: SageMakerClient, live: set[str], resource_prefix: str) -> set[str]:
    """Names of the configs behind live endpoints and of their models (a fallback attempt's config
    and model are named apart from the endpoint)."""
    in_use: set[str] = set()
    for name in live:
        if not _managed(name, resource_prefix):
            continue
        try:
            config = sm.describe_endpoint(EndpointName=name)["EndpointConfigName"]
            in_use.add(config)
            variants = sm.describe_endpoint_config(EndpointConfigName=config).get("ProductionVariants", [])
            in_use.update(str(v["ModelName"]) for v in variants if v.get("ModelName"))
        except ClientError:
            continue
    return in_use
