"""The modeldrop command line (needs the `cli` extra; the Lambda bundle never imports this).

May import: anything in modeldrop.
"""

from __future__ import annotations

from modeldrop.cli import (
    channel_commands,
    checkpoint_commands,
    eval_commands,
    local_commands,
    local_stack_commands,
    operate_commands,
    teardown_commands,
    upload_commands,
)
from modeldrop.cli._shared import app

__all__ = [
    "app",
    "channel_commands",
    "checkpoint_commands",
    "eval_commands",
    "local_commands",
    "local_stack_commands",
    "main",
    "operate_commands",
    "teardown_commands",
    "upload_commands",
]


def main() -> None:
    """The command line; with --json, even an option the parser itself refuses is one JSON object."""
    import json
    import sys
    import warnings

    import typer
    from typer._click import exceptions as click_errors

    # A library's warning (Powertools' "no metrics to publish" from a handler run in-process, a
    # deprecation) is the project's to act on, never a user's: it has no fix they could apply.
    if not sys.warnoptions:
        warnings.simplefilter("ignore")

    if "--json" not in sys.argv[1:]:
        app()
        return
    try:
        code = app(standalone_mode=False)
    except typer.Abort:
        print(json.dumps({"error": "Aborted", "message": "aborted", "hint": None}))
        raise SystemExit(1) from None
    except click_errors.ClickException as exc:  # a usage error: a value the option does not take
        print(json.dumps({"error": "UsageError", "message": exc.format_message(), "hint": None}))
        raise SystemExit(exc.exit_code) from None
    raise SystemExit(code if isinstance(code, int) else 0)
