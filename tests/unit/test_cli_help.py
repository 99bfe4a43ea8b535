"""Every command's --help at 80 columns: usage in POSIX's notation, every option explained, nothing past
the edge; and `run-local --fault list` gives each fault whole on a line of its own."""

from __future__ import annotations

import click
import pytest
import typer
from typer.testing import CliRunner

from modeldrop.cli import app
from modeldrop.local.faults import FAULTS

GROUP = typer.main.get_command(app)


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, command in sorted(group.commands.items()):
        if command.hidden:
            continue
        found.append(((*path, name), command))
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
    return found


COMMANDS = _commands(GROUP)  # type: ignore[arg-type]


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_help_at_80_columns(path: tuple[str, ...], command: click.Command) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    usage = result.output.splitlines()[0]
    assert "{" not in usage and "}" not in usage, usage  # typer's `{source}` for a required argument
    unexplained = [p.name for p in command.params if isinstance(p, click.Option) and not p.hidden and not p.help]
    assert unexplained == [], f"{' '.join(path)}: options without help text: {unexplained}"
    long_lines = [line for line in result.output.splitlines() if len(line) > 80]
    assert long_lines == [], long_lines


def test_fault_list_prints_every_fault_whole_at_the_start_of_a_line() -> None:
    result = CliRunner().invoke(app, ["run-local", "--fault", "list"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    starts = [line.split()[0] for line in result.output.splitlines() if line and not line.startswith(" ")]
    assert starts == list(FAULTS)
    assert all(len(line) <= 80 for line in result.output.splitlines())
    unknown = CliRunner().invoke(app, ["run-local", "--fault", "bogus"], env={"COLUMNS": "80"})
    assert unknown.exit_code == 2 and "--fault list" in unknown.output
