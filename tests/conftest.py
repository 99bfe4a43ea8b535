from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.setdefault("POWERTOOLS_TRACE_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "CRITICAL")

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def make_stack() -> Iterator[Callable[..., Any]]:
    """Build the emulated stack (with its own hosting) inside one mock_aws; everything stops after."""
    from moto import mock_aws

    from modeldrop import clock
    from modeldrop.local.hosting import LocalHosting
    from modeldrop.local.stack import build_stack

    clock.reset()
    built: list[Any] = []
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):

        def make(parameters: dict[str, str] | None = None, **hosting: Any) -> Any:
            stack = build_stack(ROOT, parameters, hosting=LocalHosting(**hosting))
            built.append(stack)
            return stack

        try:
            yield make
        finally:
            for stack in built:
                stack.close()
    clock.reset()


@pytest.fixture
def stack(make_stack: Callable[..., Any]) -> Any:
    return make_stack()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    from modeldrop.sample_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def archive(checkpoint: Path) -> bytes:
    from modeldrop.sample_checkpoint import tar_gz_bytes

    return tar_gz_bytes(checkpoint)
