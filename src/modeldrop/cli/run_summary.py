"""run-local's text summary, read at 80 columns: what was deployed, the eval, one line per kind of
deletion (every name with --verbose, and in --json), the shared-mode components, and the verdict
last. Values are never cut: a URI or a command longer than the line is printed whole."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.markup import escape

from modeldrop.cli._shared import console, fields
from modeldrop.cli.eval_commands import eval_table
from modeldrop.contracts.record import DeploymentRecord

_KINDS = ("inference-component", "endpoint", "endpoint-config", "model")


def deletion_lines(deleted: list[str]) -> list[str]:
    """One line per kind: the SageMaker resources by name, the files by the folder that held them."""
    if not deleted:
        return ["nothing was created"]
    lines = []
    for kind in _KINDS:
        names = [d.split("/", 1)[1] for d in deleted if d.startswith(f"{kind}/")]
        if names:
            lines.append(f"{kind}: {', '.join(names)}" if len(names) < 3 else f"{kind} x{len(names)}: {names[0]}, ...")
    files = [d for d in deleted if d.startswith("s3://")]
    folders = Counter(_folder(f) for f in files)
    lines += [f"{n} file{'s' if n > 1 else ''} under {folder}" for folder, n in folders.items()]
    other = [d for d in deleted if not d.startswith(("s3://", *(f"{k}/" for k in _KINDS)))]
    lines += other
    return lines


def _folder(uri: str) -> str:
    """s3://bucket/modeldrop-served/<id>/a/b -> s3://bucket/modeldrop-served/<id>/ (the copy's folder)."""
    parts = uri.split("/")
    return "/".join(parts[:5]) + "/" if len(parts) > 5 else uri.rsplit("/", 1)[0] + "/"


def _engine_line(check: dict[str, Any], engine_off: str | None) -> str:
    judged = f" by vLLM {check['version']}" if check.get("version") else ""
    said = f"\n{str(check.get('message'))[:200]}" if check.get("verdict") != "loads" and check.get("message") else ""
    if engine_off and check.get("verdict") == "unavailable":
        said = f"\n{engine_off}"
    target = str(check.get("judged_for") or "")
    # "loads by vLLM 0.31.0 for vLLM 0.31.0 (image tag ...)": the image named once when its release judged.
    same = bool(judged) and target.startswith(f"vLLM {check.get('version')}")
    image = target.split(" (", 1)[1].rstrip(")") if same and " (" in target else ""
    where = (f" ({image})" if image else "") if same else (f" for {target}" if target else "")
    return f"{check.get('verdict')}{judged}{where}{said}"


def _plan_rows(result: Any, engine_off: str | None = None) -> list[tuple[str, str]]:
    """What was deployed where, with which env and memory plan (from the output, else the record)."""
    rec = result.record or DeploymentRecord(deployment_id=str(result.deployment_id))
    out = result.output or {}
    built = rec.step_dict("build_env")
    env = out.get("env") or built.get("env") or {}
    times = f" x {rec.instance_count} (the memory plan is per instance)" if rec.instance_count > 1 else ""
    rows: list[tuple[str, str]] = [
        ("deployment", str(result.deployment_id)),
        ("endpoint", str(rec.endpoint_name or "-")),
        ("instance", str(out.get("instance_type") or rec.instance_type or "-") + times),
        ("image", str(out.get("image") or rec.image_uri or "-")),
        ("env", "\n".join(f"{k}={v}" for k, v in sorted(env.items())) or "-"),
    ]
    if check := rec.step_dict("engine_check"):
        rows.append(("engine check", _engine_line(check, engine_off)))
    if memory := out.get("memory") or built.get("memory") or {}:
        rows.append(
            (
                "memory plan",
                f"{memory.get('verdict')}: weights {memory.get('weights_gib')} GiB, "
                f"KV {memory.get('kv_cache_gib')} GiB,\nheadroom {memory.get('headroom_gib')} GiB "
                f"on {memory.get('instance_type')}",
            )
        )
    return rows


def _outcome_rows(result: Any, verbose: bool) -> list[tuple[str, str]]:
    """The attempts that fell back, the eval, and what was deleted."""
    rec = result.record or DeploymentRecord(deployment_id=str(result.deployment_id))
    rows = [
        (
            f"attempt {attempt.get('attempt')}",
            f"{attempt.get('instance_type')}: {attempt.get('error')} after {attempt.get('minutes')} min",
        )
        for attempt in rec.step("attempts") or []
    ]
    if ev := result.eval or {}:
        rows.append(("eval", f"{'passed' if ev.get('passed') else 'FAILED'}: {ev.get('summary')}"))
        rows.append(("eval report", str(ev.get("report_markdown_uri"))))
    # A success is torn down by run-local at exit (the emulated account ends with the run); a failure by
    # the state machine's own teardown.
    deleted = result.deleted_at_exit or rec.step_dict("teardown").get("deleted", [])
    if deleted or rec.step_dict("teardown"):
        label = "deleted at exit" if result.deleted_at_exit else "deleted"
        rows.append((label, "\n".join(deleted if verbose else deletion_lines(deleted))))
    # The s3:// report URIs above end with the emulated account: these copies stay.
    labels = {"validation": "validation report", "eval": "eval report (json)", "eval_markdown": "eval report (md)"}
    rows += [(f"{labels[kind]}, kept", path) for kind, path in result.local_reports.items()]
    return rows


def _component_rows(components: dict[str, Any]) -> list[tuple[str, str]]:
    """adapter_mode shared: the endpoint's components, one adapter torn down, then each one invoked."""
    rows = [
        ("component", f"{c['name']}: {c['status']}, {c.get('copies', '-')} copies")
        for c in components.get("components", [])
    ]
    if torn := components.get("torn_down"):
        rows.append(("torn down", f"adapter {torn['adapter']}: {', '.join(torn['deleted'])}"))
    rows += [(f"then {name}", answer) for name, answer in (components.get("invoked_after") or {}).items()]
    return rows


def channel_lines(channel: dict[str, Any]) -> list[str]:
    """A channel's day as run-local played it: each event with its seconds (from the upload to serving,
    or the rollback's own), an adapter-only promotion said as such, and each gate's verdict."""
    adapter_only = {
        s.get("deployment_id") for s in channel.get("steps", []) if s.get("step") == "promoted, adapter only"
    }
    lines: list[str] = []
    for event in channel.get("history", []):
        kind = str(event["kind"]).replace("_", " ")
        if kind == "promoted" and event.get("deployment_id") in adapter_only:
            kind = "promoted, adapter only (no endpoint created)"
        line = f"channel {channel['name']}: {kind} {event.get('deployment_id') or ''}".rstrip()
        if event.get("seconds") is not None:  # a retired version: how long it was kept for a rollback
            line += f" {'after' if kind == 'retired' else 'in'} {event['seconds']:.1f} s"
        lines.append(line + (f" ({str(event['reason'])[:160]})" if event.get("reason") else ""))
        if gate := (event.get("gate") or {}).get("summary"):
            lines.append(f"  gate: {gate}")
    if channel.get("error"):
        lines.append(f"channel {channel['name']}: {channel['error']}")
    return lines + idle_lines(channel)


def idle_lines(channel: dict[str, Any]) -> list[str]:
    """An idle channel's day (--idle): how it was planned, each sleep and wake with its seconds, its cost."""
    idle = channel.get("idle")
    if not idle:
        return []
    name = channel["name"]
    if idle.get("mode") == "scale_to_zero":
        lines = [f"channel {name}: scales to zero after {idle['after_seconds'] // 60} min without a call; a call "
                 f"while asleep is refused as waking, for up to {idle['wake_seconds']} s"]  # fmt: skip
    else:
        lines = [f"channel {name}: always-on: {idle.get('reason')}"]
    for step in channel.get("steps", []):
        kind = step.get("step")
        if kind == "scaled to zero":
            lines.append(f"channel {name}: scaled to zero {step['idle_seconds']} s after its last call "
                         f"({step.get('instances')} instances)")  # fmt: skip
        elif kind in ("woken by a call", "not woken", "called the promoted version"):
            said = f"answered after {step['seconds']:.0f} s" if step.get("answered") else step.get("error")
            lines.append(f"channel {name}: {kind}: {said} ({step.get('retries', 0)} retries)")
        elif kind == "promoted while asleep":
            lines.append(f"channel {name}: promoted {step['deployment_id']} while asleep (woken for the gate)")
        elif kind == "rolled back while asleep":
            lines.append(
                f"channel {name}: rolled back to {step['deployment_id']} while asleep in {step['seconds']:.0f} s"
            )
        elif kind == "a quiet night":
            lines.append(f"channel {name}: {step['hours']} h without a call: {step.get('instances')} instances")
    cost = channel.get("cost") or {}
    spent = cost.get("since_created") or {}
    if spent.get("usd") is not None:
        lines.append(f"channel {name}: cost ${spent['usd']:.2f} for {spent['instance_hours']:.2f} instance-hours; "
                     f"always-on ${spent['always_on_usd']:.2f} ({spent['idle_hours_saved']:.2f} h saved), "
                     f"{len(cost.get('wakeups') or [])} wake-ups")  # fmt: skip
    return lines


def summary(result: Any, verbose: bool = False, engine_off: str | None = None) -> None:
    """The run's summary; ENGINE_OFF: why run-local left the engine check off (the record says only that
    the stack's parameter is Disabled)."""
    fields(_plan_rows(result, engine_off) + _outcome_rows(result, verbose))
    if result.components:
        fields(_component_rows(result.components))
    channels = [result.channel, (result.channel or {}).get("adapter_channel")]
    for channel in [c for c in channels if c]:
        for line in channel_lines(channel):
            console.print(escape(line), soft_wrap=True)
    if result.eval_report:
        from modeldrop.evaluation.smoke_eval import EvalReport

        eval_table(EvalReport.model_validate(result.eval_report))
    failure = result.record.step_dict("failure") if result.record else {}
    if failure.get("diagnosis"):
        console.print(f"[yellow]diagnosis from the endpoint's logs[/]: {failure['diagnosis']}; fix: {failure['hint']}")
        for line in failure.get("log_excerpt", [])[-3:]:
            console.print(f"  [dim]{escape(line)}[/]", soft_wrap=True)
    console.print(f"[dim]note: {result.note}[/]")
    left = result.leftover_resources
    # Read back from the emulated account after the run, not assumed.
    console.print("leftover resources: " + (", ".join(left) if left else "none (checked: nothing is left)"))
    if result.status == "succeeded":
        console.print(
            f"[bold green]SUCCESS[/] deployment {result.deployment_id} reached InService and passed its smoke "
            f"eval ({result.seconds}s)"
        )
    else:
        console.print("[bold red]FAILED[/] " + escape(f"{result.error}: {result.cause}"))
