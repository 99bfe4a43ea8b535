"""How a local container process is launched for each engine, from the deployment's container env.

vLLM and SGLang DLC entrypoints turn `SM_VLLM_FOO_BAR=v` / `SM_SGLANG_FOO_BAR=v` into
`--foo-bar v` (an empty value gives a bare flag) and serve on port 8080; here the port is a free
local one and `/opt/ml/model` is the extracted artifact.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from modeldrop.engine_env import MODEL_PATH

LOCAL_ENGINES = ("reference", "vllm", "sglang")
_PREFIX = {"vllm": "SM_VLLM_", "sglang": "SM_SGLANG_"}
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


def check_available(engine: str) -> None:
    if engine == "reference":
        return
    if engine not in _MODULE:
        raise EngineUnavailable(f"unknown local engine {engine!r}; choose from {', '.join(LOCAL_ENGINES)}")
    if importlib.util.find_spec(engine) is None:
        raise EngineUnavailable(f"{engine} is not installed in this Python; `pip install {engine}` (needs a CUDA GPU)")
    if shutil.which("nvidia-smi") is None:
        raise EngineUnavailable(f"{engine} needs a CUDA GPU and none is visible here (no nvidia-smi)")


def command(engine: str, env: dict[str, str], model_dir: Path, port: int) -> list[str]:
    check_available(engine)
    if engine == "reference":
        return [
            sys.executable,
            "-m",
            "modeldrop.local.reference_engine",
            "--port",
            str(port),
            "--model-dir",
            str(model_dir),
        ]
    base = [sys.executable, "-m", _MODULE[engine], "--host", "127.0.0.1", "--port", str(port)]
    return base + entrypoint_args(_PREFIX[engine], env, model_dir)
