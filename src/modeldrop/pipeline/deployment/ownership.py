"""A step that created something and then finds its deployment ended releases it.

On AWS a Lambda task runs on after its execution was stopped (or timed out), and the rule on the
execution's end may already have cleaned up: whatever the task creates after that would be left
behind. So a step that creates resources does it inside `released_if_ended`: when the step fails
for any reason and the deployment has ended by then (its record refuses the write, or says so),
what it created is deleted before the error goes on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts.errors import DeploymentEnded
from modeldrop.contracts.record import ENDED


@contextmanager
def released_if_ended(registry: Registry, deployment_id: str, release: Callable[[], object]) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:
        if isinstance(exc, DeploymentEnded) or _ended(registry, deployment_id):
            release()
        raise


def _ended(registry: Registry, deployment_id: str) -> bool:
    with contextlib.suppress(Exception):  # best effort: the step's own error is the one to report
        record = registry.get(deployment_id)
        return record is not None and record.status in ENDED
    return False
