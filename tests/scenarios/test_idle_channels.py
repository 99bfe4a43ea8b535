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
    # Never before the idle period; at most a reaper period (15 min) later, when the reaper arms the alarm.
    assert slept["instances"] == 0 and 600 <= slept["idle_seconds"] <= 600 + 900 + 60
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
    # The promotion and the rollback each placed the new copy on one extra instance, counted in the cost.
    assert "one extra instance" in cost["updates"] and 0 < cost["update_instance_hours"] < 1
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


def test_channels_json_gives_the_cost_and_invoke_waits_out_a_sleeping_channel(
    deployed: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    import json

    from typer.testing import CliRunner

    from modeldrop.cli import app
    from modeldrop.contracts import clock
    from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

    stack = deployed
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", stack.runtime.url)  # as `local up`'s env has it
    where = ["--stack", "modeldrop-local", "--region", "us-east-1"]
    packed = write_tar_gz(write_checkpoint(tmp_path / "ckpt"), tmp_path / "ckpt.tar.gz")
    stack.client("s3").upload_file(str(packed), stack.bucket, "direct/idle/model.tar.gz")
    request = {"artifact_uri": f"s3://{stack.bucket}/direct/idle/model.tar.gz", "channel": "nightly",
               "idle": {"scale_to_zero_after": "10m"}}  # fmt: skip
    done = stack.wait(stack.start(request), timeout=240)
    assert done["status"] == "SUCCEEDED", (done.get("error"), done.get("cause"))
    # Three hours without a call: the reaper, on its schedule, arms the idle alarm once the channel has
    # existed its idle period; asleep from the next minute.
    scheduled = {"source": "aws.events", "detail-type": "Scheduled Event"}
    from modeldrop.aws.autoscaling import idle_scaling

    # An update whose Lambda stopped before its last check left scale-in suspended: the reaper gives it back.
    idle_scaling.suspend_scale_in(stack.client("application-autoscaling"), "modeldrop-ch-nightly", True)
    clock.advance(660)
    assert stack.invoke_function("ReaperFunction", scheduled)["armed"] == ["nightly"]
    clock.advance(3 * 3600 - 660)
    cli = CliRunner()
    [listed] = json.loads(cli.invoke(app, ["channels", *where, "--json"]).output)
    cost = listed["cost"]
    assert listed["idle"]["mode"] == "scale_to_zero" and cost["scales_to_zero"] and cost["current_instances"] == 0
    today = cost["today"] if cost["today"]["instance_hours"] else cost["month"]  # a run across midnight UTC
    assert (
        0 < today["instance_hours"] < 0.5 and today["idle_hours_saved"] > 2.5 and today["usd"] < today["always_on_usd"]
    )
    narrow = cli.invoke(app, ["channels", *where], terminal_width=80).output  # COLUMNS=80: nothing cut
    assert "modeldrop-ch-nightly" in narrow and listed["live"]["deployment_id"] in narrow, narrow
    assert all(len(line) <= 80 or " " not in line.strip() for line in narrow.splitlines()), narrow
    unknown = cli.invoke(app, ["invoke", "nosuchchannel", *where])
    assert unknown.exit_code == 1 and "no channel named nosuchchannel" in unknown.output, unknown.output
    woke = cli.invoke(app, ["invoke", "nightly", *where, "--json"])
    answered = json.loads(woke.output)
    assert woke.exit_code == 0 and answered["answered"] and answered["retries"] > 0, woke.output
    assert answered["target"] == {
        "EndpointName": "modeldrop-ch-nightly",
        "InferenceComponentName": "modeldrop-ch-nightly",
    }
    closed = cli.invoke(app, ["teardown", "nightly", *where, "--json"])
    assert closed.exit_code == 0, closed.output
    assert stack.leftover_resources() == []  # the channel's scaling, component, endpoint and versions
    again = cli.invoke(app, ["teardown", "nightly", *where])  # idempotent, as a deployment's second teardown
    assert again.exit_code == 0 and "closed already: nothing left" in again.output, again.output


def test_a_gate_whose_champion_is_scaled_in_after_the_knock_does_not_promote() -> None:
    """The idle alarm scales the channel in between the gate's wake-up knock and its first case: the champion
    answers nothing, and the broken candidate (every answer cut) is refused as undetermined, not promoted."""
    result = run_local(channel="demo", idle="10m", fault="gate-scale-in,regression")
    assert result.status == "failed" and result.error == "PromotionBlocked", (result.error, result.cause)
    assert "undetermined" in str(result.cause) and "answered 0 of 3" in str(result.cause)
    steps = _steps(result)
    assert "not promoted" in steps and "promoted while asleep" not in steps
    assert result.leftover_resources == []
