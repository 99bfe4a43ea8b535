from __future__ import annotations

import os
from collections.abc import Iterator
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

CHAT_OK: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16},
}
CHAT_CUT: dict[str, Any] = {
    **CHAT_OK,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello th"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 12, "completion_tokens": 64, "total_tokens": 76},
}


@pytest.fixture
def stack() -> Iterator[Any]:
    from moto import mock_aws

    from modeldrop import clock
    from modeldrop.local.stack import build_stack

    clock.reset()
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield build_stack(ROOT)
    clock.reset()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    from modeldrop.sample_checkpoint import write_checkpoint

    return write_checkpoint(tmp_path / "ckpt")


@pytest.fixture
def archive(checkpoint: Path) -> bytes:
    from modeldrop.sample_checkpoint import tar_gz_bytes

    return tar_gz_bytes(checkpoint)
