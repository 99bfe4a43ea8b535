"""Side files held to what the libraries the engine starts with accept: transformers' strict config
(field types from its own annotations), the tokenizers library's tokenizer.json, transformers' special
tokens, the engine's stop ids; and the files transformers ignores are not refused. Each case is a
mutation of a checkpoint the sample writer makes; with the engine venv, transformers itself judges
every case and validate may not accept what it refuses."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from modeldrop.checkpoint.archive.artifact_scan import scan_local
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.checkpoint.weights.config_rules import matches
from modeldrop.local.samples.checkpoint import write_checkpoint

VLLM_PYTHON = os.environ.get("MODELDROP_VLLM_PYTHON")
ROOT = Path(__file__).resolve().parents[2]
Mutation = Callable[[Path], None]


def _json(name: str, change: Callable[[Any], None]) -> Mutation:
    def mutate(d: Path) -> None:
        value = json.loads((d / name).read_text())
        change(value)
        (d / name).write_text(json.dumps(value))

    return mutate


def _text(change: Callable[[dict[str, Any]], None]) -> Mutation:
    return _json("config.json", lambda c: change(c.get("text_config", c)))


def _template_a_number(d: Path) -> None:
    """tokenizer_config.json's chat_template a number, with no chat_template.jinja to take its place."""
    _json("tokenizer_config.json", lambda c: c.update(chat_template=7))(d)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    (d / "chat_template.json").unlink(missing_ok=True)


def _retype(d: Path) -> None:
    shard = d / "model-00001-of-00002.safetensors"
    raw = shard.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    first = next(k for k in sorted(header) if k != "__metadata__")
    header[first]["dtype"] = "F16"
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    shard.write_bytes(raw[:8] + text + raw[8 + n :])


def _template_in_tokenizer_config(d: Path) -> None:
    config = json.loads((d / "tokenizer_config.json").read_text())
    config["chat_template"] = (d / "chat_template.jinja").read_text()
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    (d / "chat_template.jinja").unlink()
    (d / "chat_template.json").write_text("{not json")


def _tokenizer(change: Callable[[dict[str, Any]], None]) -> Mutation:
    return _json("tokenizer.json", change)


# name -> (mutation, the error codes validate must give; empty: it must accept)
CASES: dict[str, tuple[Mutation, set[str]]] = {
    "intact": (lambda d: None, set()),
    "hidden_size float": (_text(lambda c: c.update(hidden_size=64.0)), {"CONFIG_FIELD_TYPE"}),
    "num_hidden_layers string": (_text(lambda c: c.update(num_hidden_layers="6")), {"CONFIG_FIELD_TYPE"}),
    "use_cache 1": (_text(lambda c: c.update(use_cache=1)), {"CONFIG_FIELD_TYPE"}),
    "rms_norm_eps int": (_text(lambda c: c.update(rms_norm_eps=1)), {"CONFIG_FIELD_TYPE"}),
    "unknown model_type": (
        _json("config.json", lambda c: c.update(model_type="nonesuch")),
        {"CONFIG_MODEL_TYPE_UNKNOWN"},
    ),
    "torch_dtype int": (_json("config.json", lambda c: c.update(torch_dtype=5)), {"CONFIG_DTYPE_INVALID"}),
    "torch_dtype unknown": (_json("config.json", lambda c: c.update(torch_dtype="float99")), {"CONFIG_DTYPE_INVALID"}),
    "pad past vocab": (_text(lambda c: c.update(pad_token_id=100_000)), {"CONFIG_PAD_TOKEN_OUT_OF_VOCAB"}),
    "eos_token int": (
        _json("tokenizer_config.json", lambda c: c.update(eos_token=1)),
        {"TOKENIZER_SPECIAL_TOKEN_INVALID"},
    ),
    "eos_token list": (
        _json("tokenizer_config.json", lambda c: c.update(eos_token=["<eos>"])),
        {"TOKENIZER_SPECIAL_TOKEN_INVALID"},
    ),
    "generation eos NaN": (
        lambda d: (d / "generation_config.json").write_text('{"eos_token_id": NaN}'),
        {"GENERATION_CONFIG_INVALID"},
    ),
    "tokenizer.json cut off": (
        lambda d: (d / "tokenizer.json").write_bytes((d / "tokenizer.json").read_bytes()[:1500]),
        {"TOKENIZER_JSON_INVALID"},
    ),
    "added token without single_word": (
        _tokenizer(lambda t: t["added_tokens"][3].pop("single_word")),
        {"TOKENIZER_JSON_INVALID"},
    ),
    "added token id a string": (_tokenizer(lambda t: t["added_tokens"][3].update(id="3")), {"TOKENIZER_JSON_INVALID"}),
    "tokenizer model of no kind": (_tokenizer(lambda t: t["model"].update(type="Wibble")), {"TOKENIZER_JSON_INVALID"}),
    # transformers loads it; vLLM refuses every chat request ("Can't compile non template nodes", the golden).
    "chat_template a number": (_template_a_number, {"CHAT_TEMPLATE_INVALID"}),
    "added_tokens.json broken": (lambda d: (d / "added_tokens.json").write_text("{broken"), {"JSON_INVALID"}),
    # What transformers loads: not refused. F16 among BF16 is a warning (WEIGHTS_DTYPE_MIXED): vLLM casts each
    # tensor as it loads it and serves the same tokens (tests/fixtures/engine-golden.json, llama/fp16-shard).
    "a header re-typed F16 among BF16": (_retype, set()),
    # The eos token's text where its id belongs: transformers and vLLM serve it (the golden's eos-as-string).
    "generation eos string": (_json("generation_config.json", lambda c: c.update(eos_token_id="1")), set()),
    "broken chat_template.json beside a good template": (_template_in_tokenizer_config, set()),
    "empty chat_template beside the .jinja": (
        _json("tokenizer_config.json", lambda c: c.update(chat_template="")),
        set(),
    ),
    "eos id in added_tokens_decoder differs from tokenizer.json": (
        _json("tokenizer_config.json", lambda c: c.update(added_tokens_decoder={"7": {"content": "<eos>"}})),
        set(),
    ),
    "broken preprocessor_config.json": (lambda d: (d / "preprocessor_config.json").write_text("{x"), set()),
}


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("side-files")
    base = write_checkpoint(root / "_base")
    out = {}
    for i, (name, (mutate, _codes)) in enumerate(CASES.items()):
        d = root / f"case{i:02d}"
        shutil.copytree(base, d)
        mutate(d)
        out[name] = d
    return out


def _errors(d: Path) -> set[str]:
    report = validate_scan(scan_local(str(d)))
    return {f.code for f in report.findings if f.severity == "error"}


@pytest.mark.parametrize("name", list(CASES))
def test_each_side_file_case_gets_its_verdict(cases: dict[str, Path], name: str) -> None:
    _mutate, codes = CASES[name]
    errors = _errors(cases[name])
    assert codes <= errors if codes else not errors, (name, errors)


def test_the_checker_holds_json_types_as_transformers_strict_config_does() -> None:
    assert matches(3, "int") and not matches(True, "int") and not matches(3.0, "int")
    assert matches(1.0, "float") and not matches(1, "float")  # strict: an int is not a float
    assert matches(None, "int|none") and not matches(None, "int")
    assert matches([1, 2], "int|list[int]|none") and not matches([1, "2"], "int|list[int]|none")


REFERENCE = r"""
import json, logging, sys, warnings
warnings.filterwarnings("ignore"); logging.disable(logging.WARNING)
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
out = {}
for d in sys.argv[1:]:
    try:
        AutoConfig.from_pretrained(d); AutoTokenizer.from_pretrained(d); GenerationConfig.from_pretrained(d)
        out[d] = None
    except Exception as exc:
        out[d] = f"{type(exc).__name__}: {str(exc)[:160]}"
print(json.dumps(out))
"""


@pytest.mark.skipif(not VLLM_PYTHON, reason="set MODELDROP_VLLM_PYTHON (transformers is in the engine venv)")
def test_validate_never_accepts_what_transformers_refuses(cases: dict[str, Path]) -> None:
    done = subprocess.run(
        [str(VLLM_PYTHON), "-c", REFERENCE, *map(str, cases.values())], capture_output=True, text=True, check=True
    )
    verdicts = json.loads(done.stdout.strip().splitlines()[-1])
    refused = {name: verdicts[str(d)] for name, d in cases.items() if verdicts[str(d)]}
    assert verdicts[str(cases["intact"])] is None and len(refused) >= 12
    wrong = {name: why for name, why in refused.items() if not _errors(cases[name])}
    assert not wrong, wrong
    # And what it loads with no rule of ours against it is accepted.
    for name, (_mutate, codes) in CASES.items():
        if not codes:
            assert verdicts[str(cases[name])] is None, name


@pytest.mark.skipif(not VLLM_PYTHON, reason="set MODELDROP_VLLM_PYTHON (transformers is in the engine venv)")
def test_the_config_field_table_is_the_engine_venvs_transformers() -> None:
    done = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "tools" / "gen_config_fields.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


ADDED_TOKENS: dict[str, Any] = {
    "a key that is no integer": {"abc": {"content": "<x>"}},
    "content not a string": {"7": {"content": 5}},
    "a flag not a bool": {"7": {"content": "<x>", "special": 1}},
    "a token given as a string": {"7": "<x>"},
    "a token given as a list": {"7": ["<x>"]},
    "the decoder a list": [],
    "an unknown field (ignored)": {"7": {"content": "<x>", "foo": 1}},
    "no content (an empty token)": {"7": {"special": True}},
    "a negative key": {"-3": {"content": "<x>"}},
    "a key with a space": {" 7": {"content": "<x>"}},
    "a well-formed token": {
        "7": {
            "content": "<x>",
            "special": True,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
    },
}
LOAD_TOKENIZERS = """
import json, sys
from transformers import AutoTokenizer
verdicts = {}
for folder in sys.argv[1:]:
    try:
        AutoTokenizer.from_pretrained(folder)
        verdicts[folder] = "loads"
    except Exception as exc:
        verdicts[folder] = f"refused {type(exc).__name__}: {exc}"
print(json.dumps(verdicts))
"""


@pytest.mark.skipif(not VLLM_PYTHON, reason="set MODELDROP_VLLM_PYTHON (transformers is in the engine venv)")
def test_added_tokens_are_refused_exactly_where_transformers_refuses_them(tmp_path: Path) -> None:
    """The engine loads the tokenizer with transformers at start-up: each added_tokens_decoder variant judged by
    the engine venv's transformers (one process for all) and by the static rule, which agree."""
    from modeldrop.checkpoint.weights.config_rules import added_tokens_findings

    base = write_checkpoint(tmp_path / "base")
    folders = {}
    for name, decoder in ADDED_TOKENS.items():
        folder = folders[name] = tmp_path / name.replace(" ", "-")
        shutil.copytree(base, folder)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        config["added_tokens_decoder"] = decoder
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    done = subprocess.run([str(VLLM_PYTHON), "-c", LOAD_TOKENIZERS, *map(str, folders.values())], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    library = json.loads(done.stdout.strip().splitlines()[-1])
    disagree = []
    for name, folder in folders.items():
        config = json.loads((folder / "tokenizer_config.json").read_text())
        mine = added_tokens_findings(config)
        if library[str(folder)].startswith("refused") != bool(mine):
            disagree.append((name, library[str(folder)], [f.message for f in mine]))
    assert disagree == []
    assert sum(v.startswith("refused") for v in library.values()) >= 5
