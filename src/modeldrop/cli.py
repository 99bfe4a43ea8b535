"""The modeldrop command line (needs the `cli` extra; the Lambda bundle never imports this)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

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
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)


@app.command("run-local")
def run_local_cmd(
    artifact: Annotated[
        Path | None, typer.Argument(help="model dir, .tar or .tar.gz; default: a generated sample")
    ] = None,
    fault: Annotated[str, typer.Option(help="none|oom|capacity|slow-start|truncate")] = "none",
    engine: Annotated[str | None, typer.Option(help="vllm|sglang|lmi (the stack default otherwise)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Run one deployment end to end on this machine: no AWS account needed."""
    from modeldrop.local.run import FAULTS, run_local

    if fault not in FAULTS:
        err.print(f"error: unknown --fault {fault!r}; choose from {', '.join(FAULTS)}")
        raise typer.Exit(2)
    if engine not in (None, "vllm", "sglang", "lmi"):
        err.print(f"error: unknown --engine {engine!r}; choose vllm, sglang or lmi")
        raise typer.Exit(2)
    if artifact is not None and not artifact.exists():
        err.print(f"error: {artifact}: no such file or directory")
        raise typer.Exit(2)
    if not as_json:
        console.print(
            "[bold]modeldrop run-local[/]: the real state machine and handlers over an in-process AWS emulator"
        )
        console.print("  S3 put -> EventBridge -> starter -> Step Functions (moto)")

    def show(state: Any) -> None:
        if not as_json:
            mark = "[green]ok[/]" if state.outcome == "ok" else f"[red]{state.outcome}[/]"
            console.print(f"  {state.name:<22} {mark:<28} {state.seconds:6.2f}s")

    result = run_local(artifact, fault=fault, on_state=show, engine=engine)
    if as_json:
        print(result.model_dump_json(indent=2))
    else:
        _summary(result)
    raise typer.Exit(0 if result.status == "succeeded" else 1)


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
    teardown = rec.get("steps", {}).get("teardown")
    if teardown:
        table.add_row("deleted", ", ".join(teardown.get("deleted", [])) or "nothing was created")
    console.print(table)
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
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Refuse a checkpoint the engines would fail to load. Exit 0 deployable, 1 refused, 2 unreadable."""
    from modeldrop.artifact_scan import scan_source
    from modeldrop.checkpoint import validate_scan

    try:
        report = validate_scan(scan_source(source))
    except ModeldropError as exc:
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
        else:
            err.print(f"error: {exc.message}\n  fix: {exc.hint}")
        raise typer.Exit(2) from None
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
        ):
            table.add_row(label, str(value))
        console.print(table)
        for f in report.findings:
            colour = {"error": "red", "warning": "yellow"}.get(f.severity, "dim")
            console.print(f"[{colour}]{f.severity.upper()} {f.code}[/]: {f.message}\n  fix: {f.hint}")
        console.print("[green]deployable[/]" if report.deployable else "[red]refused[/]")
    raise typer.Exit(0 if report.deployable else 1)


def main() -> None:
    app()
