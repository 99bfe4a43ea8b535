"""What every command shares: the typer app, the consoles, and the one-line error exit."""

from __future__ import annotations

import sys
from typing import NoReturn

try:
    import typer
    from rich.console import Console
except ImportError:  # pragma: no cover - only without the cli extra
    sys.stderr.write("modeldrop's command line needs its extra: pip install 'modeldrop[cli,local]'\n")
    raise SystemExit(2) from None


app = typer.Typer(
    add_completion=False, no_args_is_help=True, help="Ship a fine-tuned LLM to SageMaker, or leave nothing behind."
)
# Piped output gets room for the tables instead of rich's 80-column default.
console = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, soft_wrap=True, width=None if sys.stderr.isatty() else 200)


def fail(message: str, hint: str | None = None, code: int = 2) -> NoReturn:
    err.print(f"error: {message}" + (f"\n  fix: {hint}" if hint else ""))
    raise typer.Exit(code)
