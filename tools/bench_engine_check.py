"""The engine check's cost on the tool's own sample and on full-size header-only checkpoints: Llama-3-70B
(723 tensors, BF16) and DeepSeek-V3-671B as released (FP8 blocks with their scales, about 90,000 tensors),
each judged cold (a new engine process, vLLM's model-info cache empty, as in a new Lambda container or a
`modeldrop validate` run) and warm (asking the engine process a warm Lambda container keeps, vLLM imported
once: checkpoint/engine/warm_probe.py), by the engine venv's vLLM.

Measured per run: wall seconds, CPU seconds of the engine's processes (the children's rusage cold; the warm
process's own /proc counters warm), and their peak summed RSS as the check reports it (`peak_rss_mb`). The
goals (issues #55, #63): cold at most 20 s of CPU and 1,024 MB, warm at most 2 s wall; exit 1 when a run is
over.

The checkpoints are sparse files (each shard's header, then a hole as long as its tensors), written once
into .bench/engine/ (run: python tools/bench_engine_check.py; needs the engine venv, `make vllm-venv`).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".bench" / "engine"
GOAL_CPU_S = 20.0
GOAL_WARM_S = 2.0
GOAL_MB = 1024
GOAL_STATIC_MB = 128  # static validate's peak at 150,000 tensors (the whole `modeldrop validate` process)
SHARD_BYTES = 5 * 1024**3
BYTES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672,
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "silu",
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
}  # fmt: skip
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256, "routed_scaling_factor": 2.5,
    "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8, "moe_layer_freq": 1,
    "first_k_dense_replace": 3, "norm_topk_prob": True, "scoring_func": "sigmoid", "hidden_act": "silu",
    "max_position_embeddings": 163840, "rms_norm_eps": 1e-6, "rope_theta": 10000, "attention_bias": False,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "vocab_size": 129280, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "bos_token_id": 0,
    "eos_token_id": 1,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}  # fmt: skip


def llama_tensors(c: dict) -> list[tuple[str, str, list[int]]]:
    h, i = c["hidden_size"], c["intermediate_size"]
    kv = c["num_key_value_heads"] * h // c["num_attention_heads"]
    out = [("model.embed_tokens.weight", "BF16", [c["vocab_size"], h])]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", "BF16", [h]), (p + "post_attention_layernorm.weight", "BF16", [h])]
        for name, shape in (("q_proj", [h, h]), ("k_proj", [kv, h]), ("v_proj", [kv, h]), ("o_proj", [h, h])):
            out.append((f"{p}self_attn.{name}.weight", "BF16", shape))
        for name, shape in (("gate_proj", [i, h]), ("up_proj", [i, h]), ("down_proj", [h, i])):
            out.append((f"{p}mlp.{name}.weight", "BF16", shape))
    return [*out, ("model.norm.weight", "BF16", [h]), ("lm_head.weight", "BF16", [c["vocab_size"], h])]


def _fp8(name: str, shape: list[int]) -> list[tuple[str, str, list[int]]]:
    """A linear weight as the FP8 release stores it: E4M3 blocks and a float32 scale per 128 x 128 block."""
    blocks = [math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)]
    return [(f"{name}.weight", "F8_E4M3", shape), (f"{name}.weight_scale_inv", "F32", blocks)]


def deepseek_tensors(c: dict) -> list[tuple[str, str, list[int]]]:
    h, heads, moe = c["hidden_size"], c["num_attention_heads"], c["moe_intermediate_size"]
    q_head = c["qk_nope_head_dim"] + c["qk_rope_head_dim"]
    out = [("model.embed_tokens.weight", "BF16", [c["vocab_size"], h])]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", "BF16", [h]), (p + "post_attention_layernorm.weight", "BF16", [h]),
                (p + "self_attn.q_a_layernorm.weight", "BF16", [c["q_lora_rank"]]),
                (p + "self_attn.kv_a_layernorm.weight", "BF16", [c["kv_lora_rank"]])]  # fmt: skip
        out += _fp8(p + "self_attn.q_a_proj", [c["q_lora_rank"], h])
        out += _fp8(p + "self_attn.q_b_proj", [heads * q_head, c["q_lora_rank"]])
        out += _fp8(p + "self_attn.kv_a_proj_with_mqa", [c["kv_lora_rank"] + c["qk_rope_head_dim"], h])
        out += _fp8(p + "self_attn.kv_b_proj", [heads * (c["qk_nope_head_dim"] + c["v_head_dim"]), c["kv_lora_rank"]])
        out += _fp8(p + "self_attn.o_proj", [h, heads * c["v_head_dim"]])
        if n < c["first_k_dense_replace"]:
            size = c["intermediate_size"]
            mlps = [p + "mlp"]
        else:
            size = moe
            out += [(p + "mlp.gate.weight", "BF16", [c["n_routed_experts"], h]),
                    (p + "mlp.gate.e_score_correction_bias", "F32", [c["n_routed_experts"]])]  # fmt: skip
            mlps = [f"{p}mlp.experts.{e}" for e in range(c["n_routed_experts"])] + [p + "mlp.shared_experts"]
        for mlp in mlps:
            out += _fp8(mlp + ".gate_proj", [size, h]) + _fp8(mlp + ".up_proj", [size, h])
            out += _fp8(mlp + ".down_proj", [h, size])
    return [*out, ("model.norm.weight", "BF16", [h]), ("lm_head.weight", "BF16", [c["vocab_size"], h])]


def write_checkpoint(folder: Path, config: dict, tensors: list[tuple[str, str, list[int]]]) -> Path:
    """CONFIG, the sample's tokenizer, and sparse shards of TENSORS with their index (once: reused after)."""
    done = folder / "model.safetensors.index.json"
    if done.is_file():
        return folder
    from modeldrop.local.samples.checkpoint import write_checkpoint as write_sample

    folder.mkdir(parents=True, exist_ok=True)
    sample = write_sample(Path(tempfile.mkdtemp()) / "sample")
    for side in sample.iterdir():
        if side.name.startswith(("tokenizer", "special_tokens")) or side.name == "chat_template.jinja":
            (folder / side.name).write_bytes(side.read_bytes())
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shards: list[list[tuple[str, str, list[int]]]] = [[]]
    size = 0
    for tensor in tensors:
        length = math.prod(tensor[2]) * BYTES[tensor[1]]
        if size + length > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += length
    weight_map = {}
    total = 0
    for n, shard in enumerate(shards, 1):
        name = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for tensor_name, dtype, shape in shard:
            end = offset + math.prod(shape) * BYTES[dtype]
            entries[tensor_name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, end]}
            weight_map[tensor_name] = name
            offset = end
        raw = json.dumps(entries, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (folder / name).open("wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.truncate(8 + len(raw) + offset)  # a hole: no tensor bytes are written
        total += offset
    done.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return folder


def judge(folder: Path, cache: Path, warm: Any = None) -> dict[str, object]:
    """One engine check of FOLDER with vLLM's cache at CACHE (asking WARM's process when given): wall, the
    engine's CPU, the reported peak."""
    from modeldrop.checkpoint.engine.engine_check import engine_check
    from modeldrop.serving.engine_options import engine_version

    os.environ["XDG_CACHE_HOME"] = str(cache)
    before = _cpu(warm)
    started = time.monotonic()
    check = engine_check(folder, engine_version("vllm"))
    wall = time.monotonic() - started
    return {"verdict": check.verdict, "wall_s": round(wall, 2), "cpu_s": round(_cpu(warm) - before, 2),
            "peak_mb": check.peak_rss_mb, "message": (check.message or "")[:160]}  # fmt: skip


def _cpu(warm: Any) -> float:
    """CPU seconds so far: the finished children's (cold), or the warm engine process's own."""
    if warm is None or warm._proc is None:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{warm._proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


# As `modeldrop validate DIR --no-engine-check --json` runs, with its peak (VmHWM) said at exit.
STATIC = (
    "import atexit, re, sys; from pathlib import Path; "
    "atexit.register(lambda: sys.stderr.write('VmHWM ' + re.search(r'VmHWM:\\s+(\\d+)', "
    "Path('/proc/self/status').read_text()).group(1) + '\\n')); "
    "sys.argv = ['modeldrop', 'validate', sys.argv[1], '--no-engine-check', '--json']; "
    "from modeldrop.cli import main; main()"
)


def static_validate(folder: Path) -> tuple[float, int, str]:
    """Wall seconds, peak MB and the verdict of the static validate of FOLDER, in a process of its own."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", STATIC, str(folder)], capture_output=True, text=True, check=False,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    wall = time.monotonic() - started
    peak = int(re.search(r"VmHWM (\d+)", done.stderr)[1]) // 1024  # type: ignore[index]
    report = json.loads(done.stdout)
    return wall, peak, "deployable" if report["deployable"] else "refused"


def main() -> int:
    from modeldrop.checkpoint.engine.engine_check import engine_python

    if engine_python() is None:
        print("no engine venv: make vllm-venv (or set MODELDROP_VLLM_PYTHON)", file=sys.stderr)
        return 2
    from modeldrop.checkpoint.engine.warm_probe import WarmProbe
    from modeldrop.local.samples.checkpoint import write_checkpoint as write_sample

    python = str(engine_python())
    sample = OUT / "sample"
    if not (sample / "config.json").exists():
        write_sample(sample)
    cases = {
        "llama-3-70b": (LLAMA_70B, llama_tensors(LLAMA_70B)),
        "deepseek-v3-671b-fp8": (DEEPSEEK_V3, deepseek_tensors(DEEPSEEK_V3)),
    }
    folders = {"sample (modeldrop sample)": sample}
    folders |= {f"{label} ({len(t):,})": write_checkpoint(OUT / label, c, t) for label, (c, t) in cases.items()}
    over = False
    print(f"{'checkpoint':<32} {'run':<5} {'verdict':<12} {'wall s':>7} {'cpu s':>6} {'peak MB':>8}")
    for label, folder in folders.items():
        with tempfile.TemporaryDirectory(prefix="modeldrop-bench-cache-") as cache:
            os.environ["MODELDROP_ENGINE_WARM"] = "0"  # cold: a new engine process, as `validate` starts
            runs = [("cold", judge(folder, Path(cache)))]
            os.environ["MODELDROP_ENGINE_WARM"] = "1"
            from modeldrop.checkpoint.engine import warm_probe

            warm = warm_probe._WARM[python] = WarmProbe(python)
            judge(folder, Path(cache), warm)  # the warm container's first check pays the import
            runs.append(("warm", judge(folder, Path(cache), warm)))
            warm.close()
            del warm_probe._WARM[python]
        for run, got in runs:
            peak = got["peak_mb"] if isinstance(got["peak_mb"], int) else 0
            over |= float(str(got["cpu_s"])) > GOAL_CPU_S or peak > GOAL_MB
            over |= run == "warm" and float(str(got["wall_s"])) > GOAL_WARM_S
            print(f"{label:<32} {run:<5} {got['verdict']!s:<12} {got['wall_s']:>7} {got['cpu_s']:>6} {peak:>8}")
            if got["verdict"] not in ("loads", "assumed"):
                print(f"  {got['message']}")
    print(
        f"goal: <= {GOAL_CPU_S:g} CPU-s and <= {GOAL_MB} MB summed over the engine's processes, cold or warm; "
        f"warm <= {GOAL_WARM_S:g} s wall"
    )
    # Static validate alone, the same shapes and a 416-expert MoE (about Kimi-K2's layout, 151,103 tensors).
    wide = dict(DEEPSEEK_V3, n_routed_experts=416, first_k_dense_replace=1)
    cases["moe-416-experts-fp8"] = (wide, deepseek_tensors(wide))
    print(f"\n{'static validate':<32} {'verdict':<12} {'wall s':>7} {'peak MB':>8}")
    for label, (config, tensors) in cases.items():
        folder = write_checkpoint(OUT / label, config, tensors)
        wall, peak, verdict = static_validate(folder)
        over |= len(tensors) <= 150_000 * 1.01 and peak > GOAL_STATIC_MB
        print(f"{label + f' ({len(tensors):,})':<32} {verdict:<12} {wall:>7.1f} {peak:>8}")
    print(f"goal: static validate <= {GOAL_STATIC_MB} MB (the whole process) up to 150,000 tensors")
    return 1 if over else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    raise SystemExit(main())
