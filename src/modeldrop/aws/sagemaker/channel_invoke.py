"""Calling a channel that may be asleep, as its clients are told to (docs/operating.md): the channel's
invoke target, and SageMaker Runtime's "no capacity" ValidationError -- and only that -- retried with
backoff for up to the channel's wake time; anything else is an error at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.contracts import clock
from modeldrop.serving.idle_plan import is_waking_error

if TYPE_CHECKING:
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient

FIRST_PAUSE_SECONDS = 5.0
MAX_PAUSE_SECONDS = 30.0


def call_waiting(
    runtime: SageMakerRuntimeClient,
    target: dict[str, str],
    body: bytes,
    wait_seconds: float,
    on_wait: Callable[[float, float], None] | None = None,
) -> dict[str, Any]:
    """One call to TARGET, retrying the waking error for up to WAIT_SECONDS (ON_WAIT(waited, pause) before
    each pause): `answered`, the seconds to the answer and the retries, the body, or the error it ended on."""
    started, retries, pause = clock.utcnow(), 0, FIRST_PAUSE_SECONDS
    while True:
        try:
            response = runtime.invoke_endpoint(Body=body, ContentType="application/json", **target)
            seconds = (clock.utcnow() - started).total_seconds()
            return {"answered": True, "seconds": round(seconds, 1), "retries": retries,
                    "body": response["Body"].read().decode(errors="replace")}  # fmt: skip
        except ClientError as exc:
            error = exc.response.get("Error", {})
            if not is_waking_error(str(error.get("Code")), str(error.get("Message"))):
                return {"answered": False, "error": f"{error.get('Code')}: {error.get('Message')}", "retries": retries}
        waited = (clock.utcnow() - started).total_seconds()
        if waited >= wait_seconds:
            asleep = f"ChannelAsleep: still waking after {waited:.0f} s (its wake time: {wait_seconds:.0f} s)"
            return {"answered": False, "retries": retries, "seconds": round(waited, 1), "error": asleep}
        if on_wait is not None:
            on_wait(waited, pause)
        retries += 1
        clock.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE_SECONDS)
