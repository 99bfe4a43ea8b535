"""deploy, list, status, extend, teardown: driving a deployed stack."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from rich.table import Table

from modeldrop.cli._shared import app, console, fail
from modeldrop.errors import ModeldropError

# ---- operating a deployed stack ----------------------------------------------------------------
StackOpt = Annotated[
    str, typer.Option("--stack", envvar="MODELDROP_STACK", help="the SAM stack's name (env MODELDROP_STACK)")
]
RegionOpt = Annotated[str | None, typer.Option(help="AWS region (default: the SDK's configuration)")]


@contextmanager
def _aws_errors() -> Iterator[None]:
    """What a user can get wrong about AWS becomes one line and exit 2, never a traceback."""
    from botocore.exceptions import (
        BotoCoreError,
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
        NoRegionError,
    )

    try:
        yield
    except ModeldropError as exc:
        fail(exc.message, exc.hint)
    except NoCredentialsError:
        fail("no AWS credentials found", "configure them (aws configure, AWS_PROFILE, or an instance role)")
    except NoRegionError:
        fail("no AWS region configured", "pass --region or set AWS_REGION")
    except EndpointConnectionError as exc:
        fail(f"cannot reach AWS: {exc}", "check the region name and the network")
    except ClientError as exc:
        err = exc.response.get("Error", {})
        fail(f"AWS refused {exc.operation_name}: {err.get('Code')}: {err.get('Message')}")
    except BotoCoreError as exc:
        fail(f"AWS SDK: {exc}")


def _session(region: str | None) -> Any:
    import boto3

    # AWS_REGION is what other SDKs and Lambda read; botocore reads only AWS_DEFAULT_REGION.
    session = boto3.session.Session(region_name=region or os.environ.get("AWS_REGION") or None)
    if session.region_name is None:
        fail("no AWS region configured", "pass --region or set AWS_REGION")
    return session


def _stack(session: Any, stack: str) -> Any:
    from modeldrop.operate import stack_info

    return stack_info(session.client("cloudformation"), stack, session.region_name)


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
    instance_type: Annotated[str | None, typer.Option(help="e.g. ml.g6.2xlarge (stack default otherwise)")] = None,
    ttl: Annotated[str | None, typer.Option(help="time to live, e.g. 90m, 4h, 2d (stack default otherwise)")] = None,
    eval_set: Annotated[str | None, typer.Option(help="s3:// URI of a JSONL eval set")] = None,
    name: Annotated[str | None, typer.Option(help="execution name (unique per state machine)")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="follow the execution and exit with its outcome")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Start a deployment on the stack's state machine (the same request schema the S3 starter uses)."""
    from pydantic import ValidationError

    from modeldrop.errors import describe_validation
    from modeldrop.execution_watch import watch
    from modeldrop.models import DeploymentRequest
    from modeldrop.operate import parse_ttl, start_deployment

    with _aws_errors():
        fields: dict[str, Any] = {
            "artifact_uri": artifact,
            "engine": engine,
            "instance_type": instance_type,
            "ttl_hours": parse_ttl(ttl) if ttl else None,
            "eval_set_uri": eval_set,
        }
        try:
            request = DeploymentRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            fail(f"invalid deployment request: {describe_validation(exc)}")
        session = _session(region)
        info = _stack(session, stack)
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
                    "cause": desc.get("cause"),
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
        console.print(f"[bold red]{desc['status']}[/] {desc.get('error')}: {desc.get('cause')}")
    raise typer.Exit(0 if desc["status"] == "SUCCEEDED" else 1)


@app.command("list")
def list_cmd(
    stack: StackOpt = "modeldrop", region: RegionOpt = None, as_json: Annotated[bool, typer.Option("--json")] = False
) -> None:
    """Deployments in the registry, newest first, with cost so far (or final cost)."""
    from modeldrop.operate import list_deployments, row_for

    with _aws_errors():
        session = _session(region)
        info = _stack(session, stack)
        rows = [row_for(item) for item in list_deployments(session.resource("dynamodb").Table(info.table_name))]
    if as_json:
        print(json.dumps([r.model_dump() for r in rows]))
        return
    table = Table(title=f"deployments in {info.stack_name} ({info.region})")
    for col in ("deployment", "status", "endpoint", "engine", "instance", "age", "expires in", "cost"):
        table.add_column(col)
    for r in rows:
        cost = "-" if r.cost_usd is None else f"${r.cost_usd:.2f}" + ("" if r.cost_is_final else " so far")
        table.add_row(
            r.deployment_id,
            r.status,
            r.endpoint_name or "-",
            r.engine or "-",
            r.instance_type or "-",
            _ago(r.age_hours),
            _ago(r.expires_in_hours),
            cost,
        )
    console.print(table)


@app.command("status")
def status_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """One deployment in full: steps, failure class and FailureReason, cost, links to logs and the execution."""
    from modeldrop.operate import console_links, find_deployment, row_for

    with _aws_errors():
        session = _session(region)
        info = _stack(session, stack)
        item = find_deployment(session.resource("dynamodb").Table(info.table_name), deployment)
    row = row_for(item)
    steps_done = {k: json.loads(v) for k, v in (item.get("steps") or {}).items()}
    failure = steps_done.get("failure") or {}
    data = {
        **{k: v for k, v in item.items() if k not in ("steps", "request")},
        "request": json.loads(item["request"]) if item.get("request") else None,
        "cost_usd": row.cost_usd,
        "cost_is_final": row.cost_is_final,
        "failure": failure or None,
        "links": console_links(info, item),
        "steps": steps_done,
    }
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
    cost = "-" if row.cost_usd is None else f"${row.cost_usd:.2f}" + (" (final)" if row.cost_is_final else " so far")
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


@app.command("extend")
def extend_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    ttl: Annotated[str, typer.Option(help="new time to live from now, e.g. 4h")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
) -> None:
    """Move a live deployment's expiry: the endpoint's tag and the record together."""
    from modeldrop.operate import extend, parse_ttl

    with _aws_errors():
        hours = parse_ttl(ttl)
        session = _session(region)
        info = _stack(session, stack)
        item = extend(
            session.client("sagemaker"), session.resource("dynamodb").Table(info.table_name), info, deployment, hours
        )
    console.print(f"{item['deployment_id']}: {item['endpoint_name']} now expires at {item['expires_at']}")


@app.command("teardown")
def teardown_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id or endpoint name")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
) -> None:
    """Delete a managed endpoint now (endpoint, config, model) and record it; refuses unmanaged ones."""
    from modeldrop.operate import teardown

    with _aws_errors():
        session = _session(region)
        info = _stack(session, stack)
        result = teardown(
            session.client("sagemaker"),
            session.resource("dynamodb").Table(info.table_name),
            session.client("events"),
            info,
            deployment,
        )
    record = result.get("record") or {}
    console.print("deleted: " + (", ".join(result["deleted"]) or "nothing (already gone)"))
    if record:
        from modeldrop.registry import cost_so_far

        console.print(f"{record['deployment_id']} torn down; final cost ${cost_so_far(record) or 0:.2f}")
