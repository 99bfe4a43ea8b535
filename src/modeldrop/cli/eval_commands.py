"""eval: the smoke eval against any existing endpoint; and `invoke`: one call to a channel (or an endpoint) as
its clients are told to make it -- a channel that scales to zero answers "no capacity" while it wakes, and that
is retried with a progress line for up to its wake time (docs/operating.md, "Idle channels")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from modeldrop.cli._shared import app, aws_errors, console, err, fail, json_mode, session_for
from modeldrop.cli.operate_commands import ProfileOpt, RegionOpt, StackOpt, _connect
from modeldrop.evaluation.chat_protocol import Schema

EvalSetOpt = Annotated[
    str | None, typer.Option(help="JSONL eval set: a local file or s3:// URI (default: the built-in set)")
]
StreamOpt = Annotated[bool, typer.Option("--stream/--no-stream", help="invoke with response streaming")]
SchemaOpt = Annotated[str, typer.Option(help="chat (OpenAI) | lmi (inputs/parameters)")]


def _schema(schema: str) -> Schema:
    if schema not in ("chat", "lmi"):
        fail(f"unknown --schema {schema!r}; choose chat or lmi")
    return "chat" if schema == "chat" else "lmi"


def _num(value: Any) -> str:
    return "-" if value is None else str(value)


def eval_table(report: Any) -> None:
    """One row per case; on a narrow terminal the secondary columns go, and each case's detail is
    printed under the table rather than folded one word per line."""
    wide = console.width >= 140
    table = Table(title=f"smoke eval on {report.endpoint_name} (max_model_len {report.max_model_len})")
    columns = ["case", "outcome", "finish", "tokens", "TTFT s"]
    if wide:
        columns[4:4] = ["max_tokens"]
        columns += ["latency s", "tok/s", "detail"]
    for col in columns:
        table.add_column(col, no_wrap=col in ("case", "outcome"))
    for c in report.cases:
        colour = "green" if c.outcome == "pass" else "red"
        cells = [c.id, f"[{colour}]{c.outcome}[/]", c.finish_reason or "-", _num(c.completion_tokens)]
        if wide:
            cells.append(f"{_num(c.max_tokens)} ({c.max_tokens_source})")
        cells.append(_num(c.ttft_s))
        if wide:
            cells += [_num(c.latency_s), _num(c.tokens_per_s), c.detail]
        table.add_row(*cells)
    console.print(table)
    if not wide:
        for c in report.cases:
            if c.detail:
                console.print(f"  {c.id}: {c.detail}", markup=False)
        console.print(
            "  max_tokens, latency s and tok/s per case are left out at this width: a terminal of 140 columns "
            "shows them, --json and the Markdown report always do",
            markup=False,
            highlight=False,
        )
    # A p90 of three cases is their maximum: said as such, so that no one reads a tail into it.
    measured = sum(1 for c in report.cases if c.latency_s is not None)
    label = "p50/p90" if measured >= 10 else f"median/max of {measured} case{'s' * (measured != 1)}"
    console.print(
        f"  {label}: TTFT {_num(report.ttft_s.p50)}/{_num(report.ttft_s.p90)} s, latency "
        f"{_num(report.latency_s.p50)}/{_num(report.latency_s.p90)} s, "
        f"{_num(report.tokens_per_s.p50)}/{_num(report.tokens_per_s.p90)} tokens/s"
    )
    for fix in report.fixes:
        console.print(f"  fix: {fix}")


@app.command("eval")
def eval_cmd(
    endpoint_name: Annotated[str, typer.Argument(help="an existing SageMaker endpoint")],
    eval_set: EvalSetOpt = None,
    stream: StreamOpt = True,
    schema: SchemaOpt = "chat",
    max_truncated: Annotated[int, typer.Option(min=0)] = 0,
    max_errors: Annotated[int, typer.Option(min=0)] = 0,
    markdown: Annotated[Path | None, typer.Option(help="also write the Markdown report here")] = None,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
) -> None:
    """Run the truncation-aware smoke eval against an endpoint. Exit 0 pass, 1 fail, 2 bad input."""
    json_mode(as_json)
    from modeldrop.contracts.models import EvalThresholds
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.report import to_markdown
    from modeldrop.evaluation.runner import evaluate_endpoint, runtime_client_config

    chosen = _schema(schema)
    with aws_errors():
        session = session_for(region, profile)
        cases = load_eval_set(eval_set, session.client("s3") if eval_set else None)
        report = evaluate_endpoint(
            session.client("sagemaker"),
            session.client("sagemaker-runtime", config=runtime_client_config()),
            endpoint_name,
            cases,
            EvalThresholds(max_truncated=max_truncated, max_errors=max_errors),
            stream=stream,  # LMI's inputs schema is read whole whatever this says
            schema=chosen,
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


@app.command("compare")
def compare_cmd(
    champion: Annotated[str, typer.Argument(help="the endpoint serving now")],
    candidate: Annotated[str, typer.Argument(help="the endpoint of the version that would replace it")],
    eval_set: EvalSetOpt = None,
    stream: StreamOpt = True,
    schema: SchemaOpt = "chat",
    max_regressed_cases: Annotated[int, typer.Option(min=0, help="cases that may regress")] = 0,
    max_length_ratio: Annotated[float, typer.Option(min=1, help="answer length factor either way")] = 3.0,
    max_ttft_ratio: Annotated[float, typer.Option(min=1, help="time-to-first-token factor")] = 2.0,
    min_tokens_per_s_ratio: Annotated[float, typer.Option(min=0.01, max=1, help="generation rate fraction")] = 0.5,
    latency_slack: Annotated[float, typer.Option(min=0, help="seconds of latency difference that are noise")] = 0.25,
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the gate report as JSON")] = False,
) -> None:
    """Champion/challenger: run the eval set against both endpoints and compare case by case
    (outcome, truncation, empty or refused answers, JSON validity, length, TTFT, tokens/s).
    Exit 0 promotable, 1 PromotionBlocked, 2 bad input."""
    json_mode(as_json)
    from modeldrop.evaluation.eval_sets import load_eval_set
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.evaluation.runner import compare_endpoints, runtime_client_config

    chosen = _schema(schema)
    thresholds = GateThresholds(
        max_regressed_cases=max_regressed_cases,
        max_length_ratio=max_length_ratio,
        max_ttft_ratio=max_ttft_ratio,
        min_tokens_per_s_ratio=min_tokens_per_s_ratio,
        latency_slack_s=latency_slack,
    )
    with aws_errors():
        session = session_for(region, profile)
        cases = load_eval_set(eval_set, session.client("s3") if eval_set else None)
        runtime = session.client("sagemaker-runtime", config=runtime_client_config())
        gate = compare_endpoints(
            session.client("sagemaker"), runtime, champion, candidate, cases, thresholds, stream, chosen
        )
    if as_json:
        print(gate.model_dump_json(indent=2))
    else:
        table = Table(title=f"{candidate} against {champion}")
        for col in ("case", "champion", "candidate", "chars", "TTFT s", "regressions"):
            table.add_column(col)
        for d in gate.cases:
            cells = [d.id, d.champion, d.candidate, f"{_num(d.answer_chars[0])} -> {_num(d.answer_chars[1])}"]
            cells += [f"{_num(d.ttft_s[0])} -> {_num(d.ttft_s[1])}", "; ".join(d.regressions) or "-"]
            table.add_row(*cells)
        console.print(table)
        verdict = "[bold green]PROMOTABLE[/]" if gate.promote else "[bold red]PromotionBlocked[/]"
        console.print(f"{verdict} {gate.summary}")
    raise typer.Exit(0 if gate.promote else 1)


def _answer_text(body: str) -> str:
    """The message an OpenAI chat completion carries, or the body as it came."""
    try:
        data: Any = json.loads(body)
        return str(data["choices"][0]["message"]["content"])
    except (ValueError, KeyError, IndexError, TypeError):
        return body


@app.command("invoke")
def invoke_cmd(
    target: Annotated[str, typer.Argument(help="a channel's name (its invoke target is used), or an endpoint name")],
    prompt: Annotated[str, typer.Option(help="the user message sent")] = "Say hello.",
    max_tokens: Annotated[int, typer.Option(min=1, max=8192, help="the answer's token budget")] = 64,
    wait: Annotated[
        int | None,
        typer.Option(min=0, max=7200, help="seconds to retry a channel that is waking (default: its wake time)"),
    ] = None,
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Call a channel or endpoint once; a channel asleep is woken and waited for. Exit 0 answered, 1 not."""
    json_mode(as_json)
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.aws.sagemaker.channel_invoke import call_waiting
    from modeldrop.evaluation.runner import runtime_client_config

    body = json.dumps({"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}).encode()

    def progress(waited: float, pause: float) -> None:
        if not as_json:
            err.print(f"{target} is waking (no copy running yet): retrying in {pause:.0f} s, {waited:.0f} s so far")

    with aws_errors():
        session, _info, registry = _connect(stack, region, profile)
        channel = ChannelStore(registry.table).get(target)
        invoke = channel.invoke_target() if channel else {"EndpointName": target}
        patience = wait if wait is not None else (channel.idle.wake_seconds if channel and channel.idle else 0)
        runtime = session.client("sagemaker-runtime", config=runtime_client_config())
        done = call_waiting(runtime, invoke, body, float(patience), progress)
    if as_json:
        print(json.dumps({"target": invoke, **done}))
    elif done["answered"]:
        console.print(_answer_text(str(done["body"])), highlight=False, soft_wrap=True)
        if done["retries"]:
            err.print(f"answered after {done['seconds']:.0f} s ({done['retries']} retries while it woke)")
    elif channel is None and "not found" in str(done["error"]).lower():  # neither a channel nor an endpoint
        err.print(f"error: no channel named {target} in stack {stack}, and no endpoint of that name in its region")
        err.print("  fix: `modeldrop channels` lists the channels, `modeldrop list` the deployments' endpoints")
    else:
        err.print(f"error: {done['error']}")
    raise typer.Exit(0 if done["answered"] else 1)
