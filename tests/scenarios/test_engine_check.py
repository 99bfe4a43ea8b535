"""The engine check: vLLM's own code (the project's engine venv, on CPU, meta tensors) judges a checkpoint,
and its verdict -- with its own words -- becomes findings beside the static rules'. Each broken variant
of the CPU Llama is one the static rules alone missed, or one whose refusal the engine words itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from modeldrop.checkpoint.engine.engine_check import engine_findings, from_probe, probe
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint

VLLM = os.environ.get("MODELDROP_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM, reason="set MODELDROP_VLLM_PYTHON (make test sets the engine venv)")
TARGET = EngineVersion("vllm", "0.31.0", "the default image")  # the engine venv's release


def _variant(base: Path, root: Path, name: str, tensors: Callable[[dict[str, Any]], None] | None = None,
             config: Callable[[dict[str, Any]], None] | None = None) -> Path:  # fmt: skip
    folder = root / name
    shutil.copytree(base, folder)
    weights = load_file(str(base / "model.safetensors"))
    if tensors:
        tensors(weights)
    save_file(weights, str(folder / "model.safetensors"))
    if config:
        data = json.loads((base / "config.json").read_text())
        config(data)
        (folder / "config.json").write_text(json.dumps(data))
    return folder


def _rename(weights: dict[str, Any]) -> None:
    weights["model.layers.0.mlp.down_projX.weight"] = weights.pop("model.layers.0.mlp.down_proj.weight")


def _cut(weights: dict[str, Any]) -> None:
    key = "model.layers.0.mlp.down_proj.weight"
    weights[key] = weights[key][: weights[key].shape[0] // 2]


def test_the_engine_judges_each_variant_in_its_own_words(tmp_path: Path) -> None:
    base = write_cpu_checkpoint(tmp_path / "llama")
    expected: dict[str, tuple[str, str]] = {}  # variant -> (finding code, words of the engine's)

    def add(name: str, code: str, words: str, **change: Any) -> Path:
        expected[name] = (code, words)
        return _variant(base, tmp_path, name, **change)

    dirs = [
        base,
        add("dropped-o-proj", "ENGINE_WEIGHTS_UNINITIALIZED", "o_proj.weight",
            tensors=lambda w: w.pop("model.layers.0.self_attn.o_proj.weight")),
        add("half-rows", "ENGINE_REFUSED", "AssertionError", tensors=_cut),
        add("renamed", "ENGINE_REFUSED", "no module or parameter named 'layers.0.mlp.down_projX'",
            tensors=_rename),
        add("extra-tensor", "ENGINE_REFUSED", "no module or parameter named 'layers.0.mlp.extra'",
            tensors=lambda w: w.update({"model.layers.0.mlp.extra.weight": np.zeros((2, 2), dtype=np.float32)})),
        add("rope-unknown", "ENGINE_REFUSED", "Unknown RoPE scaling type wobbly",
            config=lambda c: c.update(rope_scaling={"rope_type": "wobbly", "factor": 2.0})),
        add("yarn-no-factor", "ENGINE_REFUSED", "factor",
            config=lambda c: c.update(rope_scaling={"rope_type": "yarn"})),
        add("exl2", "ENGINE_REFUSED", "Unknown quantization method: exl2",
            config=lambda c: c.update(quantization_config={"quant_method": "exl2", "bits": 4})),
        add("gptq-config-on-dense", "ENGINE_REFUSED", "no module or parameter named 'layers.0.mlp.down_proj.weight'",
            config=lambda c: c.update(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128,
                                                           "desc_act": False, "sym": True})),
    ]  # fmt: skip
    assert VLLM is not None
    results = probe(dirs, VLLM)
    intact = from_probe(results[0], TARGET, VLLM)
    assert intact.verdict == "loads" and engine_findings(intact) == [], intact
    assert intact.version and intact.judged_for.startswith("vLLM 0.31.0")
    assert intact.note is None or "0.31.0" in intact.note  # the venv's version named where it is not the image's
    from modeldrop.checkpoint.validation import validate_source

    for folder, raw in zip(dirs[1:], results[1:], strict=True):
        code, words = expected[folder.name]
        # The static rules, the fast first gate, never accept what the engine refuses.
        assert not validate_source(str(folder)).deployable, folder.name
        check = from_probe(raw, TARGET, VLLM)
        findings = engine_findings(check)
        release = EngineVersion("vllm", str(check.version), "the probe's")
        if folder.name == "gptq-config-on-dense" and not release.at_least("0.32.0"):
            assert check.verdict == "loads", check  # 0.31's loader skips what a GPTQ layer has no slot for
            continue
        assert [f.code for f in findings] == [code], (folder.name, check)
        assert words in findings[0].message, (folder.name, findings[0].message)
        assert findings[0].severity == "error" and findings[0].hint


def test_validate_engine_check_json_carries_the_engines_verdict(tmp_path: Path) -> None:
    base = write_cpu_checkpoint(tmp_path / "llama")
    broken = _variant(base, tmp_path, "odd-activation", config=lambda c: c.update(hidden_act="wibble"))
    done = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(broken), "--engine-check", "--json"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    check = report["engine_check"]
    assert check["engine"] == "vllm" and check["version"] and check["verdict"] == "refused"
    assert "Unsupported activation: wibble" in check["message"] and not report["deployable"]
    exl2 = _variant(base, tmp_path, "exl2", config=lambda c: c.update(quantization_config={"quant_method": "exl2"}))
    statically = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(exl2), "--engine-check", "--json"],
                                capture_output=True, text=True, timeout=900)  # fmt: skip
    assert json.loads(statically.stdout)["engine_check"]["verdict"] == "skipped"  # refused before the engine
    # An archive is judged from its headers (a skeleton: no weight extracted), in the same engine process as a
    # directory: the renamed tensor the engine refuses in the folder is refused in its .tar.gz too.
    from modeldrop.local.samples.checkpoint import write_tar_gz

    packed = write_tar_gz(broken, tmp_path / "odd.tar.gz")
    default = {k: v for k, v in os.environ.items() if k != "MODELDROP_ENGINE_CHECK"}  # no flag: what users meet
    both = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(packed), str(base), "--json"],
                          capture_output=True, text=True, timeout=900, env=default)  # fmt: skip
    assert both.returncode == 1, both.stderr
    packed_report, base_report = json.loads(both.stdout)
    assert packed_report["engine_check"]["verdict"] == "refused" and not packed_report["deployable"]
    assert "Unsupported activation: wibble" in packed_report["engine_check"]["message"]
    assert base_report["engine_check"]["verdict"] == "loads" and base_report["deployable"]


def _deploy(stack: Any, tmp_path: Path, folder: Path) -> dict[str, Any]:
    from modeldrop.local.samples.checkpoint import write_tar_gz

    packed = write_tar_gz(folder, tmp_path / f"{folder.name}.tar.gz")
    stack.client("s3").upload_file(str(packed), stack.bucket, f"direct/{folder.name}/model.tar.gz")
    arn = stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/{folder.name}/model.tar.gz"})
    desc: dict[str, Any] = stack.wait(arn, timeout=600)
    stack.settle()
    return desc


def test_the_pipeline_asks_the_engine_before_any_endpoint(make_stack: Any, tmp_path: Path) -> None:
    """EngineCheck, after ResolveImage: the image's engine judges the served copy (its headers and side files,
    rebuilt as a skeleton) and refuses in its own words what the static rules passed; an intact checkpoint
    goes on, its verdict in the record."""
    stack = make_stack({"EngineCheck": "Enabled", "DefaultEngine": "vllm"})
    base = write_cpu_checkpoint(tmp_path / "llama")
    odd = _variant(base, tmp_path, "odd-activation", config=lambda c: c.update(hidden_act="wibble"))
    from modeldrop.checkpoint.validation import validate_source

    assert validate_source(str(odd)).deployable  # what the static rules cannot know
    refused = _deploy(stack, tmp_path, odd)
    assert refused["status"] == "FAILED" and refused["error"] == "CheckpointRefused", refused
    assert "ENGINE_REFUSED" in refused["cause"] and "Unsupported activation: wibble" in refused["cause"]
    assert "CreateEndpointFunction" not in [i.function for i in stack.invocations]
    assert stack.leftover_resources() == []
    fine = _deploy(stack, tmp_path, base)
    assert fine["status"] == "SUCCEEDED", fine
    records = [r for r in stack.registry().deployments() if r.step_dict("engine_check")]
    verdicts = sorted(r.step_dict("engine_check")["verdict"] for r in records)
    assert verdicts == ["loads", "refused"], verdicts


def test_the_skeleton_holds_the_headers_and_no_weight_bytes(tmp_path: Path) -> None:
    from modeldrop.checkpoint.archive.artifact_scan import scan_local
    from modeldrop.checkpoint.engine.skeleton import write_skeleton

    base = write_cpu_checkpoint(tmp_path / "llama")
    skeleton = write_skeleton(scan_local(str(base)), tmp_path / "skeleton")
    shard = skeleton / "model.safetensors"
    assert shard.stat().st_size == (base / "model.safetensors").stat().st_size
    assert shard.stat().st_blocks * 512 < shard.stat().st_size  # sparse: the tensors' bytes were never written
    assert load_file(str(shard)).keys() == load_file(str(base / "model.safetensors")).keys()
    assert (skeleton / "config.json").read_bytes() == (base / "config.json").read_bytes()


def test_an_adapter_is_judged_by_peft_helper_on_its_base(tmp_path: Path) -> None:
    """validate ADAPTER --base BASE --engine-check: the base as a checkpoint, then vLLM's PEFTHelper and its
    validate_legal (DoRA, PiSSA-style inits, bias); the static rules refuse what it refuses."""
    from typer.testing import CliRunner

    from modeldrop.cli import app
    from modeldrop.local.samples.cpu_checkpoint import write_cpu_adapter

    base = write_cpu_checkpoint(tmp_path / "llama")
    verdicts = {}
    for name, change in {"plain": {}, "pissa": {"init_lora_weights": "pissa"}, "dora": {"use_dora": True}}.items():
        adapter = write_cpu_adapter(tmp_path / name)
        config = json.loads((adapter / "adapter_config.json").read_text())
        (adapter / "adapter_config.json").write_text(json.dumps({**config, **change}))
        result = CliRunner().invoke(app, ["validate", str(adapter), "--base", str(base), "--engine-check", "--json"])
        report = json.loads(result.stdout)
        verdicts[name] = (report["deployable"], report["engine_check"]["verdict"], report["engine_check"]["message"])
    assert verdicts["plain"][:2] == (True, "loads"), verdicts
    # The static rules refuse these first, so the CLI never starts the engine on them; asked directly, the
    # engine's own PEFTHelper refuses them in its words.
    assert verdicts["pissa"][:2] == verdicts["dora"][:2] == (False, "skipped"), verdicts
    from modeldrop.checkpoint.engine.engine_check import engine_check

    assert VLLM is not None
    pissa = engine_check(tmp_path / "pissa", TARGET, VLLM, base=base)
    if EngineVersion("vllm", str(pissa.version), "").at_least("0.32.0"):  # PEFTHelper refuses PiSSA from 0.32
        assert pissa.verdict == "refused" and "init_lora_weights='pissa'" in pissa.message, pissa
    else:  # 0.31 loads it and serves the wrong weights: the static rules are stricter on purpose
        assert pissa.verdict == "loads", pissa
    dora = engine_check(tmp_path / "dora", TARGET, VLLM, base=base)
    assert dora.verdict == "refused" and "DoRA" in dora.message, dora


def test_upload_asks_the_engine_before_the_first_byte(tmp_path: Path) -> None:
    """upload --engine-check: the engine's refusal stops it before any S3 call (no bucket exists here)."""
    base = write_cpu_checkpoint(tmp_path / "llama")
    broken = _variant(base, tmp_path, "odd", config=lambda c: c.update(hidden_act="wibble"))
    done = subprocess.run([sys.executable, "-m", "modeldrop", "upload", str(broken), "s3://no-such-bucket/x/",
                           "--engine-check", "--json"], capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["uploaded"] is False and result["validation"]["engine_check"]["verdict"] == "refused"
    assert "Unsupported activation: wibble" in result["validation"]["engine_check"]["message"]


def _speculator(config: dict[str, Any]) -> None:
    config["speculators_config"] = {
        "algorithm": "eagle3",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
        "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct", "architectures": ["LlamaForCausalLM"]},
    }


def test_a_config_naming_another_model_is_refused_and_the_engine_fetches_nothing(tmp_path: Path) -> None:
    """speculators_config makes vLLM serve the verifier it names, from the Hub: refused statically, the engine
    never started on it; and asked directly, the offline probe reaches nothing and does not answer `loads`."""
    base = write_cpu_checkpoint(tmp_path / "llama")
    spec = _variant(base, tmp_path, "speculator", config=_speculator)
    done = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(spec), "--engine-check", "--json"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    found = [f for f in report["findings"] if f["code"] == "CONFIG_NAMES_ANOTHER_MODEL"]
    assert found and "meta-llama/Llama-3.1-8B-Instruct" in found[0]["message"], report["findings"]
    assert report["engine_check"]["verdict"] == "skipped"
    assert VLLM is not None
    [line] = probe([spec], VLLM)
    assert line["verdict"] != "loads", line


def test_run_local_with_the_engine_check_killed_for_memory_fails_named_leaving_nothing() -> None:
    done = subprocess.run([sys.executable, "-m", "modeldrop", "run-local", "--fault", "engine-check-oom", "--json"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["status"] == "failed" and result["error"] == "EngineCheckFailed", result.get("cause")
    assert "memory bound" in json.dumps(result) and result["leftover_resources"] == []
    assert "CreateEndpoint" not in [s["name"] for s in result["states"]]


def test_the_channel_day_runs_with_the_engine_check_on_adapters_included() -> None:
    """README's `run-local --channel demo` as a user with the engine venv runs it (the check on by default):
    the shared base's adapter archive and the day-2 adapter-only copy are judged by PEFTHelper (not as model
    directories), the adapter is promoted and rolled back, exit 0, and no line carries a stack trace."""
    env = {k: v for k, v in os.environ.items() if k != "MODELDROP_ENGINE_CHECK"}
    done = subprocess.run([sys.executable, "-m", "modeldrop", "run-local", "--channel", "demo", "--json"],
                          capture_output=True, text=True, timeout=1800, env=env)  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-2000:])
    assert "stackTrace" not in done.stdout + done.stderr
    result = json.loads(done.stdout)
    steps = [s["step"] for s in result["channel"]["adapter_channel"]["steps"]]
    assert steps == ["created", "promoted, adapter only", "rolled back"], result["channel"]["adapter_channel"]
    assert result["leftover_resources"] == []


def test_the_projects_own_sample_is_judged_by_the_engine_by_default(tmp_path: Path) -> None:
    """README's `modeldrop sample ./s && modeldrop validate ./s`, no flag, the engine venv present: the
    engine's own code loads the sample (the text class vLLM serves), and the text says so in a line."""
    env = {k: v for k, v in os.environ.items() if k != "MODELDROP_ENGINE_CHECK"}
    sample = tmp_path / "s"
    made = subprocess.run([sys.executable, "-m", "modeldrop", "sample", str(sample)], capture_output=True, text=True,
                          timeout=300, env=env)  # fmt: skip
    assert made.returncode == 0, made.stderr
    text = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(sample)], capture_output=True,
                          text=True, timeout=900, env={**env, "COLUMNS": "200"})  # fmt: skip
    assert text.returncode == 0, text.stdout + text.stderr
    assert re.search(r"engine\s+vLLM [\d.]+ loads it", text.stdout), text.stdout
    # Cold, as in a new Lambda container (vLLM's model-info cache empty): vLLM inspects the class in the
    # probe's own process, not in a second import of vLLM (which doubled the tree's memory, 1.17 GB).
    cold = tmp_path / "cold-cache"
    done = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(sample), "--json"], capture_output=True,
                          text=True, timeout=900, env={**env, "XDG_CACHE_HOME": str(cold)})  # fmt: skip
    engine = json.loads(done.stdout)["engine_check"]
    assert done.returncode == 0 and engine["verdict"] == "loads", done.stdout
    assert list(cold.glob("vllm/modelinfos/*.json")) and engine["peak_rss_mb"] < 1024, engine
    skipped = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(sample), "--json",
                              "--no-engine-check"], capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    check = json.loads(skipped.stdout)["engine_check"]
    assert check["verdict"] == "unavailable" and "--no-engine-check" in check["message"]
