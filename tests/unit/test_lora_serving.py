"""Serving a LoRA adapter: each engine's env, the GPU memory its LoRA slots take, the reference
engine's per-adapter answers, and the eval's check that the adapter is really applied."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from modeldrop.contracts.models import AdapterInfo
from modeldrop.serving.lora_plan import lora_env, lora_gib, slot_rank

ADAPTER = AdapterInfo(
    name="lora-a", path="/opt/ml/model/adapters/lora-a", max_rank=24, modules=12, bytes=1, features=1536
)


def test_each_engine_gets_its_own_lora_keys_at_an_accepted_rank() -> None:
    assert slot_rank(24) == 32 and slot_rank(8) == 8 and slot_rank(300) == 320
    assert lora_env("vllm", ADAPTER) == {
        "SM_VLLM_ENABLE_LORA": "",
        "SM_VLLM_LORA_MODULES": "lora-a=/opt/ml/model/adapters/lora-a",
        "SM_VLLM_MAX_LORAS": "1",
        "SM_VLLM_MAX_LORA_RANK": "32",
    }
    assert lora_env("sglang", ADAPTER)["SM_SGLANG_LORA_PATHS"] == "lora-a=/opt/ml/model/adapters/lora-a"
    lmi = lora_env("lmi", ADAPTER)
    assert (lmi["OPTION_ENABLE_LORA"], lmi["OPTION_MAX_LORA_RANK"], lmi["OPTION_MAX_LORAS"]) == ("true", "32", "1")
    # A and B of every adapted module at the slot rank, bf16, per resident adapter.
    assert lora_gib(ADAPTER, 2) == pytest.approx(1536 * 32 * 2 * 2 / 1024**3)


def test_the_plan_serves_the_adapter_and_counts_its_memory() -> None:
    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan
    from modeldrop.serving.plan import plan_checkpoint

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    summary = validate_scan(scan_source(str(fixtures / "gemma4-text-dense"))).summary()
    big = ADAPTER.model_copy(update={"features": 400_000_000, "max_rank": 512})  # 381 GiB of LoRA buffers
    plain = plan_checkpoint("vllm", summary, "ml.g6.2xlarge", "us-east-1")
    served = plan_checkpoint("vllm", summary.model_copy(update={"adapter": ADAPTER}), "ml.g6.2xlarge", "us-east-1")
    assert "SM_VLLM_LORA_MODULES" not in plain.env and served.env["SM_VLLM_MAX_LORA_RANK"] == "32"
    assert any("lora-a" in w and "GPU memory reserved" in w for w in served.warnings)
    from modeldrop.contracts.errors import PlanRefused

    with pytest.raises(PlanRefused):
        plan_checkpoint("vllm", summary.model_copy(update={"adapter": big}), "ml.g6.2xlarge", "us-east-1")


def _serve(model_dir: Path, env: dict[str, str]) -> tuple[Any, str]:
    from http.server import ThreadingHTTPServer

    from modeldrop.local.engines import reference_engine

    engine = reference_engine.Engine(model_dir, env)
    engine.load()

    class Handler(reference_engine.Handler):
        pass

    Handler.engine = engine
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/invocations"


def _ask(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_reference_engine_answers_per_adapter_and_refuses_unknown_names(tmp_path: Path) -> None:
    from modeldrop.local.samples.adapter import write_adapter
    from modeldrop.local.samples.checkpoint import write_checkpoint

    model = write_checkpoint(tmp_path / "model")
    write_adapter(model / "adapters" / "lora-a", seed=3)
    write_adapter(model / "adapters" / "lora-b", seed=9)
    env = {"SM_VLLM_LORA_MODULES": "lora-a=/opt/ml/model/adapters/lora-a lora-b=/opt/ml/model/adapters/lora-b"}
    server, url = _serve(model, env)
    try:
        ask = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 64}
        answers = {}
        for name in (None, "lora-a", "lora-b"):
            status, body = _ask(url, {**ask, **({"model": name} if name else {})})
            assert status == 200, body
            answers[name] = body["choices"][0]["message"]["content"]
        assert len(set(answers.values())) == 3  # the base and each adapter answer differently, deterministically
        assert _ask(url, {**ask, "model": "lora-a"})[1]["choices"][0]["message"]["content"] == answers["lora-a"]
        status, body = _ask(url, {**ask, "model": "lora-c"})
        assert status == 404 and body["message"] == "The model `lora-c` does not exist."
    finally:
        server.shutdown()


def test_the_adapter_is_named_where_each_engine_reads_it() -> None:
    from modeldrop.evaluation.chat_protocol import build_body

    messages = [{"role": "user", "content": "hi"}]
    assert build_body("chat", messages, 8, False, "lora-a")["model"] == "lora-a"
    lmi_chat = build_body("chat", messages, 8, False, "lora-a", adapter_field="adapters")
    assert lmi_chat["adapters"] == ["lora-a"] and "model" not in lmi_chat
    assert build_body("lmi", messages, 8, False, "lora-a")["adapters"] == ["lora-a"]
    assert "model" not in build_body("chat", messages, 8, False)


def test_an_adapter_answering_as_the_base_is_caught() -> None:
    from modeldrop.contracts.models import EvalThresholds
    from modeldrop.evaluation.runner import adapter_ignored
    from modeldrop.evaluation.smoke_eval import CaseResult, verdict

    def report(*answers: str) -> Any:
        cases = [CaseResult(id=str(i), outcome="pass", max_tokens=8, answer_preview=a) for i, a in enumerate(answers)]
        return verdict("e", cases, EvalThresholds())

    assert adapter_ignored(report("a", "b"), report("a", "b"))
    assert not adapter_ignored(report("a", "c"), report("a", "b"))
