"""What every handler shares: Powertools objects, input parsing, and the error contract.

Handlers raise domain errors (modeldrop.contracts.errors) unchanged so Step Functions routes on their class
names. A malformed event is a wiring bug between two steps (the user's request is parsed, and refused
as RequestInvalid, by NormalizeRequest alone): StepContractViolated, class internal, with the field.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from aws_lambda_powertools import Logger, Metrics, Tracer
from pydantic import BaseModel, ValidationError

from modeldrop.contracts import clock
from modeldrop.contracts.errors import StepContractViolated, describe_validation

logger = Logger()
tracer = Tracer()
metrics = Metrics()

In = TypeVar("In", bound=BaseModel)


def parse(model: type[In], event: Any) -> In:
    try:
        return model.model_validate(event)
    except ValidationError as exc:
        raise StepContractViolated(
            f"internal error: {_function_name(model)} was given a malformed payload: {describe_validation(exc)}"
        ) from None


def _function_name(model: type[BaseModel]) -> str:
    # The deployed function's name; in the local stack the handler module is named after its directory.
    return os.environ.get("AWS_LAMBDA_FUNCTION_NAME") or model.__module__.removeprefix("modeldrop_fn_")


@contextmanager
def time_budget(context: Any) -> Iterator[None]:
    """Within, clock.time_left() is the Lambda's remaining time: loops that wait (component settling,
    the eval's cases) stop before the Lambda's timeout instead of being killed by it."""
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        yield
        return
    with clock.budget(lambda: remaining() / 1000):
        yield


def handler(
    model: type[In],
) -> Callable[[Callable[[In, Any], BaseModel | dict[str, Any]]], Callable[[dict[str, Any], Any], dict[str, Any]]]:
    """Parse the event into ``model``, tag logs with the deployment id, return JSON-ready output."""

    def wrap(fn: Callable[[In, Any], BaseModel | dict[str, Any]]) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
        @functools.wraps(fn)
        def run(event: dict[str, Any], context: Any) -> dict[str, Any]:
            logger.remove_keys(["deployment_id"])
            parsed = parse(model, event)
            deployment_id = getattr(parsed, "deployment_id", None) or getattr(
                getattr(parsed, "request", None), "deployment_id", None
            )
            if deployment_id:
                logger.append_keys(deployment_id=deployment_id)
            with time_budget(context):
                result = fn(parsed, context)
            return result.model_dump(mode="json") if isinstance(result, BaseModel) else result

        return run

    return wrap
