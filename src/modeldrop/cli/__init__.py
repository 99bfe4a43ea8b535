"""The modeldrop command line (needs the `cli` extra; the Lambda bundle never imports this).

May import: anything in modeldrop.
"""

from __future__ import annotations

from modeldrop.cli import (
    checkpoint_commands,
    eval_commands,
    local_commands,
    operate_commands,
    teardown_commands,
    upload_commands,
)
from modeldrop.cli._shared import app

__all__ = [
    "app",
    "checkpoint_commands",
    "eval_commands",
    "local_commands",
    "main",
    "operate_commands",
    "teardown_commands",
    "upload_commands",
]


def main() -> None:
    app()
