"""A promotion's UpdateEndpoint timeout comes from the candidate's own plan: its green fleet provisions,
downloads and starts as its first deployment did, then bakes -- within the API's 600-28,800 s."""

from __future__ import annotations

from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.channels.channel_context import (
    CHECK_MARGIN_SECONDS,
    TERMINATION_WAIT_SECONDS,
    WAIT_INTERVAL_SECONDS,
    blue_green,
    promotion_timeouts,
)

BAKE = WAIT_INTERVAL_SECONDS + TERMINATION_WAIT_SECONDS


def _record(*planned: int) -> DeploymentRecord:
    steps = {("create_endpoint" if i == 0 else f"create_endpoint_{i + 1}"): {"deadline": {"planned_seconds": s}}
             for i, s in enumerate(planned)}  # fmt: skip
    return DeploymentRecord(deployment_id="d", steps=steps)


def test_the_longest_load_a_deployment_may_take_plus_the_bake() -> None:
    timeout, budget = promotion_timeouts(_record(7200))
    assert timeout == 7200 + BAKE and budget == timeout + CHECK_MARGIN_SECONDS
    assert promotion_timeouts(_record(1800, 7200))[0] == 7200 + BAKE  # the slowest attempt's plan
    assert promotion_timeouts(_record(100_000))[0] == 28_800  # the API's maximum
    assert promotion_timeouts(_record(0))[0] == 3600 + BAKE  # no plan recorded: an hour's load
    policy = blue_green(["a"], 1, promotion_timeouts(_record(7200))[0])["BlueGreenUpdatePolicy"]
    assert policy["MaximumExecutionTimeoutInSeconds"] == 7200 + BAKE
