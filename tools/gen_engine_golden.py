"""The real-load golden: tiny checkpoints written by transformers' own save_pretrained, each loaded by the
pinned vLLM on CPU (`vllm.LLM`, enforce_eager, a small context, float32) and asked for a few greedy tokens;
what happened is the truth `modeldrop validate` is held to (tests/scenarios/test_engine_golden.py).

    python tools/gen_engine_golden.py --cases OUT           # write the cases only (CI regenerates them)
    python tools/gen_engine_golden.py --golden FIXTURE      # write the cases, real-load each, write FIXTURE
    python tools/gen_engine_golden.py --load DIR            # one real load (a child of the above), one JSON line

Run with the engine venv's Python (it has torch, transformers and vLLM): `make engine-golden`.

Verdicts: `loads` (started, generated finite log-probs, and -- for a variant of an intact checkpoint -- the
same log-probs at every position of a 32-token prompt and its answer as that intact one: the break changes
nothing served); `loads_garbage` (started, but NaN or other numbers than the intact one: uninitialised
memory served); `refused` (the engine refused at
start or died at the first request, in its own words); `cpu_limit` (the CPU build cannot run it: a kernel
only GPUs have; not scored). The fixture carries the vLLM and transformers releases and a hash of this
generator and of tools/gen_arch_checkpoints.py (its shrinking): CI fails when either moves without it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GENERATOR_FILES = (HERE / "gen_engine_golden.py", HERE / "gen_arch_checkpoints.py")
# Families users bring most, dense, per-expert MoE and hybrid; each saved intact by transformers.
FAMILIES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3", "granite", "olmo2", "mixtral",
    "qwen2_moe", "qwen3_moe", "olmoe", "granitemoe", "jamba", "qwen3_next", "nemotron_h",
)  # fmt: skip
EXPERT_BREAKS = ("mixtral", "qwen3_moe", "olmoe")  # one expert's tensors removed from one layer
VOCAB = 512
WIDER = {"hidden_size": 128, "n_embd": 128, "d_model": 128, "head_dim": 32, "global_head_dim": 64}
PAD, BOS, EOS = 0, 1, 2
# Long enough that every expert of a 4-expert, top-2 layer is routed some token (its log-probs compared).
PROMPT = [BOS, *range(7, 400, 13)]
# A break changes what is served when the first step's log-probs move more than this (float32 noise is ~1e-6).
SAME = 1e-3
CPU_LIMIT = ("supported only for cuda", "not supported on cpu", "illegal instruction", "sigill", "cpu backend",
             "failed to find a kernel", "head size", "not implemented for 'float'")  # fmt: skip
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }} {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant {% endif %}"
)


def generator_hash() -> str:
    digest = hashlib.sha256()
    for path in GENERATOR_FILES:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _tokenizer(where: Path, size: int) -> None:
    """A word-level tokenizer of SIZE ids (<pad> <s> </s>, then w3 ...), its config and a chat template."""
    specials = ["<pad>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials)} | {f"w{i}": i for i in range(len(specials), size)}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, t in enumerate(specials)]  # fmt: skip
    tokenizer = {"version": "1.0", "added_tokens": added, "normalizer": None,
                 "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None,
                 "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
                 "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<pad>"}}  # fmt: skip
    (where / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "pad_token": "<pad>", "unk_token": "<pad>", "model_max_length": 256,
              "chat_template": CHAT_TEMPLATE}  # fmt: skip
    (where / "tokenizer_config.json").write_text(json.dumps(config))


def _save(model: Any, where: Path, **kwargs: Any) -> Path:
    model.save_pretrained(where, **kwargs)
    config = json.loads((where / "config.json").read_text())
    text = config.get("text_config", config)
    text.update(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
    (where / "config.json").write_text(json.dumps(config, indent=2))
    (where / "generation_config.json").write_text(
        json.dumps({"bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD, "do_sample": False})
    )
    _tokenizer(where, VOCAB)
    return where


def _model(model_type: str) -> Any:
    import torch
    from gen_arch_checkpoints import shrink
    from transformers import AutoConfig, AutoModelForCausalLM

    data = AutoConfig.for_model(model_type).to_dict()
    shrink(data, model_type)
    for key, value in WIDER.items():  # vLLM's CPU attention takes head sizes 32-512 only
        if isinstance(data.get(key), int):
            data[key] = value
    config = AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _rewrite(source: Path, where: Path, edit: Any) -> Path:
    """A copy of SOURCE whose tensors EDIT changes (it takes and returns {shard: {name: tensor}})."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, where, dirs_exist_ok=True)
    shards = {p.name: load_file(p) for p in sorted(source.glob("*.safetensors"))}
    for path in where.glob("*.safetensors"):
        path.unlink()
    shards = edit(shards)
    for name, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, where / name, {"format": "pt"})
    index = where / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: shard for shard, tensors in shards.items() for k in tensors}
        index.write_text(json.dumps(data, indent=2))
    return where


def _without(predicate: Any) -> Any:
    return lambda shards: {s: {k: v for k, v in t.items() if not predicate(k)} for s, t in shards.items()}


def _edit_json(where: Path, name: str, change: Any) -> Path:
    data = json.loads((where / name).read_text())
    change(data)
    (where / name).write_text(json.dumps(data, indent=2))
    return where


def write_cases(out: Path) -> list[dict[str, Any]]:
    """Every case: {name, dir, reference (the intact case a variant is compared with), note}."""
    import shutil

    import torch

    sys.path.insert(0, str(HERE))
    cases: list[dict[str, Any]] = []

    def case(name: str, where: Path, reference: str | None = None, note: str = "") -> None:
        cases.append({"name": name, "dir": str(where), "reference": reference, "note": note})

    for family in FAMILIES:
        try:
            intact = _save(_model(family), out / family / "intact")
        except Exception as exc:  # a family this transformers cannot build tiny: said, not a case
            print(f"skip {family}: {type(exc).__name__}: {str(exc)[:200]}", file=sys.stderr)
            continue
        case(f"{family}/intact", intact, note="save_pretrained, per-expert tensors for a MoE")
        if family in EXPERT_BREAKS:
            gone = _rewrite(intact, out / family / "expert-dropped",
                            _without(lambda k: ".layers.1." in k and ".experts.1." in k))  # fmt: skip
            case(f"{family}/expert-dropped", gone, f"{family}/intact", "expert 1 of layer 1 removed")
    llama = out / "llama" / "intact"
    case("llama/down-proj-dropped", _rewrite(llama, out / "llama" / "down-proj-dropped",
         _without(lambda k: k == "model.layers.1.mlp.down_proj.weight")), "llama/intact",
         "an unquantized linear layer's weight gone: vLLM's own check exempts it")  # fmt: skip

    def renamed(shards: dict[str, Any]) -> dict[str, Any]:
        return {s: {k.replace("layers.1.self_attn.o_proj", "layers.1.self_attn.o_projx"): v for k, v in t.items()}
                for s, t in shards.items()}  # fmt: skip

    case("llama/renamed", _rewrite(llama, out / "llama" / "renamed", renamed), "llama/intact")
    past = out / "llama" / "tokenizer-past-embedding"
    shutil.copytree(llama, past)
    _tokenizer(past, 600)  # the tokenizer's own vocabulary, not added tokens, runs 88 ids past the embedding
    case("llama/tokenizer-past-embedding", past, "llama/intact", "tokenizer.json holds ids 512-599")
    # bf16, two shards; then the same with one shard re-saved as fp16 (vLLM casts both to the served dtype).
    sharded = _save(_model("llama").to(torch.bfloat16), out / "llama" / "bf16-sharded", max_shard_size="200KB")
    case("llama/bf16-sharded", sharded, note="bf16 in several shards")

    def one_fp16(shards: dict[str, Any]) -> dict[str, Any]:
        first = sorted(shards)[0]
        return {s: {k: v.to(torch.float16) if s == first else v for k, v in t.items()} for s, t in shards.items()}

    case("llama/fp16-shard", _rewrite(sharded, out / "llama" / "fp16-shard", one_fp16), "llama/bf16-sharded",
         "one shard fp16 among bf16 ones")  # fmt: skip
    eos_text = _edit_json(_rewrite(llama, out / "llama" / "eos-as-string", lambda s: s), "generation_config.json",
                          lambda g: g.update(eos_token_id="</s>"))  # fmt: skip
    case("llama/eos-as-string", eos_text, "llama/intact", "generation_config.json's eos_token_id is the token")
    odd_template = _edit_json(_rewrite(llama, out / "llama" / "chat-template-number", lambda s: s),
                              "tokenizer_config.json", lambda t: t.update(chat_template=7))  # fmt: skip
    case("llama/chat-template-number", odd_template, "llama/intact", "tokenizer_config's chat_template is 7")
    (out / "cases.json").write_text(json.dumps(cases, indent=2))
    return cases


def load(directory: str) -> dict[str, Any]:
    """One real load and generation, as a server would start: the engine's words on a refusal."""
    os.environ.update(VLLM_HOST_IP="127.0.0.1", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
                      VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="ERROR",
                      TOKENIZERS_PARALLELISM="false")  # fmt: skip
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    tokenizer = json.loads(Path(directory, "tokenizer.json").read_text())
    highest = max(tokenizer["model"]["vocab"].values())
    try:
        llm = LLM(model=directory, enforce_eager=True, max_model_len=128, dtype="float32", max_num_seqs=2, seed=0)
    except BaseException as exc:
        return {"stage": "start", "error": f"{type(exc).__name__}: {exc}"[:1500]}
    params = SamplingParams(max_tokens=3, temperature=0, logprobs=5, prompt_logprobs=5)
    try:  # a prompt holding the highest id the tokenizer can produce, then a chat turn through its template
        result = llm.generate([TokensPrompt(prompt_token_ids=[*PROMPT, highest])], params, use_tqdm=False)[0]
        out = result.outputs[0]
        llm.chat([{"role": "user", "content": "w7 w8"}], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
    except BaseException as exc:
        return {"stage": "request", "error": f"{type(exc).__name__}: {exc}"[:1500]}
    steps = [*(result.prompt_logprobs or [])[1:], *(out.logprobs or [])]  # every position, prompt and answer
    logprobs = {f"{i}:{k}": v.logprob for i, step in enumerate(steps) for k, v in (step or {}).items()}
    return {"stage": "served", "tokens": list(out.token_ids), "logprobs": logprobs}


def _real_load(directory: str) -> dict[str, Any]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, __file__, "--load", directory], capture_output=True, text=True,
                          timeout=900, check=False)  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {
        "stage": "start", "error": f"the engine process died (exit {done.returncode}): "
        + (done.stderr.strip().splitlines() or ["no output"])[-1][:500]}  # fmt: skip
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def verdict(result: dict[str, Any], reference: dict[str, Any] | None) -> tuple[str, str]:
    """(loads | loads_garbage | refused | cpu_limit, the engine's words or what moved)."""
    if "error" in result:
        text = result["error"]
        return ("cpu_limit" if any(m in text.lower() for m in CPU_LIMIT) else "refused"), text
    mine = result["logprobs"]
    if not mine or any(not math.isfinite(v) for v in mine.values()):
        return "loads_garbage", "non-finite log-probs"
    if reference and reference.get("logprobs"):
        theirs = reference["logprobs"]
        common = set(mine) & set(theirs)
        moved = max((abs(mine[k] - theirs[k]) for k in common), default=math.inf)
        if len(common) < min(len(mine), len(theirs)) or moved > SAME:
            return "loads_garbage", f"log-probs moved by {moved:.3g} from the intact checkpoint's"
    return "loads", ""


def golden(fixture: Path, work: Path, only: set[str] | None = None) -> dict[str, Any]:
    from concurrent.futures import ThreadPoolExecutor

    import transformers
    import vllm

    cases = write_cases(work)
    wanted = [c for c in cases if not only or c["name"] in only or c["name"] in {x["reference"] for x in cases
              if x["name"] in only}]  # fmt: skip
    with ThreadPoolExecutor(int(os.environ.get("GOLDEN_WORKERS", "2"))) as pool:  # each load is one process
        results = dict(zip((c["name"] for c in wanted), pool.map(lambda c: _real_load(c["dir"]), wanted), strict=True))
    judged: dict[str, Any] = {}
    for case in wanted:
        kind, words = verdict(results[case["name"]], results.get(case["reference"] or ""))
        judged[case["name"]] = {"verdict": kind, "stage": results[case["name"]]["stage"], "message": words,
                                "reference": case["reference"], "note": case["note"],
                                "seconds": results[case["name"]]["seconds"]}  # fmt: skip
        print(f"{case['name']}: {kind} {words[:160]}", file=sys.stderr, flush=True)
    data = {
        "_provenance": "tools/gen_engine_golden.py: checkpoints saved by transformers, each loaded by vLLM on CPU "
        "(vllm.LLM, enforce_eager, float32, max_model_len 128) with a few greedy tokens and a chat turn",
        "vllm": vllm.__version__,
        "transformers": transformers.__version__,
        "generator_sha256": generator_hash(),
        "cases": judged,
    }
    fixture.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--load"]:
        print(json.dumps(load(args[1])), flush=True)
    elif args[:1] == ["--cases"]:
        write_cases(Path(args[1]))
    elif args[:1] == ["--golden"]:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="modeldrop-golden-") as tmp:
            golden(Path(args[1]), Path(tmp), set(args[2].split(",")) if len(args) > 2 else None)
    else:
        sys.exit(__doc__)
