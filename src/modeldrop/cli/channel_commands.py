"""Channels: `promote` a succeeded deployment onto a channel's stable endpoint (gated against the
version serving it), `rollback` a channel to its last known-good version, `channels` to list them
(`status CHANNEL` shows one)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from modeldrop.cli._shared import app, aws_errors, console, fail, json_mode
from modeldrop.cli.channel_view import _show
from modeldrop.cli.operate_commands import ProfileOpt, RegionOpt, StackOpt, _connect
from modeldrop.contracts.channel import channel_problem
from modeldrop.contracts.errors import PromotionBlocked, PromotionFailed

if TYPE_CHECKING:
    from modeldrop.pipeline.channels.promotion import ChannelContext


def _context(stack: str, region: str | None, profile: str | None) -> ChannelContext:
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.evaluation.runner import runtime_client_config
    from modeldrop.pipeline.channels.promotion import ChannelContext

    session, info, registry = _connect(stack, region, profile)
    return ChannelContext(
        sm=session.client("sagemaker"),
        runtime=session.client("sagemaker-runtime", config=runtime_client_config()),
        cloudwatch=session.client("cloudwatch"),
        registry=registry,
        channels=ChannelStore(registry.table),
        resource_prefix=info.resource_prefix,
        stack_tag=info.stack_name,
        s3=session.client("s3"),
        max_channels=info.max_channels,
        autoscaling=session.client("application-autoscaling"),
    )


def _channel_name(name: str) -> str:
    problem = channel_problem(name)
    if problem:
        fail(problem)
    return name


def _grace(text: str) -> Any:
    from datetime import timedelta

    from modeldrop.operate.deployments import parse_ttl

    return timedelta(hours=parse_ttl(text))


@app.command("promote")
def promote_cmd(
    deployment: Annotated[str, typer.Argument(help="a succeeded deployment's id")],
    channel: Annotated[str, typer.Option(help="the channel (its endpoint is <prefix>-ch-<channel>)")],
    eval_set: Annotated[
        str | None,
        typer.Option(
            help="JSONL eval set for the gate; an s3:// one is pinned for the channel (default: its pinned set)"
        ),
    ] = None,
    max_regressed_cases: Annotated[int, typer.Option(min=0, help="cases that may regress")] = 0,
    latency_slack: Annotated[float, typer.Option(min=0, help="seconds of latency difference that are noise")] = 0.25,
    grace: Annotated[str, typer.Option(help="how long the replaced version is kept for a rollback")] = "1h",
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Put a deployment behind a channel's stable endpoint: the first creates the channel; later ones
    pass the champion/challenger gate, then a blue/green update with rollback on the channel's
    alarms, read back. Exit 0 serving, 1 PromotionBlocked or PromotionFailed, 2 bad input."""
    json_mode(as_json)
    from modeldrop.evaluation.gate import GateThresholds
    from modeldrop.pipeline.channels.gate_cases import operator_gate_cases
    from modeldrop.pipeline.channels.promotion import promote

    name = _channel_name(channel)
    with aws_errors():
        ctx = _context(stack, region, profile)
        cases, pin = operator_gate_cases(ctx, name, eval_set)
        thresholds = GateThresholds(max_regressed_cases=max_regressed_cases, latency_slack_s=latency_slack)
        try:
            record = promote(ctx, deployment, name, cases, thresholds, _grace(grace), pin)
        except (PromotionBlocked, PromotionFailed) as exc:  # the channel is fine: the candidate is not
            fail(exc.message, exc.hint, error=type(exc).__name__, code=1)
    _show(record, as_json)


@app.command("rollback")
def rollback_cmd(
    channel: Annotated[str, typer.Argument(help="the channel to return to its last known-good version")],
    grace: Annotated[str, typer.Option(help="how long the version rolled back from is kept")] = "1h",
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Return a channel to the version it served before, in one step, verified by reading it back."""
    json_mode(as_json)
    from modeldrop.pipeline.channels.channel_admin import rollback

    name = _channel_name(channel)
    with aws_errors():
        try:
            record = rollback(_context(stack, region, profile), name, _grace(grace))
        except PromotionFailed as exc:
            fail(exc.message, exc.hint, error=type(exc).__name__, code=1)
    if not as_json:
        console.print(_rollback_line(record), highlight=False, markup=False)
    _show(record, as_json)


def _rollback_line(record: Any) -> str:
    """Which version the rollback moved to, and from which; a rollback onto the version an earlier
    rollback left is said to undo it (it moves forward again)."""
    to = record.live.deployment_id if record.live else "-"
    frm = record.kept[0].deployment_id if record.kept else "-"
    line = f"rolled back channel {record.name}: {to} serves again (was {frm}, kept for a rollback)"
    earlier = [e for e in record.history[:-1] if e.kind == "rolled_back"]
    if earlier and earlier[-1].previous == to:
        line += f"; this undoes the rollback of {earlier[-1].at}"
    return line


@app.command("channels")
def channels_cmd(
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Every channel: its endpoint, the version serving, the versions kept for a rollback, and what it
    cost today and this month (from its scaling history where it scales to zero) with the hours idle saved."""
    json_mode(as_json)
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.pipeline.channels.channel_cost import channel_cost

    with aws_errors():
        session, _info, registry = _connect(stack, region, profile)
        records = ChannelStore(registry.table).all()
        sm, scaling = session.client("sagemaker"), session.client("application-autoscaling")
        costs = {r.name: channel_cost(sm, scaling, r, sm.meta.region_name) for r in records}
    if as_json:
        print(json.dumps([{**r.model_dump(mode="json"), "cost": costs[r.name]} for r in records]))
        return
    columns = ("channel", "endpoint", "serving", "kept", "last event", "today", "month", "idle saved")
    rows = []
    for r in records:
        last = r.history[-1] if r.history else None
        rows.append((r.name, r.endpoint_name, r.live.deployment_id if r.live else "-",
                     ", ".join(v.deployment_id for v in r.kept) or "-", f"{last.kind} {last.at}" if last else "-",
                     *_cost_cells(costs[r.name])))  # fmt: skip
    # A table wider than the terminal would cut identifiers nobody could then copy: stacked instead.
    widest = sum(max([len(c), *(len(row[i]) for row in rows)]) + 3 for i, c in enumerate(columns)) + 1
    if rows and widest > console.width:
        for row in rows:
            console.print(f"[bold]{escape(row[0])}[/]", highlight=False)
            for label, value in zip(columns[1:], row[1:], strict=True):
                console.print(f"  {label}: {escape(value)}", highlight=False, soft_wrap=True)
        return
    table = Table(title="channels")
    for col in columns:
        table.add_column(col, no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _cost_cells(cost: dict[str, Any]) -> tuple[str, str, str]:
    def usd(window: str) -> str:
        value = (cost.get(window) or {}).get("usd")
        return f"${value:.2f}" if value is not None else "-"

    saved = (cost.get("month") or {}).get("idle_hours_saved")
    idle = f"{saved:.1f} h" if cost.get("scales_to_zero") and saved is not None else "always-on"
    return usd("today"), usd("month"), idle
