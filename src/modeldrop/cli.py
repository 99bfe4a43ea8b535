"""The modeldrop command line (needs the `cli` extra; the Lambda bundle never imports this)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

try:
    import typer
    from rich.console import Console
    from rich.table import Table
except ImportError:  # pragma: no cover - only without the cli extra
    sys.stderr.write("modeldrop's command line needs its extra: pip install 'modeldrop[cli,local]'\n")
    raise SystemExit(2) from None

from modeldrop.errors import ModeldropError

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Ship a fine-tuned LLM to SageMaker, or leave nothing behind."
)
# Piped output gets room for the tables instead of rich's 80-column default.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


@app.command("run-local")
def run_local_cmd(
    artifact: Annotated[
        Path | None, typer.Argument(help="model dir, .tar or .tar.gz; default: a generated sample")
    ] = None,
    engine: Annotated[
        str, typer.Option(help="local server behind the endpoint: reference (built in) | vllm | sglang")
    ] = "reference",
    deploy_engine: Annotated[
        str | None, typer.Option(help="the deployment's engine: vllm | sglang | lmi (default: the stack's)")
    ] = None,
    fault: Annotated[str, typer.Option(help="none|oom|capacity|slow-start|truncate|throttle|stream-break")] = "none",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run one deployment end to end on this machine: no AWS account needed."""
    from modeldrop.local.engines import LOCAL_ENGINES, EngineUnavailable, check_available
    from modeldrop.local.run import FAULTS, run_local

    if fault not in FAULTS:
        _fail(f"unknown --fault {fault!r}; choose from {', '.join(FAULTS)}")
    if engine not in LOCAL_ENGINES:
        _fail(f"unknown --engine {engine!r}; choose from {', '.join(LOCAL_ENGINES)}")
    if deploy_engine not in (None, "vllm", "sglang", "lmi"):
        _fail(f"unknown --deploy-engine {deploy_engine!r}; choose vllm, sglang or lmi")
    if engine != "reference" and deploy_engine not in (None, engine):
        _fail(f"--engine {engine} serves only a {engine} deployment, not --deploy-engine {deploy_engine}")
    if artifact is not None and not artifact.exists():
        _fail(f"{artifact}: no such file or directory")
    try:
        check_available(engine)
    except EngineUnavailable as exc:
        _fail(str(exc))
    if not as_json:
        console.print(
            "[bold]modeldrop run-local[/]: the real state machine and handlers over an in-process AWS emulator, "
            f"endpoints served by local {engine} processes"
        )
        console.print("  S3 put -> EventBridge -> starter -> Step Functions (moto)")

    def show(state: Any) -> None:
        if not as_json:
            mark = "[green]ok[/]" if state.outcome == "ok" else f"[red]{state.outcome}[/]"
            console.print(f"  {state.name:<22} {mark:<28} {state.seconds:6.2f}s")

    try:
        result = run_local(artifact, fault=fault, on_state=show, engine=engine, deploy_engine=deploy_engine)
    except KeyboardInterrupt:
        err.print("interrupted: local endpoint processes stopped")
        raise typer.Exit(130) from None
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        _summary(result)
    raise typer.Exit(0 if result.status == "succeeded" else 1)


def _fail(message: str, hint: str | None = None, code: int = 2) -> NoReturn:
    err.print(f"error: {message}" + (f"\n  fix: {hint}" if hint else ""))
    raise typer.Exit(code)


def _summary(result: Any) -> None:
    rec = result.record
    out = result.output or {}
    table = Table(show_header=False, box=None)
    table.add_row("deployment", str(result.deployment_id))
    table.add_row("endpoint", str(rec.get("endpoint_name")))
    table.add_row("image", str(out.get("image") or rec.get("image_uri")))
    env = out.get("env") or (rec.get("steps", {}).get("build_env") or {}).get("env") or {}
    table.add_row("env", "\n".join(f"{k}={v}" for k, v in sorted(env.items())) or "-")
    memory = out.get("memory") or (rec.get("steps", {}).get("build_env") or {}).get("memory") or {}
    if memory:
        table.add_row(
            "memory plan",
            (
                f"{memory.get('verdict')}: weights {memory.get('weights_gib')} GiB, "
                f"KV {memory.get('kv_cache_gib')} GiB, headroom {memory.get('headroom_gib')} GiB "
                f"on {memory.get('instance_type')}"
            ),
        )
    ev = result.eval or {}
    if ev:
        table.add_row("eval", f"{'passed' if ev.get('passed') else 'FAILED'}: {ev.get('summary')}")
        table.add_row("eval report", str(ev.get("report_markdown_uri")))
    teardown = rec.get("steps", {}).get("teardown")
    if teardown:
        table.add_row("deleted", ", ".join(teardown.get("deleted", [])) or "nothing was created")
    console.print(table)
    if result.eval_report:
        from modeldrop.smoke_eval import EvalReport

        _eval_table(EvalReport.model_validate(result.eval_report))
    failure = rec.get("steps", {}).get("failure") or {}
    if failure.get("diagnosis"):
        console.print(f"[yellow]diagnosis from the endpoint's logs[/]: {failure['diagnosis']}; fix: {failure['hint']}")
        for line in failure.get("log_excerpt", [])[-3:]:
            console.print(f"  [dim]{line}[/]")
    console.print(f"[dim]note: {result.note}[/]")
    if result.status == "succeeded":
        console.print(
            f"[bold green]SUCCESS[/] deployment {result.deployment_id} is InService and passed its smoke eval "
            f"({result.seconds}s)"
        )
    else:
        console.print(f"[bold red]FAILED[/] {result.error}: {result.cause}")
        left = result.leftover_resources
        console.print("  leftover resources: " + (", ".join(left) if left else "none (everything was deleted)"))


@app.command("validate")
def validate_cmd(
    source: Annotated[str, typer.Argument(help="model dir, .tar(.gz), s3://bucket/key.tar.gz or s3://bucket/prefix/")],
    base: Annotated[
        str | None, typer.Option(help="the base checkpoint: report every tensor of it this one lacks")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Refuse a checkpoint the engines would fail to load. Exit 0 deployable, 1 refused, 2 unreadable."""
    from modeldrop.artifact_scan import scan_source
    from modeldrop.checkpoint import validate_scan

    try:
        report = validate_scan(scan_source(source), scan_source(base) if base else None)
    except ModeldropError as exc:
        _input_error(exc, source, as_json)
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
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
        ):
            table.add_row(label, str(value))
        if report.kv_shared.num_kv_shared_layers:
            kv = report.kv_shared
            table.add_row("KV-shared tensors", f"{kv.expected_tensors - len(kv.missing)} of {kv.expected_tensors}")
        if report.base is not None:
            table.add_row(
                "vs base", f"{len(report.base.missing)} of {report.base.base_tensor_count} base tensors missing"
            )
        console.print(table)
        for f in report.findings:
            colour = {"error": "red", "warning": "yellow"}.get(f.severity, "dim")
            console.print(f"[{colour}]{f.severity.upper()} {f.code}[/]: {f.message}\n  fix: {f.hint}")
        console.print("[green]deployable[/]" if report.deployable else "[red]refused[/]")
    raise typer.Exit(0 if report.deployable else 1)


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
    _fail(exc.message, exc.hint)


@app.command("repair")
def repair_cmd(
    source: Annotated[str, typer.Argument(help="the fine-tuned checkpoint (dir, .tar(.gz), s3:// key or prefix)")],
    base: Annotated[str, typer.Option(help="the base checkpoint to restore missing tensors from")],
    out: Annotated[str, typer.Option(help="where the repaired copy goes: same shape as SOURCE, never SOURCE")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Copy the tensors SOURCE lacks from BASE into an extra shard and index. Exit 0 repaired and deployable."""
    from modeldrop.repair import repair

    try:
        result = repair(source, base, out)
    except ModeldropError as exc:
        _input_error(exc, source, as_json)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        console.print(f"restored {len(result.restored)} tensors ({result.restored_bytes:,} bytes) into {result.shard}")
        for name in result.restored[:10]:
            console.print(f"  {name}")
        if len(result.restored) > 10:
            console.print(f"  ... and {len(result.restored) - 10} more")
        verdict = "[green]deployable[/]" if result.report.deployable else "[red]still refused[/]"
        console.print(f"{result.out}: {verdict}")
        for f in result.report.findings:
            if f.severity == "error":
                console.print(f"[red]ERROR {f.code}[/]: {f.message}")
    raise typer.Exit(0 if result.report.deployable else 1)


def _eval_table(report: Any) -> None:
    table = Table(title=f"smoke eval on {report.endpoint_name} (max_model_len {report.max_model_len})")
    for col in ("case", "outcome", "finish", "tokens", "max_tokens", "TTFT s", "latency s", "tok/s", "detail"):
        table.add_column(col)
    for c in report.cases:
        colour = "green" if c.outcome == "pass" else "red"
        table.add_row(
            c.id,
            f"[{colour}]{c.outcome}[/]",
            c.finish_reason or "-",
            str(c.completion_tokens if c.completion_tokens is not None else "-"),
            f"{c.max_tokens if c.max_tokens is not None else '-'} ({c.max_tokens_source})",
            str(c.ttft_s if c.ttft_s is not None else "-"),
            str(c.latency_s if c.latency_s is not None else "-"),
            str(c.tokens_per_s if c.tokens_per_s is not None else "-"),
            c.detail,
        )
    console.print(table)
    console.print(
        f"  p50/p90: TTFT {report.ttft_s.p50}/{report.ttft_s.p90} s, latency {report.latency_s.p50}/"
        f"{report.latency_s.p90} s, {report.tokens_per_s.p50}/{report.tokens_per_s.p90} tokens/s"
    )
    for fix in report.fixes:
        console.print(f"  fix: {fix}")


@app.command("eval")
def eval_cmd(
    endpoint_name: Annotated[str, typer.Argument(help="an existing SageMaker endpoint")],
    eval_set: Annotated[
        str | None, typer.Option(help="JSONL eval set: a local file or s3:// URI (default: the built-in set)")
    ] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help="invoke with response streaming")] = True,
    schema: Annotated[str, typer.Option(help="chat (OpenAI) | lmi (inputs/parameters)")] = "chat",
    max_truncated: Annotated[int, typer.Option(min=0)] = 0,
    max_errors: Annotated[int, typer.Option(min=0)] = 0,
    markdown: Annotated[Path | None, typer.Option(help="also write the Markdown report here")] = None,
    region: Annotated[str | None, typer.Option(help="AWS region (default: the SDK's configuration)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Run the truncation-aware smoke eval against an endpoint. Exit 0 pass, 1 fail, 2 bad input."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    from modeldrop.eval_report import to_markdown
    from modeldrop.eval_runner import evaluate_endpoint, runtime_client_config
    from modeldrop.models import EvalThresholds
    from modeldrop.smoke_eval import default_eval_set, parse_eval_set

    if schema not in ("chat", "lmi"):
        _fail(f"unknown --schema {schema!r}; choose chat or lmi")
    if schema == "lmi" and stream:
        stream = False  # the inputs/parameters schema is evaluated without streaming
    try:
        session = boto3.session.Session(region_name=region)
        if eval_set is None:
            cases = default_eval_set()
        elif eval_set.startswith("s3://"):
            from modeldrop.steps import load_eval_set

            cases = load_eval_set(session.client("s3"), eval_set)
        else:
            path = Path(eval_set)
            if not path.is_file():
                _fail(f"{eval_set}: no such file")
            cases = parse_eval_set(path.read_text(), eval_set)
        report = evaluate_endpoint(
            session.client("sagemaker"),
            session.client("sagemaker-runtime", config=runtime_client_config()),
            endpoint_name,
            cases,
            EvalThresholds(max_truncated=max_truncated, max_errors=max_errors),
            stream=stream,
            schema=schema,  # type: ignore[arg-type]
        )
    except ModeldropError as exc:
        _fail(exc.message, exc.hint)
    except (BotoCoreError, ClientError) as exc:
        _fail(f"AWS: {exc}")
    if markdown is not None:
        markdown.write_text(to_markdown(report))
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        _eval_table(report)
        verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
        console.print(f"{verdict} {report.summary}")
    raise typer.Exit(0 if report.passed else 1)


@app.command("plan")
def plan_cmd(
    source: Annotated[str, typer.Argument(help="model dir, .tar(.gz), s3://bucket/key.tar.gz or s3://bucket/prefix/")],
    engine: Annotated[str, typer.Option(help="vllm | sglang | lmi")] = "vllm",
    region: Annotated[str | None, typer.Option(help="the endpoint's region (default: AWS_REGION)")] = None,
    instance_type: Annotated[str, typer.Option(help="SageMaker instance type")] = "ml.g6.2xlarge",
    max_model_len: Annotated[int | None, typer.Option(min=256)] = None,
    max_num_seqs: Annotated[int | None, typer.Option(min=1)] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="raw engine key KEY=VALUE (the engine's own prefix only); repeatable")
    ] = None,
    force: Annotated[bool, typer.Option(help="plan even when a CUDA OOM is predicted")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """The image, container env, timeouts and GPU memory plan for a checkpoint. Exit 0 fits, 1 refused."""
    import os

    from modeldrop.artifact_scan import scan_source
    from modeldrop.checkpoint import validate_scan
    from modeldrop.serving_plan import plan_report

    if engine not in ("vllm", "sglang", "lmi"):
        _fail(f"unknown --engine {engine!r}; choose vllm, sglang or lmi")
    region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        _fail("no region: pass --region or set AWS_REGION")
    passthrough: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--env {item!r} is not KEY=VALUE")
        passthrough[key] = value
    try:
        validation = validate_scan(scan_source(source))
    except ModeldropError as exc:
        _fail(exc.message, exc.hint)
    report = plan_report(
        validation.summary(),
        source,
        engine,  # type: ignore[arg-type]
        region,
        instance_type,
        os.environ,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        passthrough=passthrough,
        force=force,
    )
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        _plan_summary(report)
    raise typer.Exit(0 if report.deployable else 1)


def _plan_summary(report: Any) -> None:
    table = Table(show_header=False, box=None)
    table.add_row("engine / region", f"{report.engine} / {report.region}")
    table.add_row("image", str(report.image or "-") + (f"  ({report.image_source})" if report.image_source else ""))
    price = f"  ${report.hourly_price:.2f}/h" if report.hourly_price else ""
    table.add_row("instance", report.instance_type + price)
    table.add_row("env", "\n".join(f"{k}={v}" for k, v in sorted(report.env.items())) or "-")
    for key, value in report.timeouts.items():
        table.add_row(key.replace("_", " "), str(value))
    console.print(table)
    memory = report.memory
    if memory.get("budget_gib") is not None:
        mem = Table(title=f"GPU memory per GPU on {memory['instance_type']} (TP {memory['tensor_parallel']})")
        mem.add_column("item")
        mem.add_column("GiB", justify="right")
        for label, key in (
            ("budget (capacity x fraction)", "budget_gib"),
            ("weights", "weights_gib"),
            ("sampler buffer", "sampler_gib"),
            ("activations + CUDA graphs", "overhead_gib"),
            ("left for KV cache", "kv_cache_gib"),
            ("KV needed for one full sequence", "kv_min_gib"),
            ("headroom", "headroom_gib"),
        ):
            mem.add_row(label, f"{memory[key]:.3f}")
        console.print(mem)
        colour = {"fits": "green", "tight": "yellow"}.get(memory["verdict"], "red")
        console.print(f"memory verdict: [{colour}]{memory['verdict']}[/]")
    for f in report.findings:
        if f.severity != "info":
            console.print(
                f"[yellow]{f.severity.upper()} {f.code}[/]: {f.message}" + (f"\n  fix: {f.hint}" if f.hint else "")
            )
    if report.refused:
        console.print(f"[bold red]REFUSED[/] {report.refused['error']}: {report.refused['message']}")
        if report.refused.get("hint"):
            console.print(f"  fix: {report.refused['hint']}")
    else:
        console.print("[bold green]PLAN OK[/]")


def main() -> None:
    app()
