"""The engine as the oracle: checkpoints written by transformers' own save_pretrained for several
architecture families (tools/gen_arch_checkpoints.py) with the breaks users meet, and quantized variants
in the layouts GPTQ, AWQ and FP8-block save (tools/gen_quant_variants.py), each judged by vLLM's own code
(the engine check) and by validate's static rules. The static rules never accept what the engine
refuses; both accept what the engine loads intact. The engine may be laxer than correct (it loads a
fused projection missing one part, or an expert cut in half): there the stricter static verdict stands.

Every family the generator knows is judged (about 200 checkpoints in under a minute: the engine
imports once); MODELDROP_ORACLE_TYPES=llama,phi3 narrows it while working on a rule. Where the probe
cannot judge (a model whose load_weights reads values, which meta tensors have none of) the engine's
verdict is "undetermined" and the static rules decide; those stay few.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from modeldrop.checkpoint.engine.engine_check import from_probe, probe
from modeldrop.checkpoint.validation import validate_source
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint
from modeldrop.serving.memory_plan import kv_bytes_per_token
from modeldrop.serving.plan import shape_from

VLLM = os.environ.get("MODELDROP_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM, reason="set MODELDROP_VLLM_PYTHON (make test sets the engine venv)")
# The generators write weights and config.json only: what concerns the tokenizer is not the question here.
NOT_ASKED = ("TOKENIZER_", "CHAT_")


def _types() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    from gen_arch_checkpoints import TYPES

    return os.environ.get("MODELDROP_ORACLE_TYPES") or ",".join(TYPES)


def test_the_static_rules_never_accept_what_the_engine_refuses(tmp_path: Path) -> None:
    assert VLLM is not None
    arch = tmp_path / "arch"
    subprocess.run([VLLM, str(ROOT / "tools" / "gen_arch_checkpoints.py"), str(arch), _types()],
                   check=True, capture_output=True, timeout=1800)  # fmt: skip
    sys.path.insert(0, str(ROOT / "tools"))
    from gen_quant_variants import main as quant_variants

    dense = write_cpu_checkpoint(tmp_path / "dense")
    quant_variants(dense, tmp_path / "quant" / "llama")
    dirs = sorted(p for p in [*arch.glob("*/*"), *(tmp_path / "quant").glob("*/*")] if p.is_dir())
    assert len(dirs) >= 40, dirs
    wrong, verdicts, compared = [], {}, 0
    for folder, raw in zip(dirs, probe(dirs, VLLM), strict=True):
        name = f"{folder.parent.name}/{folder.name}"
        check = from_probe(raw, EngineVersion("vllm", str(raw.get("version")), "the engine venv"), VLLM)
        engine_loads = check.verdict == "loads" and not check.strict_not_loaded
        report = validate_source(str(folder))
        errors = sorted({f.code for f in report.findings
                         if f.severity == "error" and not f.code.startswith(NOT_ASKED)})  # fmt: skip
        if engine_loads and not errors and check.kv_bytes_per_token:
            compared += 1  # the plan's KV per token: vLLM's own, 5 %
            planned = sum(kv_bytes_per_token(shape_from(report.summary())))  # what `plan` plans with
            theirs = check.kv_bytes_per_token + (check.sliding_kv_bytes_per_token or 0.0)
            if abs(planned - theirs) > 0.05 * theirs:
                wrong.append(f"{name}: the plan's KV {planned:.0f} B/token, vLLM's {theirs:.0f}")
        verdicts[name] = (check.verdict, errors)
        if check.verdict == "refused" and not errors:
            wrong.append(f"{name}: the engine refuses ({check.stage}: {check.message[:200]}), the static rules accept")
        intact = folder.name in (
            "intact",
            "gptq-intact",
            "awq-intact",
            "fp8-block-intact",
            "ct-w4a16-intact",
            "ct-fp8-intact",
        )
        if intact and errors and check.verdict != "refused":
            wrong.append(f"{name}: intact, but engine {check.verdict} {check.message[:200]} / static {errors}")
    assert wrong == [], "\n".join(wrong)
    assert compared >= 30, compared
    undetermined = [n for n, (v, _) in verdicts.items() if v not in ("loads", "refused")]
    assert len(undetermined) <= len(dirs) // 10, undetermined  # the probe judges nearly all of them
    intact_loads = [n for n, (v, _) in verdicts.items() if n.endswith("intact") and v == "loads"]
    assert len(intact_loads) >= len([n for n in verdicts if n.endswith("intact")]) * 3 // 4, verdicts
    refused = [n for n, (v, _) in verdicts.items() if v == "refused"]
    assert len(refused) >= len(dirs) // 2, verdicts  # the breaks are breaks to the engine, not only to us


# adapter_config.json variants PEFT writes: its init methods, DoRA, bias, modules_to_save, rsLoRA, rank and
# alpha patterns, and a rank no vLLM LoRA config takes.
PEFT_VARIANTS: dict[str, dict[str, object]] = {
    "plain": {},
    "rslora": {"use_rslora": True},
    "gaussian-init": {"init_lora_weights": "gaussian"},
    "rank-pattern": {"rank_pattern": {"down_proj": 8}, "alpha_pattern": {"down_proj": 32}},
    "pissa": {"init_lora_weights": "pissa"},
    "pissa-niter": {"init_lora_weights": "pissa_niter_4"},
    "olora": {"init_lora_weights": "olora"},
    "corda": {"init_lora_weights": "corda"},
    "loftq": {"init_lora_weights": "loftq"},
    "dora": {"use_dora": True},
    "bias-all": {"bias": "all"},
    "bias-lora-only": {"bias": "lora_only"},
    "modules-to-save": {"modules_to_save": ["lm_head"]},
}


def test_peft_variants_are_refused_where_the_engine_refuses_them(tmp_path: Path) -> None:
    """Each PEFT variant judged by vLLM's PEFTHelper (validate_legal) on its base, and by the static rules."""
    import json

    from modeldrop.local.samples.cpu_checkpoint import write_cpu_adapter

    assert VLLM is not None
    base = write_cpu_checkpoint(tmp_path / "base")
    adapters = []
    for name, change in PEFT_VARIANTS.items():
        adapter = write_cpu_adapter(tmp_path / name)
        config = json.loads((adapter / "adapter_config.json").read_text())
        (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
        adapters.append(adapter)
    lines = probe([base, *(Path(f"--adapter={a}") for a in adapters)], VLLM)
    assert lines[0]["verdict"] == "loads", lines[0]
    # Inits that change the base's weights (PiSSA, OLoRA, CorDA, LoftQ): PEFTHelper refuses them from 0.32;
    # 0.31 loads them and would serve the adapter on the wrong base. The static rules refuse them always.
    release = EngineVersion("vllm", str(lines[0].get("version")), "the engine venv")
    stricter = set() if release.at_least("0.32.0") else {"pissa", "pissa-niter", "olora", "corda", "loftq"}
    wrong, refused = [], []
    for adapter, raw in zip(adapters, lines[1:], strict=True):
        engine = raw["verdict"]
        errors = sorted(
            {f.code for f in validate_source(str(adapter), base=str(base)).findings if f.severity == "error"}
        )
        if engine == "refused":
            refused.append(adapter.name)
        if (engine == "refused") != bool(errors) and not (adapter.name in stricter and errors):
            wrong.append(f"{adapter.name}: engine {engine} ({str(raw.get('message'))[:150]}), static {errors}")
    assert wrong == [], "\n".join(wrong)
    assert {"pissa", "dora", "loftq"} - stricter <= set(refused) and "plain" not in refused, refused
