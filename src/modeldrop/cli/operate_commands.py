"""deploy, list, status, extend, teardown: driving a deployed stack."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.markup import escape
from rich.table import Table

from modeldrop.cli._shared import (
    EnvOpt,
    ForceOpt,
    InstanceCountOpt,
    MaxErrorsOpt,
    MaxHourlyPriceOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    MaxTruncatedOpt,
    QuotaWaitOpt,
    SecretOpt,
    app,
    aws_errors,
    console,
    engine_options,
    fail,
    fields,
    instance_choice,
    json_mode,
    request_fields,
    session_for,
)
from modeldrop.cli.channel_view import _attempts_table, _status_rows
from modeldrop.contracts.errors import cause_message

if TYPE_CHECKING:
    from modeldrop.aws.dynamodb.registry import Registry

# ---- operating a deployed stack ----------------------------------------------------------------
StackOpt = Annotated[
    str, typer.Option("--stack", envvar="MODELDROP_STACK", help="the SAM stack's name (env MODELDROP_STACK)")
]
RegionOpt = Annotated[str | None, typer.Option(help="AWS region (default: the SDK's configuration)")]
ProfileOpt = Annotated[str | None, typer.Option(help="AWS named profile (default: AWS_PROFILE or the default)")]


def _connect(stack: str, region: str | None, profile: str | None = None) -> tuple[Any, Any, Registry]:
    """(boto3 session, the stack's outputs, the deployments registry)."""
    from modeldrop.aws.dynamodb.registry import Registry
    from modeldrop.operate.aws_problems import connection_problem
    from modeldrop.operate.deployments import stack_info

    if problem := connection_problem():  # a stopped local stack: said at once, not after the SDK's retries
        fail(problem[0], problem[1], error=problem[2])
    session = session_for(region, profile)
    info = stack_info(session.client("cloudformation"), stack, session.region_name)
    return session, info, Registry(session.resource("dynamodb").Table(info.table_name))


def _ago(hours: float | None) -> str:
    if hours is None:
        return "-"
    if abs(hours) < 1:
        return f"{hours * 60:.0f}m"
    return f"{hours:.1f}h" if abs(hours) < 48 else f"{hours / 24:.1f}d"


@app.command("deploy")
@engine_options
def deploy_cmd(
    artifacts: Annotated[
        list[str],
        typer.Argument(
            help="s3://bucket/key.tar.gz or s3://bucket/prefix/; with --base --adapter-mode shared, one or more "
            "adapters, each an adapter inference component on the one base endpoint",
            metavar="ARTIFACT...",
        ),
    ],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    engine: Annotated[str | None, typer.Option(help="vllm | sglang | lmi (stack default otherwise)")] = None,
    instance_type: Annotated[
        str | None,
        typer.Option(help="e.g. ml.g6.2xlarge (stack default otherwise); a comma list tried in order, or 'auto'"),
    ] = None,
    quota_wait: QuotaWaitOpt = None,
    max_hourly_price: MaxHourlyPriceOpt = None,
    instance_count: InstanceCountOpt = 1,
    ttl: Annotated[str | None, typer.Option(help="time to live, e.g. 90m, 4h, 2d (stack default otherwise)")] = None,
    eval_set: Annotated[str | None, typer.Option(help="s3:// URI of a JSONL eval set")] = None,
    base: Annotated[
        str | None, typer.Option(help="ARTIFACT is a LoRA adapter: the base checkpoint it is served on (s3://...)")
    ] = None,
    adapter_mode: Annotated[
        str | None, typer.Option(help="with --base: shared (vLLM's default) or dedicated (LMI's and SGLang's)")
    ] = None,
    base_endpoint: Annotated[
        str | None,
        typer.Option(
            help="ARTIFACT... are LoRA adapters for a live shared deployment (its id or endpoint): added to its "
            "endpoint as adapter inference components, as a deployment of their own"
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="execution name (unique per state machine)")] = None,
    endpoint_name: Annotated[
        str | None, typer.Option(help="the endpoint's name, starting with the stack's resource prefix and a dash")
    ] = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_model_len: MaxModelLenOpt = None,
    env: EnvOpt = None,
    force: ForceOpt = False,
    secret: SecretOpt = None,
    max_truncated: MaxTruncatedOpt = None,
    max_errors: MaxErrorsOpt = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="follow the execution and exit with its outcome (the default)")
    ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    named_settings: dict[str, Any] | None = None,  # the engine_options, filled by its decorator
) -> None:
    """Start a deployment on the stack's state machine (the same request schema the S3 starter uses)."""
    json_mode(as_json)
    local = next((a for a in artifacts if not a.startswith("s3://") and Path(a).exists()), None)
    if local is not None:
        fail(
            f"deploy takes what is in S3, and {local!r} is a local path",
            f"a local checkpoint goes up first: modeldrop upload {local} s3://BUCKET/runs/NAME/model/ (its marker "
            "starts the deployment)",
            error="RequestInvalid",
        )
    from pydantic import ValidationError

    from modeldrop.contracts.errors import describe_validation
    from modeldrop.contracts.models import DeploymentRequest
    from modeldrop.operate.deployments import parse_ttl, start_deployment

    with aws_errors():
        artifact = artifacts[0]
        fields: dict[str, Any] = {
            "artifact_uri": artifact,
            "adapters": artifacts[1:] or None,
            "engine": engine,
            **instance_choice(instance_type),
            "ttl_hours": parse_ttl(ttl) if ttl else None,
            "eval_set_uri": eval_set,
            "base": base,
            "adapter_mode": adapter_mode,
            "base_endpoint": base_endpoint,
            "endpoint_name": endpoint_name,
            **request_fields({**locals(), **(named_settings or {})}),
        }
        try:
            request = DeploymentRequest.model_validate({k: v for k, v in fields.items() if v is not None})
        except ValidationError as exc:
            fail(f"invalid deployment request: {describe_validation(exc)}")
        session, info, _table = _connect(stack, region, profile)
        sfn = session.client("stepfunctions")
        arn = start_deployment(sfn, info, request, name)
        if not as_json:
            console.print(f"started {arn}")
        if not wait:
            if as_json:
                print(json.dumps({"execution_arn": arn}))
            raise typer.Exit(0)

        follow(sfn, arn, as_json)


def waited_result(desc: dict[str, Any], arn: str, output: dict[str, Any] | None) -> dict[str, Any]:
    """What every command that waits on a deployment prints as JSON (run-local, deploy --wait, upload
    --wait; docs/deploying.md "What a waiting command prints"): the deployment id and its outcome at
    the top, lower case, as run-local gives them; the execution and its raw output beside them."""
    from modeldrop.aws.execution_watch import outcome
    from modeldrop.contracts.models import deployment_id_of

    status, error = outcome(desc)
    return {
        "deployment_id": (output or {}).get("deployment_id") or deployment_id_of(desc),
        "status": status,
        "error": error,
        "cause": cause_message(desc.get("cause")),
        "endpoint_name": (output or {}).get("endpoint_name"),
        "execution_arn": arn,
        "execution_status": desc["status"],
        "output": output,
    }


def follow(sfn: Any, arn: str, as_json: bool, extra: dict[str, Any] | None = None) -> None:
    """Follow the execution ARN state by state and print its outcome (as JSON: with EXTRA fields)."""
    from modeldrop.aws.execution_watch import watch
    from modeldrop.cli.states import StatePrinter

    printer = StatePrinter("8.1f")
    live = None if as_json or not console.is_terminal else console.status("following the execution")

    def show(state: Any) -> None:
        if as_json:
            return
        printer.show(state)
        if live is not None:  # one line that updates while a wait loop goes round
            live.update(f"after {state.name}: {printer.waiting() or 'following the execution'}")

    if live is not None:
        live.start()
    try:
        desc, states = watch(sfn, arn, show, poll_seconds=float(os.environ.get("MODELDROP_POLL_SECONDS", "5")))
    except KeyboardInterrupt:
        if live is not None:
            live.stop()
        printer.flush()
        _interrupted(sfn, arn, as_json)
    finally:
        if live is not None:
            live.stop()
        printer.flush()
    output = json.loads(desc["output"]) if desc.get("output") else None
    if as_json:
        result = {**(extra or {}), **waited_result(desc, arn, output), "states": [s.model_dump() for s in states]}
        print(json.dumps(result, default=str))
    elif desc["status"] == "SUCCEEDED":
        out = output or {}
        console.print(
            f"[bold green]SUCCEEDED[/] endpoint {out.get('endpoint_name')}; eval: "
            f"{(out.get('eval') or {}).get('summary')}; details: modeldrop status {out.get('deployment_id')}"
        )
    else:
        console.print(f"[bold red]{desc['status']}[/] {desc.get('error')}: {cause_message(desc.get('cause'))}")
        console.print(f"details: modeldrop status {_deployment_of(desc)}", highlight=False)
    raise typer.Exit(0 if desc["status"] == "SUCCEEDED" else 1)


def _deployment_of(desc: dict[str, Any]) -> str:
    """The deployment id the execution DESC registers (its name and start time make it)."""
    from modeldrop.contracts.models import deployment_id_for, epoch_ms

    return deployment_id_for(str(desc["name"]), epoch_ms(desc["startDate"]))


def _interrupted(sfn: Any, arn: str, as_json: bool) -> NoReturn:
    """Ctrl-C while following: the wait stops, the deployment does not (it bills until it ends or its TTL
    passes); say so, with its id and the commands that follow and stop it. Exit 130, as an interrupt."""
    desc = sfn.describe_execution(executionArn=arn)
    deployment = _deployment_of(desc)
    said = {"interrupted": True, "deployment_id": deployment, "execution_arn": arn, "status": desc.get("status"),
            "follow": f"modeldrop status {deployment}", "stop": f"modeldrop teardown {deployment}"}  # fmt: skip
    if as_json:
        print(json.dumps(said))
    else:
        console.print(
            f"interrupted: stopped following, but deployment {deployment} goes on ({desc.get('status')}; "
            "an endpoint bills until the deployment ends or its TTL passes)\n"
            f"  follow it: modeldrop status {deployment}\n  stop it:   modeldrop teardown {deployment}\n"
            "  (with the same --stack, --region and --profile)",
            highlight=False,
        )
    raise typer.Exit(130)


@app.command("list")
def list_cmd(
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="also the deployments that ended more than a day ago")
    ] = False,
) -> None:
    """Deployments in the registry, newest first, with cost so far (or final cost); failed and torn
    down ones for a day after they end (--all: every one)."""
    json_mode(as_json)
    from modeldrop.operate.deployment_rows import channel_holds, ended_long_ago, row_for

    with aws_errors():
        _session, info, registry = _connect(stack, region, profile)
        holds = channel_holds(registry)
        records = registry.deployments()
    shown = [r for r in records if show_all or not ended_long_ago(r)]
    rows = [row_for(record, hold=holds.get(record.deployment_id)) for record in shown]
    if as_json:
        print(json.dumps([r.model_dump() for r in rows]))
        return
    title = f"deployments in {info.stack_name} ({info.region})"
    # Ids and endpoint names are what `status`, `teardown` and `eval` take: never cut. Secondary
    # columns go first when the terminal is narrow; narrower still, each deployment is two plain lines.
    ids = max((len(r.deployment_id) for r in rows), default=10)
    names = max((len(r.endpoint_name or "-") for r in rows), default=10)
    if console.width < ids + names + 45:
        _deployment_lines(title, rows)
    else:
        console.print(_deployment_table(title, rows, ids, names, secondary=console.width >= ids + names + 80))
    for row in (r for r in rows if r.status == "rejected"):  # nothing started: say what and why, whole
        console.print(f"{row.deployment_id}: {row.artifact_uri} started nothing: {row.reason}", highlight=False)
    if hidden := len(records) - len(shown):
        console.print(f"{hidden} more ended over a day ago: `modeldrop list --all` shows them", highlight=False)


def _cost_text(row: Any) -> str:
    return "-" if row.cost_usd is None else f"${row.cost_usd:.2f}" + ("" if row.cost_is_final else " so far")


def _deployment_lines(title: str, rows: list[Any]) -> None:
    console.print(title, highlight=False)
    for r in rows:
        console.print(
            f"{r.deployment_id}  {r.status}  {r.instance_type or '-'}  {_cost_text(r)}", highlight=False, markup=False
        )
        if r.endpoint_name:
            console.print(f"  endpoint {r.endpoint_name}", highlight=False, markup=False)


def _deployment_table(title: str, rows: list[Any], ids: int, names: int, secondary: bool) -> Table:
    view = Table(title=title)
    view.add_column("deployment", no_wrap=True, min_width=ids)
    view.add_column("status", no_wrap=True)
    view.add_column("endpoint", no_wrap=True, min_width=names)
    view.add_column("instance", no_wrap=True)
    adapters = any(r.adapter for r in rows)
    if secondary:
        for col in ("engine", "age", "expires in", *(["adapter (on base)"] if adapters else [])):
            view.add_column(col)
    view.add_column("cost", no_wrap=True)
    for r in rows:
        cells = [r.deployment_id, r.status, r.endpoint_name or "-", r.instance_type or "-"]
        if secondary:
            cells += [r.engine or "-", _ago(r.age_hours), _ago(r.expires_in_hours)]
            if adapters:
                cells.append(f"{r.adapter} (on {r.base})" if r.adapter else "-")
        cells.append(_cost_text(r))
        view.add_row(*cells)
    return view


@app.command("status")
def status_cmd(
    deployment: Annotated[str, typer.Argument(help="deployment id, endpoint name, or channel")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """One deployment in full: steps, failure class and FailureReason, cost, links to logs and the
    execution. A channel's name: its serving version, the kept ones and its history with each gate."""
    json_mode(as_json)
    from modeldrop.operate.deployment_rows import channel_holds
    from modeldrop.operate.deployments import attached_to, deployment_status, find_deployment

    with aws_errors():
        session, info, deployments = _connect(stack, region, profile)
        if channel := _channel_named(deployments, deployment):  # a channel's name: the channel
            from modeldrop.cli.channel_view import _show

            return _show(channel, as_json)
        record = find_deployment(deployments, deployment, session.client("sagemaker"))
        others = attached_to(deployments, record.deployment_id) if record.endpoint_name else []
        hold = channel_holds(deployments).get(record.deployment_id)
        data = deployment_status(info, record, session.client("sagemaker"), hold)
    if others:  # a shared base: other deployments' adapters on its endpoint
        data["attached_deployments"] = others
    if as_json:
        print(json.dumps(data, default=str))
        return
    fields(_status_rows(record, data))
    if attempts := record.step("attempts") or []:
        console.print(_attempts_table(attempts))


def _channel_named(registry: Registry, name: str) -> Any:
    from modeldrop.aws.dynamodb.channel_store import ChannelStore

    return ChannelStore(registry.table).get(name)


@app.command("doctor")
def doctor_cmd(
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    instance_type: Annotated[
        str | None, typer.Option(help="the type whose quota to check (default: the stack's DefaultInstanceType)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """What would make the first deploy fail, checked before it (read-only). Exit 0 all pass, 1 any fails.

    The stack's outputs; the SageMaker execution role exists, trusts sagemaker.amazonaws.com and can
    read the artifact bucket; the endpoint quota for the default instance type (0 on new accounts);
    the default image in the region; the reaper's last run; the stack's alarms."""
    json_mode(as_json)
    from modeldrop.operate.doctor import run_checks

    with aws_errors():
        session = session_for(region, profile)
        checks = run_checks(session.client, stack, session.region_name, instance_type, dict(os.environ))
    failed = any(c.status == "fail" for c in checks)
    if as_json:
        print(json.dumps({"ok": not failed, "checks": [c.model_dump() for c in checks]}))
    else:
        marks = {"ok": "[green]ok  [/]", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
        for c in checks:
            console.print(f"{marks[c.status]} {escape(c.name)}: {escape(c.detail)}")
            if c.fix and c.status != "ok":
                console.print(f"     fix: {escape(c.fix)}", soft_wrap=True)
        console.print("[bold green]ready to deploy[/]" if not failed else "[bold red]the first deploy would fail[/]")
    raise typer.Exit(1 if failed else 0)
