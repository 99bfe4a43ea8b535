"""eval: the smoke eval against any existing endpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from modeldrop.cli._shared import app, aws_errors, console, fail, json_mode, session_for


def eval_table(report: Any) -> None:
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
    json_mode(as_json)
    from modeldrop.contracts.models import EvalThresholds
    from modeldrop.evaluation.report import to_markdown
    from modeldrop.evaluation.runner import evaluate_endpoint, runtime_client_config
    from modeldrop.evaluation.smoke_eval import load_eval_set

    if schema not in ("chat", "lmi"):
        fail(f"unknown --schema {schema!r}; choose chat or lmi")
    with aws_errors():
        session = session_for(region)
        cases = load_eval_set(eval_set, session.client("s3") if eval_set else None)
        report = evaluate_endpoint(
            session.client("sagemaker"),
            session.client("sagemaker-runtime", config=runtime_client_config()),
            endpoint_name,
            cases,
            EvalThresholds(max_truncated=max_truncated, max_errors=max_errors),
            stream=stream,  # LMI's inputs schema is read whole whatever this says
            schema=schema,  # type: ignore[arg-type]
        )
    if markdown is not None:
        markdown.write_text(to_markdown(report))
    if as_json:
        print(report.model_dump_json(indent=2))
    else:
        eval_table(report)
        verdict = "[bold green]PASSED[/]" if report.passed else "[bold red]FAILED[/]"
        console.print(f"{verdict} {report.summary}")
    raise typer.Exit(0 if report.passed else 1)
