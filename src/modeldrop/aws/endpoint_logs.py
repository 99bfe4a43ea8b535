"""What an endpoint's CloudWatch logs say about why it failed, behind the logs client passed in.

"did not pass the ping health check" means either the engine died (CUDA OOM: a bigger startup
timeout will not help) or it loads slowly (it will). The container's last error lines tell which.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.contracts.env_safety import redact

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient

_ERROR_LINE = re.compile(r"error|exception|traceback|killed|exited with code|did not pass|out of memory", re.I)
_OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory", re.I)
_MISSING_WEIGHTS = re.compile(r"weights were not initialized from checkpoint", re.I)


def log_group_for(endpoint_name: str) -> str:
    return f"/aws/sagemaker/Endpoints/{endpoint_name}"


def component_log_group_for(component_name: str) -> str:
    """Where an inference component's container logs (adapter_mode shared: the base's engine)."""
    return f"/aws/sagemaker/InferenceComponents/{component_name}"


@dataclass(frozen=True)
class LogDiagnosis:
    excerpt: list[str]
    diagnosis: str | None
    hint: str | None


def diagnose(lines: list[str]) -> LogDiagnosis:
    """Pure: the error lines worth showing and what they mean. Credential-shaped text in them is
    redacted: these lines are copied into the deployment record."""
    errors = [redact(line.strip()) for line in lines if _ERROR_LINE.search(line)]
    excerpt = errors[-8:]
    text = "\n".join(lines)
    if _OOM.search(text):
        return LogDiagnosis(
            excerpt,
            "the engine ran out of GPU memory while loading",
            "lower max_num_seqs or max_model_len, or use a larger instance type; "
            "a longer startup timeout will not help",
        )
    if _MISSING_WEIGHTS.search(text):
        return LogDiagnosis(
            excerpt,
            "the checkpoint lacks weights the engine expects",
            "run `modeldrop validate SOURCE --base BASE` and `modeldrop repair` to restore them",
        )
    if any("ping did not pass" in line for line in lines) and not errors[:-1]:
        return LogDiagnosis(
            excerpt,
            "the engine was still loading when the startup health check timed out",
            "raise ContainerStartupHealthCheckTimeoutInSeconds (and ModelDataDownloadTimeoutInSeconds for big models)",
        )
    return LogDiagnosis(excerpt, None, None)


def read_recent(
    logs: CloudWatchLogsClient, endpoint_name: str, limit: int = 300, group: str | None = None
) -> list[str] | None:
    """The last lines of the endpoint's (or GROUP's) newest log stream; None when it has no log group
    (no instance, or no such component, started)."""
    group = group or log_group_for(endpoint_name)
    try:
        streams = logs.describe_log_streams(logGroupName=group, orderBy="LastEventTime", descending=True, limit=1)
        if not streams.get("logStreams"):
            return []
        name = streams["logStreams"][0]["logStreamName"]
        events = logs.get_log_events(logGroupName=group, logStreamName=name, startFromHead=False, limit=limit)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ResourceNotFoundException":
            return None
        raise
    return [str(e.get("message", "")) for e in events.get("events", [])]


def ran_since(logs: CloudWatchLogsClient, endpoint_name: str, since: datetime | None) -> bool:
    """Whether a container of this endpoint has started since SINCE (the attempt's CreationTime): an
    instance writes a log stream when it starts the container. Log groups outlive endpoints, so a
    group an earlier endpoint of the same name left says nothing about this one: only a stream
    created since does. Unknown (access denied, throttled) counts as ran: it must never make a live
    start look stuck."""
    try:
        streams = logs.describe_log_streams(
            logGroupName=log_group_for(endpoint_name), orderBy="LastEventTime", descending=True, limit=50
        ).get("logStreams", [])
    except ClientError as exc:
        return exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException"
    if since is None:
        return bool(streams)
    floor = since.timestamp() * 1000 - 1000  # the stream's creationTime is in milliseconds
    return any(int(s.get("creationTime") or 0) >= floor for s in streams)
