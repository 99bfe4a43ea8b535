"""The pages' examples that need no stack (run-local, validate, plan, repair), each run as written, with the
README's own `modeldrop sample ./my-checkpoint` first: the other half of test_doc_examples.py, in a file of
its own so that a second worker runs it while the first drives the local stack's examples."""

from __future__ import annotations

import os
from pathlib import Path

from test_doc_examples import EXPECTED_EXIT, _files, _run, local_examples, run_example


def test_every_local_example_runs_as_written(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env["MODELDROP_ENGINE_CHECK"] = "Disabled"  # the engine check's own examples ask for it by flag
    work = tmp_path / "work"
    work.mkdir()
    fill = _files(work)
    sampled = _run(f"modeldrop sample {fill['./my-checkpoint']}", env, work)
    assert sampled.returncode == 0, sampled.stdout + sampled.stderr
    for page, command in local_examples():
        done = run_example(command, env, work, fill)
        expected = EXPECTED_EXIT.get(command, 0)
        assert done.returncode == expected, (page, command, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (page, command, done.stderr[-2000:])
