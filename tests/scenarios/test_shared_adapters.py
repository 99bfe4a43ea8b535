"""adapter_mode shared: one base endpoint, each adapter its own adapter inference component, each
evaluated through its own name; one adapter torn down while the others serve; a refused adapter
component takes the whole deployment down in SageMaker's order."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from conftest import ROOT

from modeldrop.local.scenarios.run import run_local

COMMAND = [sys.executable, "-m", "modeldrop"]
REGION = ["--stack", "modeldrop-local", "--region", "us-east-1"]
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}).encode()


SHARED_TWO_INSTANCES = ("--adapter-mode", "shared", "--adapters", "3", "--instance-count", "2")


def test_run_local_serves_three_adapters_as_components_of_one_endpoint() -> None:
    """The issue's command, as a user runs it."""
    done = subprocess.run(
        [*COMMAND, "run-local", "--adapter", *SHARED_TWO_INSTANCES, "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded" and result["leftover_resources"] == []
    assert result["invocations"]["CreateEndpointFunction"] == 1  # one endpoint for the three
    # Two instances: the base runs a copy on each (adapters run in the base's copies), with the plan's
    # download and startup timeouts on the base component itself.
    listed = result["components"]["components"]
    assert [c["copies"] for c in listed] == [2, 2, 2, 2], listed
    assert set(listed[0]["startup_parameters"]) == {
        "ModelDataDownloadTimeoutInSeconds",
        "ContainerStartupHealthCheckTimeoutInSeconds",
    }
    record = result["record"]
    plan = record["steps"]["create_endpoint"]["components"]
    endpoint = record["endpoint_name"]
    assert plan["base"] == endpoint and plan["model_name"] == endpoint
    assert [a["adapter"] for a in plan["adapters"]] == ["lora-sample-1", "lora-sample-2", "lora-sample-3"]
    names = [a["component"] for a in plan["adapters"]]
    # The base endpoint sizes its LoRA slots for all three (ranks 8, 16 and 24 -> slots of 32).
    env = record["steps"]["build_env"]["env"]
    assert (env["OPTION_ENABLE_LORA"], env["OPTION_MAX_LORAS"], env["OPTION_MAX_LORA_RANK"]) == ("true", "5", "32")
    # Each adapter evaluated through its own component, and each passed.
    evals = result["eval"]["components"]
    assert [e["component"] for e in evals] == names and all(e["passed"] and e["cases"] == 3 for e in evals)
    shared = result["components"]
    assert sorted(c["name"] for c in shared["components"]) == sorted([endpoint, *names])
    assert all(c["status"] == "InService" for c in shared["components"])
    # One adapter torn down: the other two and the base go on serving, the removed one is refused.
    assert shared["torn_down"] == {"adapter": "lora-sample-1", "deleted": [f"inference-component/{names[0]}"]}
    assert sorted(c["name"] for c in shared["components_after"]) == sorted([endpoint, *names[1:]])
    answers = shared["invoked_after"]
    assert answers[names[0]].startswith("refused: ValidationError")
    assert answers[names[1]].startswith("answered") and answers[names[2]].startswith("answered")
    assert answers[names[1]] != answers[names[2]]  # each through its own adapter
    # Torn down at the end: adapters, then the base, then the endpoint.
    order = [d for d in result["deleted_at_exit"] if d.startswith(("inference-component/", "endpoint/"))]
    components = [f"inference-component/{n}" for n in names[1:]]
    assert order == [*components, f"inference-component/{endpoint}", f"endpoint/{endpoint}"]
    # Each adapter stored once under the base's prefix (the base downloads all of it): its archive only.
    served = [d.split("/modeldrop-served/", 1)[1] for d in result["deleted_at_exit"] if "/modeldrop-served/" in d]
    adapters = sorted(k.split("/", 1)[1] for k in served if "/lora/" in f"/{k.split('/', 1)[1]}")
    assert adapters == [f"lora/lora-sample-{i}.tar.gz" for i in (1, 2, 3)], adapters


def test_a_refused_adapter_component_takes_the_deployment_down_in_order() -> None:
    result = run_local(fault="adapter-load")
    assert result.status == "failed" and result.error == "EndpointFailed", (result.error, result.cause)
    assert "lora-sample-2 Failed" in str(result.cause) and "max_lora_rank" in str(result.cause)
    assert result.leftover_resources == []
    assert result.record is not None
    deleted = result.record.step_dict("teardown")["deleted"]
    kinds = [d.split("/", 1)[0] for d in deleted if not d.startswith("s3://")]
    assert kinds == ["inference-component"] * 3 + ["endpoint", "endpoint-config", "model"]
    assert deleted[2] == f"inference-component/{result.record.endpoint_name}"  # the base after its adapters


def test_a_poll_running_on_after_its_execution_was_stopped_leaves_no_component() -> None:
    result = run_local(fault="abort-mid-attach")
    assert result.status == "aborted" and result.leftover_resources == []
    assert result.record is not None and result.record.status == "aborted"
    deleted = result.record.step_dict("execution_ended")["deleted"]
    endpoint = result.record.endpoint_name
    assert deleted[:2] == [f"inference-component/{endpoint}", f"endpoint/{endpoint}"]


def test_a_base_component_that_runs_out_of_memory_is_diagnosed_from_its_own_logs() -> None:
    result = run_local(fault="oom", adapter=True, adapters=2, request={"adapter_mode": "shared"})
    assert result.status == "failed" and result.error == "EndpointFailed", (result.error, result.cause)
    assert result.leftover_resources == []
    assert result.record is not None
    failure = result.record.step_dict("failure")
    assert failure["diagnosis"] == "the engine ran out of GPU memory while loading", failure
    assert failure["log_group"] == f"/aws/sagemaker/InferenceComponents/{result.record.endpoint_name}"


def test_components_that_take_minutes_to_delete_are_waited_for_within_each_lambdas_timeout() -> None:
    """slow-component-delete: ExecutionEnded (60 s) releases the components, stops waiting before its
    timeout and leaves the endpoint to the reaper, whose runs finish once the components are gone."""
    result = run_local(fault="slow-component-delete")
    assert result.status == "aborted", (result.error, result.cause)
    assert result.leftover_resources == [] and result.lambda_timeouts == []
    assert result.record is not None
    ended = result.record.step_dict("execution_ended")
    assert "waiting for inference-component/" in ended["left_behind"][0]
    assert [r["expired"] for r in result.reaper_runs if r["expired"]] == [[result.record.endpoint_name]]
    assert any(r["retry_next_run"] for r in result.reaper_runs)


def test_a_settle_loop_without_a_time_budget_is_killed_by_the_emulated_lambda(monkeypatch: Any) -> None:
    """The emulator holds every function to its template Timeout on its own clock: waiting on slow
    deletes as if there were no limit is what Lambda would kill (and retry)."""
    from modeldrop.contracts import clock

    monkeypatch.setattr(clock, "time_left", lambda: None)
    result = run_local(fault="slow-component-delete")
    assert "ExecutionEndedFunction" in result.lambda_timeouts
