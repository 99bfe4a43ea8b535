"""deploy, list, status, extend, teardown: driving a deployed stack."""

from __future__ import annotations

import json
import os
from typing import Annotated, Any

import typer
from rich.table import Table

from modeldrop.cli._shared import app, aws_errors, console, fail, instance_choice, json_mode, minutes, session_for
from modeldrop.contracts.errors import cause_message

# ---- operating a deployed stack ----------------------------------------------------------------
StackOpt = Annotated[
    str, typer.Option("--stack", envvar="MODELDROP_STACK", help="the SAM stack's name (env MODELDROP_STACK)")
]
RegionOpt = Annotated[str | None, typer.Option(help="AWS region (default: the SDK's configuration)")]


def _connect(stack: str, region: str | None) -> tuple[Any, Any, Any]:
    """(boto3 session, the stack's outputs, the deployments table)."""
    from modeldrop.operate.deployments import stack_info

    session = session_for(region)
    info = stack_info(session.client("cloudformation"), stack, session.region_name)
    return session, info, session.resource("dynamodb").Table(info.table_name)


def _ago(hours: float | None) -> str:
    if hours is None:
        return "-"
    if abs(hours) < 1:
        return f"{hours * 60:.0f}m"
    return f"{hours:.1f}h" if abs(hours) < 48 else f"{hours / 24:.1f}d"


@app.command("deploy")
def deploy_cmd(
    artifact: Annotated[str, typer.Argument(help="s3://bucket/key.tar.gz or s3://bucket/prefix/")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    engine: Annotated[str | None, typer.Option(help="vllm | sglang | lmi (stack default otherwise)")] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(help="e.g. ml.g6.2xlarge (stack default otherwise); a comma list tried in order, or 'auto'"),
    ] = None,
    quota_wait: Annotated[
        str | None, typer.Option(help="wait this long for a type at its endpoint quota, e.g. 30m (default: 0)")
    ] = None,
    max_hourly_price: Annotated[
        float | None, typer.Option(help="USD per instance-hour: dearer types are never tried")
    ] = None,
    ttl: Annotated[str | None, typer.Option(help="time to live, e.g. 90m, 4h, 2d (stack default otherwise)")] = None,
    eval_set: Annotated[str | None, typer.Option(help="s3:// URI of a JSONL eval set")] = None,
    name: Annotated[str | None, typer.Option(help="execution name (unique per state machine)")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the execution and exit with its outcome")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Start a deployment on the stack's state machine (the same request schema the S3 starter uses)."""
    json_mode(as_json)
    from pydantic import ValidationError

    from modeldrop.aws.execution_watch import watch
    from modeldrop.contracts.errors import describe_validation
    from modeldrop.contracts.models import DeploymentRequest
    from modeldrop.operate.deployments import parse_ttl, start_deployment

    with aws_errors():
        fields: dict[str, Any] = {
            "artifact_uri": artifact,
            "engine": engine,
            **instance_choice(instance_type),
            "ttl_hours": parse_ttl(ttl) if ttl else None,
            "eval_set_uri": eval_set,
            "quota_wait_minutes": minutes("--quota-wait", quota_wait),
            "max_hourly_price": max_hourly_price,
        }
        try:
            request = DeploymentRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            fail(f"invalid deployment request: {describe_validation(exc)}")
        session, info, _table = _connect(stack, region)
        sfn = session.client("stepfunctions")
        arn = start_deployment(sfn, info, request, name)
        if not as_json:
            console.print(f"started {arn}")
        if not wait:
            if as_json:
                print(json.dumps({"execution_arn": arn}))
            raise typer.Exit(0)

        def show(state: Any) -> None:
            if not as_json:
                mark = "[green]ok[/]" if state.outcome == "ok" else f"[red]{state.outcome}[/]"
                console.print(f"  {state.name:<22} {mark:<28} {state.seconds:8.1f}s")

        desc, states = watch(sfn, arn, show, poll_seconds=float(os.environ.get("MODELDROP_POLL_SECONDS", "5")))
    output = json.loads(desc["output"]) if desc.get("output") else None
    if as_json:
        print(
            json.dumps(
                {
                    "execution_arn": arn,
                    "status": desc["status"],
                    "error": desc.get("error"),
                    "cause": cause_message(desc.get("cause")),
                    "output": output,
                    "states": [s.model_dump() for s in states],
                },
                default=str,
            )
        )
    elif desc["status"] == "SUCCEEDED":
        out = output or {}
        console.print(
            f"[bold green]SUCCEEDED[/] endpoint {out.get('endpoint_name')}; eval: "
            f"{(out.get('eval') or {}).get('summary')}; details: modeldrop status {out.get('deployment_id')}"
        )
    else:
        console.print(f"[bold red]{desc['status']}[/] {desc.get('error')}: {cause_message(desc.get('cause'))}")
    raise typer.Exit(0 if desc["status"] == "SUCCEEDED" else 1)


@app.command("list")
def list_cmd(
    stack: StackOpt = "modeldrop", region: RegionOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Deployments in the registry, newest first, with cost so far (or final cost)."""
    json_mode(as_json)
    from modeldrop.operate.deployments import list_deployments, row_for

    with aws_errors():
        _session, info, table = _connect(stack, region)
        rows = [row_for(item) for item in list_deployments(table)]
    if as_json:
        print(json.dumps([r.model_dump() for r in rows]))
        return
    view = Table(title=f"deployments in {info.stack_name} ({info.region})")
    for col in ("deployment", "status", "endpoint", "engine", "instance", "age", "expires in", "cost"):
        view.add_column(col)
    for r in rows:
        cost = "-" if r.cost_usd is None else f"${r.cost_usd:.2f}" + ("" if r.cost_is_final else " so far")
        view.add_row(
            r.deployment_id,
            r.status,
            r.endpoint_name or "-",
            r.engine or "-",
            r.instance_type or "-",
            _ago(r.age_hours),
            _ago(r.expires_in_hours),
            cost,
        )
    console.print(view)


@app.command("status")
def status_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One deployment in full: steps, failure class and FailureReason, cost, links to logs and the execution."""
    json_mode(as_json)
    from modeldrop.operate.deployments import deployment_status, find_deployment

    with aws_errors():
        _session, info, deployments = _connect(stack, region)
        item = find_deployment(deployments, deployment)
    data = deployment_status(info, item)
    failure = data["failure"] or {}
    steps_done = data["steps"]
    if as_json:
        print(json.dumps(data, default=str))
        return
    table = Table(show_header=False, box=None)
    for key in ("deployment_id", "status", "endpoint_name", "engine", "instance_type", "instance_count", "region"):
        table.add_row(key, str(item.get(key, "-")))
    price = item.get("hourly_price")
    table.add_row("hourly price", f"${price}/h (catalog of {item.get('price_read_on')})" if price else "-")
    table.add_row("started / ended", f"{item.get('started_at', '-')} / {item.get('ended_at', '-')}")
    table.add_row("expires at", str(item.get("expires_at", "-")))
    cost_usd = data["cost_usd"]
    cost = "-" if cost_usd is None else f"${cost_usd:.2f}" + (" (final)" if data["cost_is_final"] else " so far")
    table.add_row("cost", cost)
    if failure:
        table.add_row("error", f"{failure.get('error')} (class {failure.get('failure_class')})")
        table.add_row("FailureReason", str(item.get("failure_reason", "-")))
        if failure.get("diagnosis"):
            table.add_row("diagnosis", f"{failure['diagnosis']}; fix: {failure.get('hint')}")
    evaluation = steps_done.get("smoke_eval")
    if evaluation:
        table.add_row("eval", f"{evaluation.get('summary')} ({evaluation.get('report_markdown_uri')})")
    for label, url in data["links"].items():
        table.add_row(label.replace("_", " "), url)
    console.print(table)
    attempts = steps_done.get("attempts") or []
    if attempts:
        tries = Table(title="instance types tried before this one (capacity fallback)")
        for col in ("#", "instance type", "error", "minutes", "cost at most", "ended at"):
            tries.add_column(col, overflow="fold")
        for a in attempts:
            cost_at_most = a.get("cost_usd_at_most")
            tries.add_row(
                str(a.get("attempt")),
                str(a.get("instance_type")),
                str(a.get("error")),
                f"{a.get('minutes', 0):.1f}",
                "-" if cost_at_most is None else f"${cost_at_most:.2f}",
                str(a.get("ended_at", "-")),
            )
        console.print(tries)


@app.command("extend")
def extend_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    ttl: Annotated[str, typer.Option(help="new time to live from now, e.g. 4h")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Move a live deployment's expiry: the endpoint's tag and the record together."""
    json_mode(as_json)
    from modeldrop.operate.deployments import extend, parse_ttl

    with aws_errors():
        hours = parse_ttl(ttl)
        session, info, table = _connect(stack, region)
        item = extend(session.client("sagemaker"), table, info, deployment, hours)
    if as_json:
        print(json.dumps({k: item.get(k) for k in ("deployment_id", "endpoint_name", "expires_at")}))
        return
    console.print(f"{item['deployment_id']}: {item['endpoint_name']} now expires at {item['expires_at']}")


@app.command("teardown")
def teardown_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Delete a managed endpoint now (endpoint, config, model) and record it; refuses unmanaged ones."""
    json_mode(as_json)
    from modeldrop.operate.deployments import teardown

    with aws_errors():
        session, info, table = _connect(stack, region)
        result = teardown(
            session.client("sagemaker"), table, session.client("events"), info, deployment, s3=session.client("s3")
        )
    record = result.get("record") or {}
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "record"} | {"record": record}, default=str))
        return
    console.print("deleted: " + (", ".join(result["deleted"]) or "nothing (already gone)"))
    if record:
        from modeldrop.aws.registry import cost_so_far

        console.print(f"{record['deployment_id']} torn down; final cost ${cost_so_far(record) or 0:.2f}")
