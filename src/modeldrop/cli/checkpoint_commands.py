"""validate, repair and plan: what a checkpoint is and what serving it needs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from modeldrop.cli._shared import (
    EnvOpt,
    ForceOpt,
    InstanceCountOpt,
    MaxHourlyPriceOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    app,
    aws_errors,
    byte_progress,
    check_region,
    checked_engine_env,
    console,
    engine_options,
    engine_settings,
    fail,
    instance_choice,
    json_mode,
    pairs,
)
from modeldrop.cli.engine_verdicts import Judged, engine_check_off, engine_line, judge_by_engine, require_engine
from modeldrop.cli.plan_view import plan_summary
from modeldrop.contracts.errors import ModeldropError
from modeldrop.contracts.text import printable


def _contract_line(contract: Any) -> str | None:
    if contract is None:
        return None
    eos = f"eos {contract.tokenizer_eos} ({contract.tokenizer_eos_id})" if contract.tokenizer_eos else "no eos"
    return f"{eos}, stops on {contract.stop_ids or '-'}, end of turn {contract.end_of_turn or '-'}"


@app.command("validate")
def validate_cmd(
    sources: Annotated[
        list[str],
        typer.Argument(
            metavar="SOURCE...",
            help="model dir, .tar(.gz), s3://bucket/key.tar.gz or s3://bucket/prefix/ (several: one engine import)",
        ),
    ],
    base: Annotated[
        str | None, typer.Option(help="the base checkpoint: report every tensor of it this one lacks")
    ] = None,
    image: Annotated[
        str | None, typer.Option(help="judge for this serving image's engine and version (default: the stack's)")
    ] = None,
    engine: Annotated[str | None, typer.Option(help="judge for this engine's default image: vllm, sglang, lmi")] = None,
    serving: Annotated[
        str | None,
        typer.Option(help="the version serving now: report what changed in its chat contract (template, EOS)"),
    ] = None,
    engine_check: Annotated[
        bool | None,
        typer.Option(
            "--engine-check/--no-engine-check",
            help="ask the engine's own code (the vLLM venv, on CPU; an archive or S3 source from its headers); "
            "default: on where the engine venv is (MODELDROP_ENGINE_CHECK=Disabled turns the default off)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object (a list of them for several)")] = False,
) -> None:
    """Refuse a checkpoint the engines would fail to load. Exit 0 deployable, 1 refused, 2 unreadable."""
    json_mode(as_json)
    if engine_check:
        require_engine()
    not_judged = None if engine_check else engine_check_off(asked_off=engine_check is False)
    target = judging_target(image, engine)
    entries: list[Judged] = []
    unreadable: dict[str, dict[str, Any]] = {}
    for source in sources:
        try:
            entries.append(_read(source, base, serving, target))
        except ModeldropError as exc:
            if len(sources) == 1:
                _input_error(exc, source, as_json)
            unreadable[source] = {"deployable": False, "source": source, "error": type(exc).__name__,
                                  "message": exc.message, "hint": exc.hint}  # fmt: skip
    reports = iter(judge_by_engine(entries, target, not_judged))
    judged = {e.source: next(reports) for e in entries}
    if len(sources) == 1:
        _one_report(judged[sources[0]], sources[0], as_json)
    if as_json:
        print(json.dumps([unreadable.get(s) or judged[s].model_dump(mode="json") for s in sources], indent=2))
    else:
        for source in sources:
            console.rule(escape(printable(source)), align="left")
            if source in unreadable:
                console.print(f"[red]unreadable[/]: {escape(printable(unreadable[source]['message']))}")
            else:
                _print_report(judged[source])
    refused = any(not r.deployable for r in judged.values())
    raise typer.Exit(2 if unreadable else 1 if refused else 0)


def _read(source: str, base: str | None, serving: str | None, target: Any) -> Judged:
    from modeldrop.checkpoint.chat.chat_contract import drift_finding
    from modeldrop.checkpoint.validation import validate_source, validate_with_scans

    with aws_errors(domain_errors=False), byte_progress("validating"):
        report, _base_report, scan, base_scan = validate_with_scans(source, base, target=target)
        if serving is not None:
            drift = drift_finding(validate_source(serving).chat_contract, report.chat_contract)
            report.findings += [drift] if drift else []
    return Judged(source, report, scan, base, base_scan)


def _one_report(report: Any, source: str, as_json: bool) -> NoReturn:
    codes = {f.code for f in report.findings}
    if not as_json and {"CONFIG_MISSING", "NO_SAFETENSORS"} <= codes:
        # Nothing of a model at all: one line, not ten findings about what is missing.
        fail(f"{printable(str(source))}: not a checkpoint (no config.json and no *.safetensors weights)",
             "point at the folder save_pretrained wrote (config.json and the *.safetensors shards at its root)",
             code=1, error="NotACheckpoint")  # fmt: skip
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        _print_report(report)
    raise typer.Exit(0 if report.deployable else 1)


def _print_report(report: Any) -> None:
    table = Table(show_header=False, box=None)
    for label, value in (
        ("source", report.source),
        ("format", report.format),
        ("architecture", report.architecture),
        ("model_type", report.model_type),
        ("tensors", report.tensor_count),
        ("shards", report.shard_count),
        ("parameters", f"{report.parameters:,}"),
        ("weights", f"{report.weights_gib:.3f} GiB"),
        ("dtypes", ", ".join(report.dtypes)),
        ("tokenizer / chat template", f"{report.has_tokenizer} / {report.has_chat_template}"),
        ("chat contract", _contract_line(report.chat_contract)),
        ("judged for", report.judged_for),
        ("engine", engine_line(report.engine_check)),
    ):
        table.add_row(label, escape(printable("-" if value is None else str(value))))
    if report.kv_shared.num_kv_shared_layers:
        kv = report.kv_shared
        table.add_row("KV-shared tensors", f"{kv.expected_tensors - len(kv.missing)} of {kv.expected_tensors}")
    if report.adapter is not None:
        a = report.adapter
        described = f"{a.peft_type} r={a.r} alpha={a.lora_alpha}, {a.modules} modules, on {a.base or 'no base'}"
        table.add_row("LoRA adapter", escape(printable(described)))
    if report.base is not None:
        table.add_row("vs base", f"{len(report.base.missing)} of {report.base.base_tensor_count} base tensors missing")
    console.print(table)
    for f in report.findings:
        colour = {"error": "red", "warning": "yellow"}.get(f.severity, "dim")
        # Names in messages come from the artifact: shown literally, never read as markup.
        detail = escape(printable(f.message)) + "\n  fix: " + escape(printable(f.hint))
        console.print(f"[{colour}]{f.severity.upper()} {f.code}[/]: {detail}")
    console.print("[green]deployable[/]" if report.deployable else "[red]refused[/]")


def _input_error(exc: ModeldropError, source: str, as_json: bool) -> NoReturn:
    if as_json:
        print(
            json.dumps(
                {
                    "deployable": False,
                    "source": source,
                    "error": type(exc).__name__,
                    "message": exc.message,
                    "hint": exc.hint,
                }
            )
        )
        raise typer.Exit(2)
    fail(exc.message, exc.hint)


@app.command("repair")
def repair_cmd(
    source: Annotated[str, typer.Argument(help="the fine-tuned checkpoint (dir, .tar(.gz), s3:// key or prefix)")],
    out: Annotated[str, typer.Option(help="where the repaired copy goes: same shape as SOURCE, never SOURCE")],
    base: Annotated[str | None, typer.Option(help="the base checkpoint to restore missing tensors from")] = None,
    drop_stale_quantization: Annotated[
        bool,
        typer.Option(
            "--drop-stale-quantization",
            help="drop config.json's quantization_config when validate finds it stale (QUANT_CONFIG_STALE: dense "
            "weights after a merge or dequantization)",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Copy the tensors SOURCE lacks from BASE into an extra shard and index, and/or drop a stale
    quantization_config. Exit 0 repaired and deployable."""
    json_mode(as_json)
    from modeldrop.checkpoint.repair import repair

    try:
        with aws_errors(domain_errors=False), byte_progress("reading and repairing"):
            result = repair(source, base, out, drop_stale_quantization=drop_stale_quantization)
            result.report = _repaired_verdict(result)
    except ModeldropError as exc:
        _input_error(exc, source, as_json)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        if result.dropped_quantization_config is not None:
            method = result.dropped_quantization_config.get("quant_method", "?")
            console.print(f"dropped config.json's stale quantization_config (quant_method {escape(str(method))})")
        if result.shard:
            console.print(
                f"restored {len(result.restored)} tensors ({result.restored_bytes:,} bytes) into {result.shard}"
            )
        for name in result.restored[:10]:
            console.print("  " + escape(printable(name)))
        if len(result.restored) > 10:
            console.print(f"  ... and {len(result.restored) - 10} more")
        verdict = "[green]deployable[/]" if result.report.deployable else "[red]still refused[/]"
        console.print(f"{result.out}: {verdict}")
        for f in result.report.findings:
            if f.severity == "error":
                console.print(f"[red]ERROR {f.code}[/]: " + escape(printable(f.message)))
    raise typer.Exit(0 if result.report.deployable else 1)


def _repaired_verdict(result: Any) -> Any:
    """The repaired copy judged as validate judges it (the engine too, where it is), so repair never says
    deployable of what validate refuses a second later: an archive or S3 output from the scan repair made
    of it, a folder as it is."""
    scan = None if Path(result.out).is_dir() else result.scan
    return judge_by_engine([Judged(result.out, result.report, scan)], None, engine_check_off(asked_off=False))[0]


def _with_adapter(source: str, base: str) -> Any:
    """BASE's summary for the plan, with the adapter SOURCE validated against it (each read once); a
    refused adapter exits 1, under the name the pipeline would give it."""
    from modeldrop.checkpoint.adapter_validation import adapter_info
    from modeldrop.checkpoint.validation import validate_with_base
    from modeldrop.contracts.served import adapter_name

    with aws_errors(), byte_progress("validating the adapter and its base"):
        adapter, base_report = validate_with_base(source, base)
    if adapter.adapter is None or base_report is None:
        fail(f"{source} is not a LoRA adapter (no adapter_config.json): plan it without --base")
    if not adapter.deployable:
        first = next(f for f in adapter.findings if f.severity == "error")
        fail(f"the adapter is refused: {first.code}: {first.message}", first.hint, code=1, error="AdapterRefused")
    summary = base_report.summary()
    summary.adapter = adapter_info(adapter, adapter_name(source), None, None)
    return summary


@app.command("plan")
@engine_options
def plan_cmd(
    source: Annotated[str, typer.Argument(help="model dir, .tar(.gz), s3://bucket/key.tar.gz or s3://bucket/prefix/")],
    engine: Annotated[str, typer.Option(help="vllm | sglang | lmi")] = "vllm",
    region: Annotated[str | None, typer.Option(help="the endpoint's region (default: AWS_REGION)")] = None,
    instance_type: Annotated[
        str,
        typer.Option(help="SageMaker instance type; a comma list (tried in order) or 'auto' shows the fallback list"),
    ] = "ml.g6.2xlarge",
    max_hourly_price: MaxHourlyPriceOpt = None,
    instance_count: InstanceCountOpt = 1,
    max_model_len: MaxModelLenOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    env: EnvOpt = None,
    force: ForceOpt = False,
    base: Annotated[
        str | None, typer.Option(help="SOURCE is a LoRA adapter: plan serving it on this base checkpoint")
    ] = None,
    idle: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="plan a channel that scales to zero after DURATION without a call (10m, 1h): whether the region "
            "allows it, how long a wake-up takes, what a day costs",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    named_settings: dict[str, Any] | None = None,  # the engine_options, filled by its decorator
) -> None:
    """The image, container env, timeouts and GPU memory plan for a checkpoint (or an adapter on its
    base). Exit 0 fits, 1 refused."""
    json_mode(as_json)
    idle_seconds = _idle_seconds(idle)

    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan
    from modeldrop.serving.plan import plan_report

    if engine not in ("vllm", "sglang", "lmi"):
        fail(f"unknown --engine {engine!r}; choose vllm, sglang or lmi")
    choice = instance_choice(instance_type)  # every type it names is checked there
    listed = choice.get("instance_types")
    first = choice.get("instance_type") or "ml.g6.2xlarge"
    if listed is None and max_hourly_price is not None:
        listed = [first]
    passthrough = pairs("--env", env)
    named = engine_settings(named_settings or {})
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        fail("no region: pass --region or set AWS_REGION", error="NoRegion")
    check_region(region)
    from modeldrop.contracts.models import EngineSettings
    from modeldrop.serving.engine_options import resolved_version

    target = resolved_version(engine, region, os.environ)  # type: ignore[arg-type]
    checked_engine_env(engine, target, passthrough)
    if base is not None:
        summary = _with_adapter(source, base)
    else:
        with aws_errors(), byte_progress("validating"):
            summary = validate_scan(scan_source(source), target=target).summary()
    report = plan_report(
        summary,
        source,
        engine,  # type: ignore[arg-type]
        region,
        first,
        os.environ,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        passthrough=passthrough,
        force=force,
        instance_types=["auto"] if listed == "auto" else listed,
        max_hourly_price=max_hourly_price,
        instance_count=instance_count,
        settings=EngineSettings.model_validate(named),
    )
    if idle_seconds is not None:
        report.idle = _idle_plan(report, idle_seconds)
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        plan_summary(report)
    raise typer.Exit(0 if report.deployable else 1)


def _idle_seconds(idle: str | None) -> int | None:
    from modeldrop.contracts.channel import parse_idle

    if idle is None:
        return None
    try:
        return parse_idle(idle)
    except ValueError as exc:
        fail(f"--idle {exc}")


def _idle_plan(report: Any, after_seconds: int) -> dict[str, Any]:
    """What a channel of this plan would do when idle (the stack may add regions: NoScaleToZeroRegions)."""
    from modeldrop.serving.idle_plan import decide

    startup = int(report.timeouts.get("model_data_download_seconds", 0)) + int(
        report.timeouts.get("container_startup_health_check_seconds", 0)
    )
    decision = decide(after_seconds, report.region, report.instance_type, report.instance_count,
                      report.hourly_price, startup)  # fmt: skip
    return {**decision.model_dump(mode="json"), "always_on_day_usd": decision.always_on_day_cost()}


def judging_target(image: str | None, engine: str | None) -> Any:
    """The engine version a checkpoint is judged for: IMAGE's (its repository names the engine), ENGINE's
    default image, or None (the stack's default image, which the report then names)."""
    from modeldrop.serving.engine_options import engine_version

    if engine is not None and engine not in ("vllm", "sglang", "lmi"):
        fail(f"unknown --engine {engine!r}; choose vllm, sglang or lmi")
    if image is None:
        return engine_version(engine) if engine else None  # type: ignore[arg-type]
    repository = image.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    by_repo = {"vllm": "vllm", "sglang": "sglang", "djl-inference": "lmi"}
    named = engine or by_repo.get(repository)
    if named is None or ":" not in image.rsplit("/", 1)[-1]:
        fail(
            f"--image {image[:200]!r}: cannot tell its engine (a DLC repository is vllm, sglang or djl-inference)",
            "pass --engine too, or a registry/repository:tag URI",
        )
    return engine_version(named, image)  # type: ignore[arg-type]
