"""How `plan` is printed: the fields (image, instance, host, stack limits, env, idle channel, timeouts), the
GPU memory table, the instance types a deployment would try, the findings and the verdict."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from modeldrop.cli._shared import console, fields


def _idle_text(idle: dict[str, Any]) -> str:
    day = f"; always-on ${idle['always_on_day_usd']:.2f} a day" if idle.get("always_on_day_usd") is not None else ""
    if idle["mode"] == "always_on":
        return f"always-on: {idle['reason']}{day}"
    return (
        f"scales to zero after {idle['after_seconds'] // 60} min without a call; a call while asleep is refused "
        f"as waking for up to {idle['wake_seconds']} s (retry){day}, idle hours free"
    )


def plan_summary(report: Any) -> None:
    limits = _limits_text(report)
    fields(_plan_rows(report, limits))
    _memory_table(report.memory)
    _candidates_table(report.candidates)
    for f in report.findings:
        if f.severity != "info":
            console.print(
                f"[yellow]{f.severity.upper()} {f.code}[/]: {f.message}" + (f"\n  fix: {f.hint}" if f.hint else "")
            )
    if report.refused:
        console.print(f"[bold red]REFUSED[/] {report.refused['error']}: {report.refused['message']}")
        if report.refused.get("hint"):
            console.print(f"  fix: {report.refused['hint']}")
    elif limits.startswith(REFUSED_BY_DEFAULTS):
        console.print("[bold yellow]PLAN OK[/] for the engine; a stack with the default limits refuses it (above)")
    else:
        console.print("[bold green]PLAN OK[/]")


def _plan_rows(report: Any, limits: str) -> list[tuple[str, str]]:
    price = f"  ${report.hourly_price:.2f}/h" if report.hourly_price else ""
    if report.instance_count > 1:
        price += f" each, ${report.hourly_cost:.2f}/h for all" if report.hourly_cost else ""
    times = f" x {report.instance_count}" if report.instance_count > 1 else ""
    rows = [("engine / region", f"{report.engine} / {report.region}"), ("image", str(report.image or "-"))]
    if report.image_source:
        rows.append(("image source", str(report.image_source)))
    if not price:
        price = f"  no price for {report.region} in the catalog: a stack with MaxHourlyPrice refuses it"
    rows += [
        ("instance", report.instance_type + times + price),
        ("host", _host_text(report)),
        ("stack limits", limits),
        ("env", "\n".join(f"{k}={v}" for k, v in sorted(report.env.items())) or "-"),
    ]
    if report.idle:
        rows.append(("idle channel", _idle_text(report.idle)))
    return rows + [(key.replace("_", " "), str(value)) for key, value in report.timeouts.items()]


def _host_text(report: Any) -> str:
    host = report.host or {}
    ami = report.inference_ami_version or "the family's default (no InferenceAmiVersion)"
    driver = host.get("driver")
    note = str(host.get("note") or "")
    if note.startswith(f"{ami} (NVIDIA driver {driver})"):  # the note says the AMI and driver itself: once
        return note
    return f"{ami}, NVIDIA driver {driver or 'unknown'}" + (f"\n{note}" if note else "")


REFUSED_BY_DEFAULTS = "a default stack refuses it:"


def _limits_text(report: Any) -> str:
    """The default stack's limits this plan meets or passes (a deployed stack's own may differ)."""
    from modeldrop.pipeline.limits import StackLimits

    limits = StackLimits.model_validate({})
    problems = limits.capacity_problems([report.instance_type], report.instance_count, report.region)
    if not problems:
        return (
            f"within the default stack's (AllowedInstanceTypes {', '.join(limits.allowed_instance_types)}; "
            f"MaxHourlyPrice ${limits.max_hourly_price:g}/h; MaxInstanceCount {limits.max_instance_count})"
        )
    passed = "; ".join(f"{what} ({name})" for name, what in problems)
    return f"{REFUSED_BY_DEFAULTS} {passed} (sam deploy --parameter-overrides to raise)"


def _memory_table(memory: dict[str, Any]) -> None:
    from modeldrop.serving.memory_plan import MIN_KV_GIB

    if memory.get("budget_gib") is None:
        return
    mem = Table(title=f"GPU memory per GPU on {memory['instance_type']} (TP {memory['tensor_parallel']})")
    mem.add_column("item")
    mem.add_column("GiB", justify="right")
    for label, key in (
        ("budget (capacity x fraction)", "budget_gib"),
        ("weights", "weights_gib"),
        ("sampler buffer", "sampler_gib"),
        ("activations + CUDA graphs", "overhead_gib"),
        ("left for KV cache", "kv_cache_gib"),
        ("KV needed for one full sequence*", "kv_min_gib"),
        ("headroom", "headroom_gib"),
    ):
        mem.add_row(label, f"{memory[key]:.3f}")
    console.print(mem)
    console.print(
        f"* the KV of one sequence of max_model_len tokens, at least {MIN_KV_GIB} GiB: below that vLLM cannot "
        "allocate enough KV blocks to start, however short the sequences",
        soft_wrap=False,
    )
    colour = {"fits": "green", "tight": "yellow"}.get(memory["verdict"], "red")
    console.print(f"memory verdict: [{colour}]{memory['verdict']}[/]")


def _candidates_table(candidates: list[Any]) -> None:
    if not candidates:
        return
    tries = Table(title="instance types a deployment would try, in order")
    for col in ("#", "instance type", "verdict", "$/h", "note"):
        tries.add_column(col, overflow="fold")
    n = 0
    for c in candidates:
        n += c.usable
        tries.add_row(
            str(n) if c.usable else "-",
            c.instance_type,
            c.verdict if c.usable else f"{c.verdict} (skipped)",
            f"{c.hourly_price:.2f}" if c.hourly_price is not None else "-",
            c.reason[:120],
        )
    console.print(tries)
