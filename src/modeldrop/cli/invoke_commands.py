"""`invoke`: one call to a channel (or an endpoint) as its clients are told to make it -- a channel that
scales to zero answers "no capacity" while it wakes, and that is retried with a progress line for up to
its wake time (docs/operating.md, "Idle channels")."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from modeldrop.cli._shared import app, aws_errors, console, err, json_mode
from modeldrop.cli.operate_commands import ProfileOpt, RegionOpt, StackOpt, _connect


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
