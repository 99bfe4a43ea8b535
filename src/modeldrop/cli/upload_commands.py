"""`modeldrop upload DIR s3://bucket/prefix/`: the way a large checkpoint reaches the bucket."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from modeldrop.cli._shared import app, aws_errors, byte_progress, console, fail, json_mode, session_for
from modeldrop.cli.operate_commands import ProfileOpt, RegionOpt, StackOpt, _connect, follow
from modeldrop.contracts.errors import ModeldropError

# How long --wait looks for the execution the marker's upload event starts (EventBridge delivers in seconds).
START_WAIT_SECONDS = 120.0


@app.command("upload")
def upload_cmd(
    directory: Annotated[Path, typer.Argument(help="the checkpoint directory (config, tokenizer, safetensors)")],
    destination: Annotated[str, typer.Argument(help="s3://bucket/prefix/ in the stack's artifact bucket")],
    stack: StackOpt = "modeldrop",
    region: RegionOpt = None,
    profile: ProfileOpt = None,
    validate: Annotated[
        bool, typer.Option("--validate/--no-validate", help="validate the directory before uploading (the default)")
    ] = True,
    engine: Annotated[str | None, typer.Option(help="written to the marker: vllm | sglang | lmi")] = None,
    instance_type: Annotated[str | None, typer.Option(help="written to the marker, e.g. ml.g6e.12xlarge")] = None,
    marker: Annotated[
        bool, typer.Option("--marker/--no-marker", help="write modeldrop.json last, which starts the deployment")
    ] = True,
    wait: Annotated[
        bool, typer.Option("--wait", help="follow the deployment the marker starts, as deploy does")
    ] = False,
    merge_marker: Annotated[
        bool, typer.Option("--merge-marker", help="use DIR's own modeldrop.json, these overrides on top")
    ] = False,
    engine_check: Annotated[
        bool | None,
        typer.Option(
            "--engine-check/--no-engine-check",
            help="ask the engine's own code (the vLLM venv, on CPU) before any byte; default: on where the venv is",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Upload a checkpoint as an S3 prefix: shards in parallel (multipart, SHA-256 checked), objects
    already there with the same size and digest skipped, the modeldrop.json marker last."""
    json_mode(as_json)
    from modeldrop.aws.s3.checkpoint_upload import upload_directory
    from modeldrop.cli.checkpoint_commands import judging_target
    from modeldrop.cli.engine_verdicts import engine_check_off, require_engine
    from modeldrop.contracts.s3uri import parse_s3_uri

    try:
        target = parse_s3_uri(destination)
    except ValueError as exc:
        fail(str(exc), "give s3://bucket/prefix/")
    if not target.is_prefix or not target.key:
        fail(f"{destination} is not a prefix", f"end it with a slash: {destination.rstrip('/')}/")
    if not directory.is_dir():
        fail(f"{directory}: not a directory", "pass the checkpoint's directory")
    overrides = _marker_overrides(directory, engine, instance_type, merge_marker)
    if engine_check:
        require_engine()
    judged = bool(engine_check) or (validate and engine_check_off(asked_off=engine_check is False) is None)
    if validate or engine_check:
        _refuse_before_upload(directory, judging_target(None, overrides.get("engine", engine)), judged, as_json)
    try:
        with aws_errors(domain_errors=False):
            s3 = session_for(region, profile).client("s3")
            with byte_progress("uploading"):
                summary = upload_directory(s3, directory, target.bucket, target.key, marker=marker, overrides=overrides)
    except ModeldropError as exc:
        fail(exc.message, exc.hint, code=2, error=type(exc).__name__)
    result = summary.as_dict()
    if not wait:
        if as_json:
            print(json.dumps(result))
        else:
            console.print(
                f"uploaded {len(summary.uploaded)} file(s), {summary.bytes_uploaded / 1e9:.2f} GB; "
                f"skipped {len(summary.skipped)} already there; "
                + (f"marker written: {summary.marker}" if summary.marker else "marker unchanged (no new deployment)"),
                highlight=False,
            )
        raise typer.Exit(0)
    with aws_errors():
        session, info, _registry = _connect(stack, region, profile)
        arn = _started_by_marker(session, info.state_machine_arn, target.bucket, target.key, summary.marker_version)
        if not as_json:
            console.print(f"uploaded {len(summary.uploaded)} file(s); following {arn}")
        follow(session.client("stepfunctions"), arn, as_json, extra={"upload": result})


def _refuse_before_upload(directory: Path, image: Any, judged: bool, as_json: bool) -> None:
    """Exit 1, nothing uploaded, when DIRECTORY is refused for IMAGE (by the engine too when JUDGED)."""
    from modeldrop.checkpoint.validation import validate_source
    from modeldrop.cli.engine_verdicts import with_engine_check

    with byte_progress("validating"):
        report = validate_source(str(directory), target=image)  # the marker's engine's default image
    if judged:
        report = with_engine_check(report, str(directory), image)
    if report.deployable:
        return
    if as_json:
        print(json.dumps({"uploaded": False, "validation": report.model_dump(mode="json")}))
    else:
        for finding in (f for f in report.findings if f.severity == "error"):
            console.print(f"[red]{finding.code}[/]: {finding.message}\n  fix: {finding.hint}", highlight=False)
        console.print("nothing was uploaded (--no-validate uploads anyway)")
    raise typer.Exit(1)


def _marker_overrides(directory: Path, engine: str | None, instance_type: str | None, merge: bool) -> dict[str, Any]:
    """The marker's settings, checked here with the rules the starter and the plan apply (a marker
    that could never deploy is refused before any upload); DIR's own modeldrop.json only with MERGE."""
    from modeldrop.aws.s3.served_copy import MARKER
    from modeldrop.contracts.errors import RequestInvalid
    from modeldrop.contracts.instance_types import instance_type_problem
    from modeldrop.pipeline.deployment.starter import parse_marker

    if engine is not None and engine not in ("vllm", "sglang", "lmi"):
        fail(f"unknown --engine {engine!r}; choose vllm, sglang or lmi")
    if instance_type is not None and (problem := instance_type_problem(instance_type)):
        fail(f"--instance-type: {problem[0]}", problem[1])
    given = {k: v for k, v in {"engine": engine, "instance_type": instance_type}.items() if v is not None}
    own = directory / MARKER
    if not own.is_file():
        return given
    if not merge:
        fail(
            f"{own} exists: uploading would replace it with the overrides given here",
            "pass --merge-marker to keep its settings (the options given here on top), or remove it",
        )
    try:
        found = parse_marker(own.read_bytes(), str(own))
    except RequestInvalid as exc:
        fail(exc.message, exc.hint)
    return {**found, **given}


def _started_by_marker(session: Any, state_machine_arn: str, bucket: str, prefix: str, version: str | None) -> str:
    """The execution the S3 starter starts for the marker: its name comes from the marker's key and
    version (as the starter derives it), so it is found, not guessed."""
    from modeldrop.aws.s3.served_copy import MARKER
    from modeldrop.pipeline.deployment.starter import execution_name

    key = prefix + MARKER
    if version is None:  # the marker was already there: follow the deployment its version started
        from botocore.exceptions import ClientError

        try:
            version = session.client("s3").head_object(Bucket=bucket, Key=key).get("VersionId")
        except ClientError:
            fail(
                f"no marker at s3://{bucket}/{key}, so no deployment started to follow",
                "upload without --no-marker (the marker starts the deployment), or drop --wait",
            )
    name = execution_name(bucket, key, version)
    arn = state_machine_arn.replace(":stateMachine:", ":execution:") + f":{name}"
    sfn = session.client("stepfunctions")
    deadline = time.monotonic() + START_WAIT_SECONDS
    while True:
        try:
            sfn.describe_execution(executionArn=arn)
            return arn
        except sfn.exceptions.ExecutionDoesNotExist:
            if time.monotonic() > deadline:
                fail(
                    f"no deployment started from s3://{bucket}/{key} within {START_WAIT_SECONDS:.0f} s",
                    "check that the bucket is the stack's artifact bucket and its S3 starter is enabled",
                )
            time.sleep(0.5)
