"""A channel that scales to zero, through the real state machine on the emulator's clock: it sleeps after
its idle period, a call wakes it (refused as waking until a copy answers), a promotion while it sleeps
wakes it for the gate and moves its one component, and its cost is read from its scaling history.
Where the region refuses scale to zero the channel runs always-on, its record saying why before
anything is created; a wake-up that outlasts the wait refuses the candidate and leaves nothing."""

from __future__ import annotations

from typing import Any

from modeldrop.local.scenarios.run import run_local


def _steps(result: Any) -> dict[str, dict[str, Any]]:
    steps: dict[str, dict[str, Any]] = {}
    for step in result.channel["steps"]:
        steps.setdefault(step["step"], step)
    return steps


def test_an_idle_channel_sleeps_wakes_for_a_call_and_is_promoted_while_asleep() -> None:
    result = run_local(channel="demo", idle="10m")
    assert result.status == "succeeded", (result.error, result.cause, result.channel)
    channel = result.channel
    steps = _steps(result)
    assert channel["idle"]["mode"] == "scale_to_zero" and channel["idle"]["component"] == "modeldrop-ch-demo"
    assert steps["created"]["invoke"] == {"EndpointName": "modeldrop-ch-demo",
                                          "InferenceComponentName": "modeldrop-ch-demo"}  # fmt: skip
    slept = steps["scaled to zero"]
    assert slept["instances"] == 0 and 600 <= slept["idle_seconds"] <= 720
    woke = steps["woken by a call"]
    # Refused as waking until an instance is provisioned and the copy answers: minutes, not an error.
    assert woke["answered"] and woke["retries"] > 0 and woke["seconds"] >= 300
    promoted = steps["promoted while asleep"]
    assert promoted["invoke"] == steps["created"]["invoke"]  # the same component: clients change nothing
    assert "0 of 3 cases regressed" in promoted["gate"]
    assert steps["called the promoted version"]["answered"]
    back = steps["rolled back while asleep"]
    assert back["deployment_id"] == steps["created"]["deployment_id"] and back["invoke"] == promoted["invoke"]
    assert steps["a quiet night"]["instances"] == 0
    cost = channel["cost"]
    spent = cost["since_created"]
    assert cost["scales_to_zero"] and len(cost["wakeups"]) == 3  # a call, the gate, the rollback
    assert spent["usd"] < spent["always_on_usd"] and spent["idle_hours_saved"] > 5.5
    assert any(d.startswith("scalable-target/") for d in channel["closed"])
    assert result.leftover_resources == []


def test_a_region_that_refuses_zero_runs_the_channel_always_on_and_says_why_first() -> None:
    result = run_local(channel="demo", idle="10m", fault="zero-refused")
    assert result.status == "succeeded", (result.error, result.cause)
    idle = result.channel["idle"]
    # Decided by the plan (the stack's NoScaleToZeroRegions), not by a refused create: nothing was made first.
    assert idle["mode"] == "always_on" and "NoScaleToZeroRegions" in idle["reason"] and idle["component"] is None
    assert not any("-ic" in d for d in result.channel["closed"])
    steps = _steps(result)
    assert steps["created"]["invoke"] == {"EndpointName": "modeldrop-ch-demo"} and "promoted" in steps
    spent = result.channel["cost"]["since_created"]
    assert spent["usd"] == spent["always_on_usd"] and spent["idle_hours_saved"] == 0
    assert result.leftover_resources == []


def test_a_wake_up_longer_than_the_wait_refuses_the_candidate_and_leaves_nothing() -> None:
    result = run_local(channel="demo", idle="10m", fault="slow-wake")
    assert result.status == "failed" and result.error == "PromotionFailed", (result.error, result.cause)
    assert "did not wake" in str(result.cause)
    steps = _steps(result)
    assert steps["not woken"]["error"].startswith("ChannelAsleep")
    assert steps["not promoted"]["error"] == "PromotionFailed"
    assert result.leftover_resources == []
