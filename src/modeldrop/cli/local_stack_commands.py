"""local up / local down / local env: a persistent emulated stack every command can talk to."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from modeldrop.cli._shared import app, console, fail, json_mode, need_extra

local_app = typer.Typer(help="A persistent emulated stack (no AWS account) for deploy, list, status and the rest.")
app.add_typer(local_app, name="local")

# Starting the emulated stack (moto, the template's resources, the runtime) takes seconds; under a
# loaded machine many more. Past this the start is reported as failed, with its log.
START_SECONDS = 300.0


NameOpt = Annotated[
    str | None,
    typer.Option(
        "--name", help="the local stack's name (default: this shell's after `local up`, else this directory's)"
    ),
]


def _path(name: str | None) -> Any:
    from modeldrop.local.stack.daemon import state_path

    try:
        return state_path(name)
    except ValueError as exc:
        fail(str(exc), "e.g. --name demo", error="RequestInvalid")


def _running(name: str | None = None, path: Any = None, quiet: bool = False) -> dict[str, Any] | None:
    """The running stack a state file names, or None; a file not ours or not a state is refused (QUIET:
    passed over, as `local status` does while it lists)."""
    path = path or _path(name)
    if not path.is_file():
        return None
    if path.stat().st_uid != os.getuid():
        if quiet:
            return None
        fail(
            f"{path} belongs to another user: not a local stack of yours",
            "set MODELDROP_LOCAL_STATE to a path of yours",
        )
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        pid = int(state["pid"])
    except (ValueError, KeyError, TypeError, OSError):
        if quiet:
            return None
        fail(f"{path} is not a local stack's state", "remove it, then modeldrop local up")
    if not _is_daemon(pid):
        path.unlink(missing_ok=True)  # its process is gone (or the pid is another's now): the file is stale
        return None
    state.setdefault("state_path", str(path))
    return state


def _is_daemon(pid: int) -> bool:
    """PID is alive and runs the local stack (a signal never goes to a pid the file merely names)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"modeldrop.local.stack.daemon" in fh.read() and _alive(pid)
    except OSError:
        return False


def _print_env(state: dict[str, Any], as_json: bool) -> None:
    from modeldrop.local.stack.daemon import client_env

    env = client_env(state)
    if as_json:
        print(json.dumps({**state, "env": env}))
        return
    for key, value in env.items():
        print(f"export {key}={shlex.quote(value)}")


@local_app.command("up")
def local_up(
    port: Annotated[int, typer.Option(help="the port of the AWS APIs (0: any free one)")] = 0,
    name: NameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object: the stack and its env")] = False,
) -> None:
    """Start the emulated stack in the background and print the env that points commands at it:
    eval "$(modeldrop local up)", then deploy, upload, list, status, extend, teardown, doctor, eval.
    One stack per directory (or --name), per user; the env names it, so `local down` stops that one."""
    json_mode(as_json)
    need_extra("local", "local up")
    path = _path(name)
    state = _running(path=path)
    if state is None:
        log = path.with_suffix(".log")
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "modeldrop.local.stack.daemon", str(port), str(path)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # outlives this command, and a ^C in its shell
            )
        deadline = time.monotonic() + START_SECONDS
        while state is None:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                tail = log.read_text(errors="replace")[-1500:]
                fail(f"the local stack did not start (log: {log})", tail or None, error="LocalStackFailed")
            time.sleep(0.2)
            state = _running(path=path)
    _print_env(state, as_json)
    if not as_json:
        print(
            f"# the local stack {state.get('name', state['stack'])} runs (pid {state['pid']}); "
            "stop it with: modeldrop local down"
        )


@local_app.command("env")
def local_env(
    bucket: Annotated[bool, typer.Option("--bucket", help="print only the artifact bucket's name")] = False,
    name: NameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Print the env that points commands at the running local stack (or its bucket's name)."""
    json_mode(as_json)
    state = _running(name)
    if state is None:
        fail(
            f"no local stack {_path(name).stem} is running",
            'start one: eval "$(modeldrop local up)"',
            error="NoLocalStack",
        )
    if bucket and not as_json:
        print(state["bucket"])
        return
    _print_env(state, as_json)


@local_app.command("status")
def local_status(
    name: NameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """This user's running local stacks: name, directory, pid, endpoint, bucket; the one this shell
    (or directory) points at is marked. Exit 1 when that one is not running."""
    json_mode(as_json)
    from modeldrop.local.stack.daemon import stacks_dir
    from modeldrop.operate.aws_problems import stopped_stack_problem

    mine = _path(name)
    paths = {p.resolve() for p in stacks_dir().glob("*.json")} | ({mine.resolve()} if mine.exists() else set())
    stacks = [s for p in sorted(paths) if (s := _running(path=p, quiet=True)) is not None]
    current = next((s for s in stacks if Path(s["state_path"]).resolve() == mine.resolve()), None)
    problem = stopped_stack_problem() if current is None or name is None else None
    if as_json:
        print(json.dumps({"current": current, "stacks": stacks, "problem": problem}))
        raise typer.Exit(0 if current else 1)
    if not stacks:
        console.print("no local stack of yours is running", highlight=False)
    for s in stacks:
        mark = "*" if s is current else " "
        console.print(f"{mark} {s.get('name', '-')}  pid {s['pid']}  since {s.get('started_at', '-')}", highlight=False)
        console.print(f"    directory {s.get('directory', '-')}", highlight=False, markup=False)
        console.print(f"    endpoint {s['endpoint_url']}  bucket {s['bucket']}", highlight=False, markup=False)
    if current is None:
        console.print(
            (problem or f"the stack for here ({mine.stem}) is not running")
            + '; start it: eval "$(modeldrop local up)"',
            highlight=False,
            markup=False,
        )
    raise typer.Exit(0 if current else 1)


@local_app.command("down")
def local_down(
    name: NameOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """Stop the local stack (this shell's, else this directory's, or --name's): its endpoints'
    processes and everything it held go with it."""
    json_mode(as_json)
    state = _running(name)
    if state is None:
        stopped = False
    else:
        pid = int(state["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        stopped = True
    if as_json:
        print(json.dumps({"stopped": stopped}))
    else:
        console.print(
            f"the local stack {state.get('name', '')} is stopped" if state else "no local stack was running",
            highlight=False,
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True
