"""One deployment end to end on this machine: the real ASL and handlers over moto."""

from __future__ import annotations

import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modeldrop.aws.execution_watch import StateRun, outcome, watch
from modeldrop.contracts.errors import cause_message
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
from modeldrop.local.engines.launch import ENGINE_NOTES
from modeldrop.local.scenarios import inputs as run_inputs
from modeldrop.local.scenarios import interrupts
from modeldrop.local.scenarios.account_faults import (
    ABORT_FAULTS,
    SHARED_FAULTS,
    arm_faults,
    hold_secrets,
    reap_until_clean,
)
from modeldrop.local.scenarios.channel import CHANNEL_FAULTS, channel_parameters, run_channel
from modeldrop.local.scenarios.idle_channel import IDLE_FAULTS, run_idle_channel
from modeldrop.local.scenarios.inputs import upload_config
from modeldrop.local.scenarios.shared import shared_check
from modeldrop.local.stack.emulated import TIMED_OUT
from modeldrop.local.stack.hermetic import hermetic_aws


class RunResult(BaseModel):
    status: str
    error: str | None = None
    cause: str | None = None
    deployment_id: str | None = None
    execution_name: str | None = None
    states: list[StateRun] = Field(default_factory=list)
    output: dict[str, Any] | None = None
    record: DeploymentRecord | None = None
    eval: dict[str, Any] | None = None
    eval_report: dict[str, Any] | None = None
    leftover_resources: list[str] = Field(default_factory=list)
    # adapter_mode shared: the endpoint's components, and one adapter torn down while the others serve.
    components: dict[str, Any] | None = None
    # What run-local itself deleted after a success (the emulated account ends with the run).
    deleted_at_exit: list[str] = Field(default_factory=list)
    # Local copies of the reports, which lived in the emulated bucket: kind -> file path.
    local_reports: dict[str, str] = Field(default_factory=dict)
    # After an abort fault: the same artifact version deployed again (its claim passed on).
    redeploy: dict[str, Any] | None = None
    # The starter's failed events, as its on-failure queue holds them (Lambda's destination records).
    starter_failures: list[dict[str, Any]] = Field(default_factory=list)
    # How many times each function ran (a prefix's copy: one CopyShard per object, the Map's iterations).
    invocations: dict[str, int] = Field(default_factory=dict)
    # Functions that ran past their template Timeout on the emulator's clock (Lambda would kill them).
    lambda_timeouts: list[str] = Field(default_factory=list)
    # After slow-component-delete: the scheduled reaper's runs that finished the teardown.
    reaper_runs: list[dict[str, Any]] = Field(default_factory=list)
    # run-local --channel: the channel's steps, its history (with the gate's per-case deltas) and its close.
    channel: dict[str, Any] | None = None
    note: str = ""
    engine: str = "reference"
    fault: str = "none"
    seconds: float = 0.0


def run_local(
    artifact: Path | None = None,
    fault: str = "none",
    on_state: Callable[[StateRun], None] | None = None,
    engine: str = "reference",
    deploy_engine: str | None = None,
    request: dict[str, Any] | None = None,
    key: str | None = None,
    prefix: bool = False,
    adapter: bool = False,
    adapters: int = 1,
    channel: str | None = None,
    engine_check: bool = False,
    idle: str | None = None,
) -> RunResult:
    """Deploy ARTIFACT (or a generated sample) through the real ASL and handlers on this machine.

    Without REQUEST fields the archive is dropped into the bucket and the S3 starter starts the
    deployment; with them (instance types, quota wait, ...) it is uploaded under direct/ and started
    with that request, as a pipeline calling StartExecution would. With PREFIX the checkpoint
    directory is uploaded as an S3 prefix, its modeldrop.json marker last. With ADAPTER a generated
    LoRA adapter for the checkpoint is deployed on it (the checkpoint is its base); ADAPTERS of them
    in shared mode (adapter inference components on one endpoint). The shell's AWS settings are set
    aside for the run: nothing reaches a real account or another endpoint. ENGINE_CHECK runs the
    EngineCheck step with the project's engine venv (vLLM judges the served copy before CreateEndpoint);
    without it the step says the stack's check is disabled."""
    named = {f.strip() for f in fault.split(",")}
    if channel is None and named & (CHANNEL_FAULTS | IDLE_FAULTS):
        channel = "demo"  # a channel's fault plays out on a channel
    if idle is None and named & IDLE_FAULTS:
        idle = "10m"
    if "engine-check-oom" in named:
        engine_check = True  # the fault is the check's own death
    with hermetic_aws():
        return _run_local(
            artifact, fault, on_state, engine, deploy_engine, request, key, prefix, adapter, adapters, channel,
            engine_check, idle,
        )  # fmt: skip


def _parameters(deploy_engine: str | None, faults: frozenset[str], engine_check: bool) -> dict[str, str]:
    return {**channel_parameters(deploy_engine, faults), "EngineCheck": "Enabled" if engine_check else "Disabled"}


def _run_local(
    artifact: Path | None,
    fault: str,
    on_state: Callable[[StateRun], None] | None,
    engine: str,
    deploy_engine: str | None,
    request: dict[str, Any] | None,
    key: str | None,
    prefix: bool,
    adapter: bool,
    adapters: int,
    channel: str | None = None,
    engine_check: bool = False,
    idle: str | None = None,
) -> RunResult:
    from moto import mock_aws

    from modeldrop.contracts import clock
    from modeldrop.local.stack.build import build_stack

    if deploy_engine is None and engine in ("vllm", "sglang"):
        deploy_engine = engine
    started = time.monotonic()
    clock.reset()
    hosting = LocalHosting(engine=engine, fault=fault)
    try:
        with (
            tempfile.TemporaryDirectory(prefix="modeldrop-") as tmp,
            mock_aws(config={"stepfunctions": {"execute_state_machine": True}}),
        ):
            faults = hosting.faults  # --fault takes several, separated by commas
            stack = build_stack(parameters=_parameters(deploy_engine, faults, engine_check), hosting=hosting)
            arm_faults(stack, faults, request)
            if faults & SHARED_FAULTS:  # shared, with a second adapter component
                adapter, adapters = True, max(adapters, 2)
                request = {**(request or {}), "adapter_mode": "shared"}
            prefix = prefix or "kill-mid-copy" in faults
            hold_secrets(stack, (request or {}).get("secrets") or {})
            cpu = engine == "vllm" and artifact is None  # the real engine on a CPU: a model it can serve
            if cpu:
                from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint

                artifact = write_cpu_checkpoint(Path(tmp) / "cpu-llama")
            try:
                if adapter:
                    generated = run_inputs.adapter_request(stack, artifact, Path(tmp), adapters, cpu=cpu)
                    request = {**(request or {}), **generated}
                result = (
                    _channel_day(stack, channel, Path(tmp), faults, on_state, artifact, idle)
                    if channel
                    else _deploy(stack, artifact, Path(tmp), on_state, request, key, prefix, faults)
                )
                _after_deploy(stack, result, faults, on_state)
                interrupts.raise_if_interrupted()  # a signal whose exception a finalizer swallowed
            except BaseException:
                with interrupts.deferred():
                    stack.abort()
                raise
            finally:
                with interrupts.deferred():
                    stack.close()
    except interrupts.Interrupted as exc:
        with interrupts.deferred():
            hosting.stop_all()
            exc.still_running = hosting.running()
        raise
    finally:
        with interrupts.deferred():
            hosting.stop_all()
    result.engine, result.fault, result.note = engine, fault, ENGINE_NOTES[engine]
    result.seconds = round(time.monotonic() - started, 2)
    return result


def _channel_day(
    stack: Any,
    channel: str,
    workdir: Path,
    faults: frozenset[str],
    on_state: Callable[[StateRun], None] | None,
    artifact: Path | None,
    idle: str | None = None,
) -> RunResult:
    if idle is not None:
        result, summary = run_idle_channel(stack, channel, idle, workdir, _deploy, on_state, artifact, faults)
    else:
        result, summary = run_channel(stack, channel, workdir, _deploy, faults, on_state, artifact)
    result.channel, result.leftover_resources = summary, stack.leftover_resources()
    failed = summary.get("error") or (summary.get("adapter_channel") or {}).get("error")
    if failed and result.status == "succeeded":  # a step of the day failed: the day did, whatever went before
        result.status, result.error, result.cause = "failed", "ChannelDayFailed", str(failed)
    return result


def _after_deploy(
    stack: Any, result: RunResult, faults: frozenset[str], on_state: Callable[[StateRun], None] | None
) -> None:
    """What follows a run: its invocations, the reaper's runs (slow-component-delete), the Lambdas
    that ran past their timeout, and after an abort fault the same artifact deployed again."""
    result.invocations = dict(sorted(Counter(i.function for i in stack.invocations).items()))
    if "slow-component-delete" in faults:
        result.reaper_runs = reap_until_clean(stack)
        result.leftover_resources = stack.leftover_resources()
    result.lambda_timeouts = [i.function for i in stack.invocations if i.error == TIMED_OUT]
    if faults & ABORT_FAULTS and result.record is not None and result.record.artifact_uri:
        result.redeploy = _redeploy(stack, str(result.record.artifact_uri), on_state)
        result.leftover_resources = stack.leftover_resources()


def _upload(
    stack: Any,
    artifact: Path | None,
    workdir: Path,
    request: dict[str, Any] | None,
    key: str | None,
    prefix: bool,
    faults: frozenset[str] | set[str],
) -> tuple[str, Path]:
    """Put the artifact into the emulated bucket (a prefix with its marker, or an archive) under
    direct/ when the run starts the execution itself; returns its key and what was uploaded."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    if prefix:
        key = f"{'direct/' if request else ''}local/{stamp}/model/"
        packed = run_inputs.upload_prefix(stack, artifact, workdir, key, with_marker=not request, faults=faults)
    else:
        key = f"{'direct/' if request else ''}{key or f'local/{stamp}/model.tar.gz'}"
        packed = run_inputs.artifact_file(artifact, workdir)
        from modeldrop.contracts import progress

        stack.client("s3").upload_file(
            str(packed), stack.bucket, key, Callback=progress.counter(packed.stat().st_size), Config=upload_config()
        )
    return key, packed


def _deploy(
    stack: Any,
    artifact: Path | None,
    workdir: Path,
    on_state: Callable[[StateRun], None] | None,
    request: dict[str, Any] | None = None,
    key: str | None = None,
    prefix: bool = False,
    faults: frozenset[str] | set[str] = frozenset(),
    keep: bool = False,
) -> RunResult:
    from modeldrop.contracts.models import deployment_id_of

    key, packed = _upload(stack, artifact, workdir, request, key, prefix, faults)
    sfn = stack.client("stepfunctions")
    if request:  # under direct/ the starter ignores the upload: start it as a pipeline would
        uri = f"s3://{stack.bucket}/{key}"
        fields = {k: v for k, v in request.items() if k != "adapter_uri"}
        # An adapter deployment: the adapter is the artifact, the uploaded checkpoint its base.
        start = {"artifact_uri": request.get("adapter_uri", uri)}
        if "adapter_uri" in request and "base_endpoint" not in request:
            start["base"] = uri  # attached to a running base (base_endpoint), an adapter names none
        name = f"local-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
        sfn.start_execution(stateMachineArn=stack.state_machine_arn, name=name, input=json.dumps({**start, **fields}))
    executions = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    if not executions:
        failed = stack.failed_events("StarterFunction")
        cause = "the S3 event started no execution"
        if failed:
            error = failed[0]["responsePayload"]
            cause += f"; the starter failed ({error.get('errorType')}: {error.get('errorMessage')}) and, after "
            cause += f"{failed[0]['requestContext']['approximateInvokeCount']} tries, its event is in the failure queue"
        return RunResult(
            status="not-started",
            error="NoExecution",
            cause=cause,
            starter_failures=failed,
            leftover_resources=stack.leftover_resources(),
        )
    # Real time: the virtual clock makes waits instant, so only process starts and answers take long.
    # The emulated S3 copies, validates, downloads and extracts the artifact at ~10 MB/s at worst.
    limit = 120 + stack.hosting.real_startup_grace + packed.stat().st_size / 10e6
    try:
        desc, states = watch(
            sfn,
            executions[0]["executionArn"],
            on_state,
            poll_seconds=0.02,
            timeout_seconds=limit,
            on_poll=interrupts.raise_if_interrupted,
        )
    except TimeoutError as exc:
        return RunResult(status="failed", error="LocalRunTimeout", cause=str(exc))
    stack.settle()  # what the execution's end set off (the ExecutionEnded rule) has finished
    deployment_id = deployment_id_of(desc)
    # The emulator ends with this run: a live endpoint is deleted as `modeldrop teardown` does, so
    # that the leftover check below is a real one for a success too.
    shared = shared_check(stack, deployment_id) if desc["status"] == "SUCCEEDED" and not keep else None
    cleanup = _teardown_at_exit(stack, deployment_id) if desc["status"] == "SUCCEEDED" and not keep else []
    record = stack.registry().get(deployment_id)
    output = json.loads(desc["output"]) if desc.get("output") else None
    status, error = outcome(desc)
    kept = _keep_reports(stack, record, deployment_id)
    return RunResult(
        status=status,
        error=error,
        cause=cause_message(desc.get("cause")),
        deployment_id=deployment_id,
        execution_name=desc["name"],
        states=states,
        output=output,
        record=record,
        eval=(output or {}).get("eval") or (record.step("smoke_eval") if record else None),
        eval_report=json.loads(Path(kept["eval"]).read_text()) if "eval" in kept else None,
        leftover_resources=stack.leftover_resources(),
        deleted_at_exit=cleanup,
        local_reports=kept,
        components=shared,
    )


def _teardown_at_exit(stack: Any, deployment_id: str) -> list[str]:
    """The state machine's own teardown loop, without its waits; returns what every pass deleted."""
    record = stack.registry().get(deployment_id)
    if record is None:
        return []
    request = record.request or {}
    event = {
        "deployment_id": deployment_id,
        "resource_name": request.get("resource_name") or record.endpoint_name or "",
        "endpoint_name": record.endpoint_name,
        "artifact_uri": str(record.artifact_uri) if record.artifact_uri else None,
        "attempt": int(record.step_dict("create_endpoint").get("attempt") or 0),
        "deadline_at": None,
    }
    deleted: list[str] = []
    for _ in range(400):
        done = stack.invoke_function("TeardownFunction", event)
        event["deadline_at"] = done.get("deadline_at")
        deleted = list(done.get("deleted", []))  # every pass so far, in order
        if done.get("done") or done.get("gave_up"):
            break
        # As the state machine's WaitForTeardown does: a stranded endpoint goes once SageMaker has
        # given up on it, a virtual hour later at most.
        from modeldrop.contracts import clock

        clock.advance(max(int(done.get("wait_seconds") or 15), 60))
    return deleted


def _redeploy(stack: Any, artifact_uri: str, on_state: Callable[[StateRun], None] | None) -> dict[str, Any]:
    """The same artifact version deployed again after an abort: its claim passed on with the abort."""
    from modeldrop.contracts.models import deployment_id_of

    sfn = stack.client("stepfunctions")
    arn = sfn.start_execution(
        stateMachineArn=stack.state_machine_arn,
        name=f"redeploy-{datetime.now().strftime('%Y%m%d-%H%M%S')}",
        input=json.dumps({"artifact_uri": artifact_uri}),
    )["executionArn"]
    try:
        desc, _states = watch(sfn, arn, on_state, poll_seconds=0.02, timeout_seconds=300)
    except TimeoutError as exc:
        return {"status": "failed", "error": "LocalRunTimeout", "cause": str(exc)}
    stack.settle()
    deployment_id = deployment_id_of(desc)
    cleanup = _teardown_at_exit(stack, deployment_id) if desc["status"] == "SUCCEEDED" else []
    return {
        "status": "succeeded" if desc["status"] == "SUCCEEDED" else desc["status"].lower(),
        "deployment_id": deployment_id,
        "error": desc.get("error"),
        "cause": cause_message(desc.get("cause")),
        "deleted_at_exit": cleanup,
    }


REPORTS_DIR = Path(tempfile.gettempdir()) / "modeldrop-run-local"
KEPT_RUNS = 20


def _prune_reports(root: Path) -> None:
    import shutil

    folders = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in folders[KEPT_RUNS - 1 :]:
        shutil.rmtree(old, ignore_errors=True)


def _keep_reports(stack: Any, record: DeploymentRecord | None, deployment_id: str) -> dict[str, str]:
    """Copy the validation and eval reports out of the emulated bucket before it goes."""
    from modeldrop.contracts.s3uri import parse_s3_uri

    if record is None:
        return {}
    uris = {
        "validation": record.validation_report_uri,
        "eval": record.eval_report_uri,
        "eval_markdown": record.step_dict("smoke_eval").get("report_markdown_uri"),
    }
    kept: dict[str, str] = {}
    s3 = stack.client("s3")
    folder: Path | None = None
    for kind, uri in uris.items():
        if not uri:
            continue
        loc = parse_s3_uri(str(uri))
        if folder is None:
            # A folder of this run's own: two runs started in the same second get the same
            # deployment id (each in its own emulator), and must not overwrite each other's reports.
            REPORTS_DIR.mkdir(parents=True, exist_ok=True)
            _prune_reports(REPORTS_DIR)
            folder = Path(tempfile.mkdtemp(prefix=f"{deployment_id}-", dir=REPORTS_DIR))
        dest = folder / loc.key.rsplit("/", 1)[-1]
        try:
            s3.download_file(loc.bucket, loc.key, str(dest))
        except Exception:  # a report that was never written (the run failed first): nothing to keep
            continue
        kept[kind] = str(dest)
    return kept
