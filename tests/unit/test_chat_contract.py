"""The chat contract in validate: EOS ids consistent across config.json, generation_config.json, the
tokenizer and the template's end-of-turn token; the template rendered as transformers renders it
(differentially, against transformers itself when the engine venv is there); hostile templates stopped."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from modeldrop.checkpoint.chat.bounded_child import ChildRefused, run_bounded
from modeldrop.checkpoint.chat.chat_contract import chat_contract, drift, template_source
from modeldrop.checkpoint.chat.chat_template_render import RenderRefused, compile_template, render
from modeldrop.checkpoint.chat.vocabulary import sentencepiece_pieces
from modeldrop.cli import app
from modeldrop.local.samples.checkpoint import write_checkpoint

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + "
    "m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GEMMA = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' + m['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if m['role'] == 'user' %}{{ '[INST] ' + m['content'] + ' [/INST]' }}"
    "{% elif m['role'] == 'assistant' %}{{ m['content'] + eos_token }}{% endif %}{% endfor %}"
)
# Refuses a conversation that does not end with the user (the end-of-turn is read before the next turn).
USER_LAST = (
    "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('Most recent message must come from user!') }}"
    "{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}<|assistant|>"
)
THINKING = (  # transformers' {% generation %} tag, as Phi-4-reasoning's template uses it
    "{% for m in messages %}{% if m['role'] == 'assistant' %}<|im_start|>assistant<|im_sep|>{% generation %}"
    "{{ m['content'] }}<|im_end|>{% endgeneration %}{% else %}<|im_start|>{{ m['role'] }}<|im_sep|>"
    "{{ m['content'] }}<|im_end|>{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant"
    "<|im_sep|>{% endif %}"
)


def _tokenizer_json(specials: list[str], words: int = 20) -> bytes:
    vocab = {t: i for i, t in enumerate([*specials, *(f"w{n}" for n in range(words))])}
    added = [{"id": i, "content": t, "special": True} for i, t in enumerate(specials)]
    model = {"type": "WordLevel", "vocab": vocab}
    return json.dumps({"version": "1.0", "added_tokens": added, "model": model}).encode()


def _files(
    template: str, specials: list[str], eos: str | None, stop: Any, config_eos: Any = None, **tok: Any
) -> tuple[dict[str, Any], dict[str, Any], dict[str, bytes]]:
    tokenizer_config = {"eos_token": eos, **tok} if eos else dict(tok)
    files = {
        "tokenizer.json": _tokenizer_json(specials),
        "chat_template.jinja": template.encode(),
        "tokenizer_config.json": json.dumps(tokenizer_config).encode(),
    }
    if stop is not None:
        files["generation_config.json"] = json.dumps({"eos_token_id": stop}).encode()
    config = {} if config_eos is None else {"eos_token_id": config_eos}
    return config, tokenizer_config, files


def _codes(*args: Any, **kwargs: Any) -> dict[str, str]:
    _contract, findings = chat_contract(*_files(*args, **kwargs))
    return {f.code: f.severity for f in findings}


@pytest.mark.parametrize(
    ("template", "specials", "eos", "stop", "end"),
    [
        (CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", [2, 0], "<|im_end|>"),
        (LLAMA3, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
         "<|eot_id|>", [1, 4], "<|eot_id|>"),
        (GEMMA, ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<eos>", [1, 4], "<end_of_turn>"),
        (MISTRAL, ["<unk>", "<s>", "</s>"], "</s>", 2, "</s>"),
        (USER_LAST, ["<|endoftext|>", "<|end|>", "<|user|>", "<|assistant|>", "<|system|>"], "<|endoftext|>",
         [0, 1], "<|end|>"),
        (THINKING, ["<|endoftext|>", "<|im_start|>", "<|im_sep|>", "<|im_end|>"], "<|im_end|>", [3], "<|im_end|>"),
    ],
)  # fmt: skip
def test_the_chat_contracts_of_instruct_formats_are_accepted(
    template: str, specials: list[str], eos: str, stop: Any, end: str
) -> None:
    contract, findings = chat_contract(*_files(template, specials, eos, stop, bos_token=specials[1]))
    assert findings == [] and contract.end_of_turn == end and contract.tokenizer_eos == eos


def test_generation_config_eos_other_than_the_tokenizers_is_refused() -> None:
    codes = _codes(CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", 0)
    assert codes == {"CHAT_EOS_MISMATCH": "error"}
    # Without a generation config, config.json's eos_token_id is what the engines stop on.
    codes = _codes(CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", None, config_eos=0)
    assert codes == {"CHAT_EOS_MISMATCH": "error"}
    _c, findings = chat_contract(*_files(CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", 0))
    assert "add 2 to eos_token_id in generation_config.json" in findings[0].hint


def test_an_end_of_turn_token_missing_from_the_vocabulary_is_refused() -> None:
    codes = _codes(CHATML, ["<|endoftext|>", "<|im_start|>"], "<|endoftext|>", 0)
    assert codes == {"CHAT_END_OF_TURN_MISSING": "error"}
    # An end-of-turn token that exists but is no stop id: replies run on, a warning.
    codes = _codes(CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|endoftext|>", 0)
    assert codes == {"CHAT_END_OF_TURN_NOT_STOP": "warning"}


@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{{ m.content }",  # not Jinja
        "{% for m in messages %}{{ m['from'] + ': ' + m['value'] }}{% endfor %}",  # ShareGPT keys
        "{{ raise_exception('this template renders nothing') }}",
        "{% for m in messages %}{{ m['role'] }}{% endfor %}",  # the reply never appears
    ],
)
def test_a_template_that_does_not_render_is_refused(template: str) -> None:
    _contract, findings = chat_contract(*_files(template, ["<eos>"], "<eos>", 0))
    assert [f.code for f in findings] == ["CHAT_TEMPLATE_INVALID"] and findings[0].hint


def test_no_eos_anywhere_is_refused_and_an_eos_the_vocabulary_lacks_too() -> None:
    assert _codes(CHATML, ["<|im_start|>", "<|im_end|>"], None, None) == {"CHAT_NO_EOS": "error"}
    codes = _codes(CHATML, ["<|im_start|>", "<|im_end|>"], "<|endoftext|>", None)
    assert codes == {"CHAT_EOS_NOT_IN_VOCAB": "error"}


@pytest.mark.parametrize(
    "template",
    [
        "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}",
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}",
        "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
        "{{ 'x' | center(1000000000) }}",
        "{{ 'x'.ljust(1000000000) }}",
        "{{ 'x' * 1000000000 }}",
        "{{ 7 ** 1000000000 }}",
    ],
)
def test_a_hostile_template_is_stopped_not_run(template: str) -> None:
    # Compiling alone may run it (jinja folds constant filters): bounded as validate bounds it.
    with pytest.raises((RenderRefused, ChildRefused)):
        run_bounded(lambda: render(compile_template(template), messages=[]), seconds=30.0, memory_bytes=128 << 20)
    _contract, findings = chat_contract(*_files(template, ["<eos>"], "<eos>", 0))
    assert [f.code for f in findings] == ["CHAT_TEMPLATE_INVALID"] and "stopped" in findings[0].message


def test_a_template_that_recurses_or_nests_too_deep_is_a_finding_not_a_traceback() -> None:
    for template in ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}"):
        _contract, findings = chat_contract(*_files(template, ["<eos>"], "<eos>", 0))
        assert [f.code for f in findings] == ["CHAT_TEMPLATE_INVALID"], template[:40]


def test_hostile_side_files_are_held_to_the_side_file_bounds() -> None:
    config, tokenizer_config, files = _files(CHATML, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "<|im_end|>", 2)
    files["generation_config.json"] = b"[" * 100_000 + b"]" * 100_000  # deep: RecursionError in a bare json.loads
    files["special_tokens_map.json"] = b"\xef\xbb\xbf{}"
    del files["chat_template.jinja"]
    files["chat_template.json"] = b"[[]," * 200_000  # past the value bound
    _contract, findings = chat_contract(config, tokenizer_config, files)
    assert {f.code for f in findings} == {"JSON_INVALID", "JSON_ENCODING", "JSON_TOO_LARGE"}
    # An eos_token no vocabulary could hold is not searched for in the tokenizer's bytes.
    long_eos = "<" + "x" * 300 + ">"
    _contract, findings = chat_contract(*_files(CHATML, ["<|im_start|>", "<|im_end|>"], long_eos, None))
    assert [f.code for f in findings] == ["CHAT_EOS_NOT_IN_VOCAB"]


def _piece(text: str) -> bytes:
    raw = text.encode()
    inner = b"\x0a" + bytes([len(raw)]) + raw + b"\x15\x00\x00\x00\x00"  # field 1 (piece), field 2 (score)
    return b"\x0a" + bytes([len(inner)]) + inner


def test_a_sentencepiece_model_gives_ids_by_position() -> None:
    model = b"".join(_piece(t) for t in ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"])
    model += b"\x12\x02\x08\x01"  # a trainer_spec field, skipped
    assert sentencepiece_pieces(model) == {"<unk>": 0, "<s>": 1, "</s>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
    assert sentencepiece_pieces(b"\x0a\xff\xff\xff") is None
    files = {"tokenizer.model": model, "chat_template.jinja": GEMMA.encode()}
    contract, findings = chat_contract({}, {"eos_token": "</s>", "bos_token": "<s>"}, files)
    assert contract.tokenizer_eos_id == 2 and contract.end_of_turn == "<end_of_turn>"
    assert [f.code for f in findings] == ["CHAT_END_OF_TURN_NOT_STOP"]


def test_a_named_template_list_uses_the_default_and_the_jinja_file_wins() -> None:
    named = {"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": CHATML}]}
    assert template_source(named, {}) == CHATML
    assert template_source(named, {"chat_template.jinja": b"jinja"}) == "jinja"
    assert template_source({}, {"chat_template.json": json.dumps({"chat_template": GEMMA}).encode()}) == GEMMA


def test_drift_names_what_changed() -> None:
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    old, _ = chat_contract(*_files(CHATML, specials, "<|im_end|>", [2, 0]))
    new, _ = chat_contract(*_files(LLAMA3, [*specials, "<|eot_id|>"], "<|im_end|>", [2]))
    changes = drift(old, new)
    assert any(c.startswith("chat template:") for c in changes) and "eos_token_id (stop ids): [2, 0] -> [2]" in changes
    assert drift(old, old) == []


def test_validate_refuses_a_broken_contract_with_the_finding_and_its_fix(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt")
    ok = CliRunner().invoke(app, ["validate", str(checkpoint), "--json"])
    assert ok.exit_code == 0, ok.stdout
    assert json.loads(ok.stdout)["chat_contract"]["end_of_turn"] == "<end_of_turn>"
    (checkpoint / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    result = CliRunner().invoke(app, ["validate", str(checkpoint)])
    assert result.exit_code == 1 and "CHAT_EOS_MISMATCH" in result.stdout and "add 1 to eos_token_id" in result.stdout


def test_validate_against_the_serving_version_names_the_drift(tmp_path: Path) -> None:
    serving = write_checkpoint(tmp_path / "serving")
    candidate = write_checkpoint(tmp_path / "candidate")
    same = CliRunner().invoke(app, ["validate", str(candidate), "--serving", str(serving), "--json"])
    assert same.exit_code == 0 and "CHAT_CONTRACT_DRIFT" not in same.stdout
    (candidate / "chat_template.jinja").write_text(
        CHATML.replace("<|im_start|>", "<start_of_turn>").replace("<|im_end|>", "<end_of_turn>")
    )
    (candidate / "generation_config.json").write_text(json.dumps({"eos_token_id": [1]}))
    changed = CliRunner().invoke(app, ["validate", str(candidate), "--serving", str(serving), "--json"])
    drift = [f for f in json.loads(changed.stdout)["findings"] if f["code"] == "CHAT_CONTRACT_DRIFT"]
    assert changed.exit_code == 0 and len(drift) == 1 and drift[0]["severity"] == "warning"
    assert "chat template:" in drift[0]["message"] and "eos_token_id (stop ids): [1, 5] -> [1]" in drift[0]["message"]


VLLM_PYTHON = os.environ.get("MODELDROP_VLLM_PYTHON")
REFERENCE = """
import json, sys
from transformers.utils.chat_template_utils import render_jinja_template
out = []
for case in json.load(sys.stdin):
    try:
        out.append(render_jinja_template([case["messages"]], chat_template=case["template"], **case["specials"])[0][0])
    except Exception:
        out.append(None)
print(json.dumps(out))
"""


@pytest.mark.skipif(not VLLM_PYTHON, reason="set MODELDROP_VLLM_PYTHON (transformers is in the engine venv)")
def test_templates_render_exactly_as_transformers_renders_them() -> None:
    cases = []
    for template in (CHATML, LLAMA3, GEMMA, MISTRAL, USER_LAST, THINKING, "{{ messages | tojson }}"):
        for messages in (
            [{"role": "system", "content": "S <b>"}, {"role": "user", "content": " U "}],
            [{"role": "user", "content": "U"}, {"role": "assistant", "content": "A & é"}],
        ):
            specials = {"bos_token": "<s>", "eos_token": "</s>"}
            cases.append({"template": template, "messages": messages, "specials": specials})
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", REFERENCE], input=json.dumps(cases), capture_output=True, text=True, check=True
    )
    expected = json.loads(done.stdout)
    mine = []
    for case in cases:
        try:
            mine.append(render(compile_template(case["template"]), messages=case["messages"], **case["specials"]))
        except Exception:
            mine.append(None)
    assert mine == expected and sum(e is not None for e in expected) >= 10


HOSTILE_WORK = {
    # A sandbox global looping where the tracer does not follow it.
    "lipsum": "{{ lipsum(999999, false, 999999, 1000000) }}{% for m in messages %}{{ m.content }}{% endfor %}",
    # Each filter multiplies the string tenfold: 10 GB by the end, built inside calls no tracer measures.
    "replace": "{% set s = 'x' * 1000 %}{{ (s" + "|replace('x', 'xxxxxxxxxx')" * 7 + ")|length }}"
    "{% for m in messages %}{{ m.content }}{% endfor %}",
    "indent": "{{ ('a\\n' * 500000)|indent(999999) }}{% for m in messages %}{{ m.content }}{% endfor %}",
}


@pytest.mark.parametrize("name", list(HOSTILE_WORK))
def test_a_template_that_works_past_the_bounds_is_refused_by_the_cli_without_a_traceback(
    tmp_path: Path, name: str
) -> None:
    folder = write_checkpoint(tmp_path / name)
    (folder / "chat_template.jinja").write_text(HOSTILE_WORK[name])
    result = CliRunner().invoke(app, ["validate", str(folder), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    findings = {f["code"]: f["message"] for f in json.loads(result.stdout)["findings"]}
    assert "stopped" in findings["CHAT_TEMPLATE_INVALID"], findings


def test_the_bounded_child_stops_work_past_its_seconds_and_its_memory() -> None:
    import time

    from modeldrop.checkpoint.chat.bounded_child import ChildRefused, run_bounded

    with pytest.raises(ChildRefused, match="past 1 s"):
        run_bounded(time.sleep, 60, seconds=1.0, memory_bytes=64 << 20)
    with pytest.raises(ChildRefused, match="more than 64 MiB"):
        run_bounded(bytearray, 512 << 20, seconds=60.0, memory_bytes=64 << 20)
    assert run_bounded(sum, [1, 2, 3], seconds=60.0, memory_bytes=64 << 20) == 6


def test_a_tokenizer_with_tokens_past_the_embedding_is_refused() -> None:
    """Special tokens added without resize_token_embeddings: vLLM loads the model and fails on the first
    request that uses one (IndexError); the tokenizer's highest id against config.json's vocab_size."""
    added = {"added_tokens_decoder": {"300": {"content": "<|tool|>", "special": True, "lstrip": False,
                                              "rstrip": False, "normalized": False, "single_word": False}},
             "eos_token": "<|tool|>"}  # fmt: skip
    _, findings = chat_contract({"vocab_size": 256}, added, {})
    found = [f for f in findings if f.code == "TOKENIZER_PAST_EMBEDDING"]
    assert found and "300" in found[0].message and "256" in found[0].message
    _, fits = chat_contract({"vocab_size": 512}, added, {})
    assert not [f for f in fits if f.code == "TOKENIZER_PAST_EMBEDDING"]


def test_a_tokenizer_whose_own_vocabulary_outgrows_the_embedding_is_refused_naming_the_first_id() -> None:
    """Not only added tokens: tokenizer.json's model vocabulary (WordLevel/BPE map, Unigram list) can hold ids
    the embedding has no row for; vLLM dies (IndexError) at the first request holding one."""
    words = {f"w{i}": i for i in range(600)}
    tokenizer = {"added_tokens": [], "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"}}
    raw = json.dumps(tokenizer).encode()
    _, findings = chat_contract({"vocab_size": 512}, {"eos_token": "w1"}, {"tokenizer.json": raw})
    found = [f for f in findings if f.code == "TOKENIZER_PAST_EMBEDDING"]
    assert found and "first id past the embedding is 512" in found[0].message and "599" in found[0].message
    _, fits = chat_contract({"vocab_size": 600}, {"eos_token": "w1"}, {"tokenizer.json": raw})
    assert not [f for f in fits if f.code == "TOKENIZER_PAST_EMBEDDING"]
    unigram = {"model": {"type": "Unigram", "vocab": [[f"p{i}", -1.5] for i in range(520)]}}
    _, pieces = chat_contract(
        {"vocab_size": 512}, {"eos_token": "p1"}, {"tokenizer.json": json.dumps(unigram).encode()}
    )
    assert [f for f in pieces if f.code == "TOKENIZER_PAST_EMBEDDING"]
