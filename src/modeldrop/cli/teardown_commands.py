"""`extend` and `teardown`: a deployment's TTL, and deleting it (or, shared, one adapter component) now."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape

from modeldrop.cli._shared import (
    app,
    aws_errors,
    console,
    fail,
    json_mode,
)
from modeldrop.cli.operate_commands import ProfileOpt, RegionOpt, StackOpt, _connect


@app.command("extend")
def extend_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    ttl: Annotated[str, typer.Option(help="new time to live from now, e.g. 4h")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Move a live deployment's expiry: the endpoint's tag and the record together."""
    json_mode(as_json)
    from modeldrop.operate.deployments import extend, parse_ttl

    with aws_errors():
        parse_ttl(ttl)  # a typo is refused before any AWS call
        session, info, registry = _connect(stack, region, profile)
        hours = parse_ttl(ttl, info.max_ttl_hours, "the stack's MaxTtlHours")
        record = extend(session.client("sagemaker"), registry, info, deployment, hours)
    if as_json:
        print(json.dumps(record.model_dump(include={"deployment_id", "endpoint_name", "expires_at"})))
        return
    console.print(f"{record.deployment_id}: {record.endpoint_name} now expires at {record.expires_at}")


@app.command("teardown")
def teardown_cmd(
    deployment: Annotated[str | None, typer.Argument(help="deployment id or endpoint name")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="every endpoint the stack manages (do this before `sam delete`)")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", help="with --all: do not ask on a terminal")] = False,
    adapter: Annotated[
        str | None,
        typer.Option(
            help="adapter_mode shared: delete only this adapter's inference component (its name, or the "
            "component's); the base and the other adapters go on serving"
        ),
    ] = None,
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Delete a managed endpoint now (endpoint, config, model) and record it; refuses unmanaged ones."""
    json_mode(as_json)
    from modeldrop.operate.deployments import teardown

    if every == (deployment is not None):
        fail("give a deployment id or endpoint name, or --all")
    if every:
        _teardown_all(stack, region, profile, yes, as_json)
        return
    assert deployment is not None
    if adapter is None and _close_channel(deployment, stack, region, profile, as_json):
        return
    if adapter is not None:
        _teardown_adapter(deployment, adapter, stack, region, profile, as_json)
        return
    with aws_errors():
        session, info, registry = _connect(stack, region, profile)
        result = teardown(
            session.client("sagemaker"), registry, session.client("events"), info, deployment, s3=session.client("s3")
        )
    record = result.get("record") or {}
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "record"} | {"record": record}, default=str))
        return
    if result.get("already_ended"):
        going = f" ({', '.join(result['already_gone'])})" if result.get("already_gone") else ""
        console.print(f"{record.get('deployment_id')} already {result['already_ended']}: nothing left to delete{going}")
        return
    _print_deleted("deleted", result["deleted"], "nothing (already gone)")
    if record:
        from modeldrop.contracts.record import DeploymentRecord

        cost = DeploymentRecord.model_validate(record).cost_so_far() or 0
        console.print(f"{record['deployment_id']} torn down; final cost ${cost:.2f}")


def _close_channel(name: str, stack: str, region: str | None, profile: str | None, as_json: bool) -> bool:
    """NAME is a channel (or its endpoint): it is closed, and True."""
    from modeldrop.cli.channel_commands import _context
    from modeldrop.pipeline.channels.channel_admin import close_channel

    with aws_errors():
        ctx = _context(stack, region, profile)
        channel = next((c for c in ctx.channels.all() if name in (c.name, c.endpoint_name)), None)
        if channel is None:
            return _closed_already(ctx, name, as_json)
        deleted = close_channel(ctx, channel.name)
    if as_json:
        print(json.dumps({"channel": channel.name, "deleted": deleted}))
    else:
        _print_deleted(f"channel {channel.name} closed; deleted", deleted, "nothing")
    return True


def _closed_already(ctx: Any, name: str, as_json: bool) -> bool:
    """NAME was a channel that is closed (its versions' records name it): nothing left, said so, exit 0 --
    a second teardown is as harmless as a deployment's."""
    served = [r for r in ctx.registry.deployments() if r.step_dict("promoted").get("channel") == name]
    if not served:
        return False
    if as_json:
        print(json.dumps({"channel": name, "deleted": [], "already_closed": True}))
    else:
        console.print(f"channel {name} is closed already: nothing left to delete")
    return True


def _close_every_channel(stack: str, region: str | None, profile: str | None) -> list[dict[str, Any]]:
    from modeldrop.cli.channel_commands import _context
    from modeldrop.contracts.errors import ModeldropError
    from modeldrop.pipeline.channels.channel_admin import close_channel

    ctx = _context(stack, region, profile)
    results: list[dict[str, Any]] = []
    for channel in ctx.channels.all():
        try:
            results.append({"endpoint": channel.endpoint_name, "deleted": close_channel(ctx, channel.name)})
        except ModeldropError as exc:
            results.append({"endpoint": channel.endpoint_name, "error": exc.message})
    return results


def _teardown_adapter(
    deployment: str, adapter: str, stack: str, region: str | None, profile: str | None, as_json: bool
) -> None:
    from modeldrop.operate.stack_teardown import teardown_adapter_now

    with aws_errors():
        session, _info, registry = _connect(stack, region, profile)
        result = teardown_adapter_now(session.client("sagemaker"), registry, deployment, adapter)
    if as_json:
        print(json.dumps(result, default=str))
        return
    _print_deleted("deleted", result["deleted"], "nothing")
    console.print(f"{result['deployment_id']}: still serving {', '.join(result['serving']) or 'no adapter'}")


def _teardown_all(stack: str, region: str | None, profile: str | None, yes: bool, as_json: bool) -> None:
    from modeldrop.operate.stack_teardown import live_endpoints, teardown_all

    with aws_errors():
        session, info, registry = _connect(stack, region, profile)
        sm = session.client("sagemaker")
        names = live_endpoints(sm, info.stack_tag, info.resource_prefix)
        if names and not yes and not as_json and console.is_terminal:
            typer.confirm(f"delete {len(names)} endpoint(s): {', '.join(names)}?", abort=True)
        results = _close_every_channel(stack, region, profile)  # their endpoints hold other deployments' configs
        results += teardown_all(
            sm, registry, session.client("events"), info, s3=session.client("s3"), sfn=session.client("stepfunctions")
        )
    failed = [r for r in results if "error" in r]
    if as_json:
        print(json.dumps({"torn_down": results}, default=str))
    else:
        for r in results:
            if r.get("stopped"):
                console.print(f"execution {escape(str(r['execution']))}: stopped (it deletes what it made)")
                continue
            label = r.get("endpoint") or r.get("deployment_id")
            outcome = "being deleted already" if r.get("deleting") else "deleted"
            console.print(f"{label}: " + (f"[red]{escape(r['error'])}[/]" if "error" in r else outcome))
        if not results:
            console.print("no endpoint of this stack is live")
    raise typer.Exit(1 if failed else 0)


def deleted_lines(items: list[str]) -> list[str]:
    """What was deleted, one per line: SageMaker's names as they are, S3 objects by their folder (with
    how many) so a checkpoint's shards are one line that can be copied, not a paragraph."""
    folders: dict[str, list[str]] = {}
    lines = []
    for item in items:
        if item.startswith("s3://") and "/" in item[5:]:
            folders.setdefault(item.rsplit("/", 1)[0] + "/", []).append(item)
        else:
            lines.append(item)
    for folder, keys in folders.items():
        lines.append(keys[0] if len(keys) == 1 else f"{folder} ({len(keys)} objects)")
    return lines


def _print_deleted(header: str, items: list[str], none: str) -> None:
    if not items:
        console.print(f"{header}: {none}", markup=False, highlight=False)
        return
    console.print(f"{header}:", markup=False, highlight=False)
    for line in deleted_lines(items):
        console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)
