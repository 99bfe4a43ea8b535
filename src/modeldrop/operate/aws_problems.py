"""What a user did wrong about AWS, in their words: (message, fix, error name) for `fail`, or None.

Kept apart from the error handler so each answer can be read (and tested) on its own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Problem = tuple[str, str, str]


def region_problem(region: str) -> Problem | None:
    """A region SageMaker has in no partition (botocore's own endpoint data), with the close match."""
    import boto3

    from modeldrop.contracts.text import nearest

    session = boto3.session.Session()
    known = {r for p in session.get_available_partitions() for r in session.get_available_regions("sagemaker", p)}
    if not known or region in known:
        return None
    close = nearest(region, sorted(known), most=3)
    return (
        f"{region!r} is not a region SageMaker runs in" + (f" (did you mean {close[0]}?)" if close else ""),
        "pass --region (or set AWS_REGION) to one of botocore's SageMaker regions, e.g. us-east-1 (a region "
        "newer than this botocore: pip install -U botocore)",
        "RegionUnknown",
    )


def client_error_problem(detail: dict[str, Any]) -> Problem | None:
    """An AWS refusal a user causes and can fix, said with the fix."""
    if detail.get("Code") == "NoSuchBucket":
        name = detail.get("BucketName")
        return (
            f"no S3 bucket {name or 'of that name'} exists (or it is not visible to these credentials)",
            "check the bucket's name; the stack's own is its ArtifactBucketName output (`modeldrop doctor` shows it), "
            "or create one: aws s3 mb s3://NAME",
            "NoSuchBucket",
        )
    return None


def connection_problem() -> Problem | None:
    """A refused connection where the shell's exports came from `local up`: its stack is stopped."""
    if problem := stopped_stack_problem():
        return (
            problem,
            'start it again: eval "$(modeldrop local up)" (or `modeldrop local env` for the running one); '
            "to reach AWS instead, open a new shell",
            "LocalStackStopped",
        )
    return None


def stopped_stack_problem(environ: dict[str, str] | None = None) -> str | None:
    """Why a connection to AWS_ENDPOINT_URL failed when the shell's exports came from `local up`: the
    stack it names is stopped (or was restarted elsewhere). None: not a local stack's exports."""
    env = os.environ if environ is None else environ
    state, endpoint = env.get("MODELDROP_LOCAL_STATE"), env.get("AWS_ENDPOINT_URL")
    if not state or not endpoint:
        return None
    path = Path(state)
    try:
        running = json.loads(path.read_text())
    except (OSError, ValueError):
        return f"the local stack this shell's exports point at ({path.stem}) is stopped: `local down` ended it"
    if running.get("endpoint_url") != endpoint:
        return (
            f"the local stack {path.stem} was restarted at {running.get('endpoint_url')}; this shell's exports "
            f"still point at {endpoint}"
        )
    return None
