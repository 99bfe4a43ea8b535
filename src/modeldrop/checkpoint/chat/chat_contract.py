"""The chat contract, judged statically before any GPU: the model must be able to stop.

"The fine-tuned model never stops" is among the most reported fine-tuning problems (LlamaFactory#7454,
Qwen3#927, unsloth#1008): a tokenizer whose eos_token the generation config does not stop on, a chat
template ending turns with a token the vocabulary lacks, no EOS at all. vLLM stops on the tokenizer's
EOS and generation_config.json's `eos_token_id` (config.json's when there is no generation config);
transformers' generate() on the generation config's alone. The template is rendered as transformers
renders it, and its end-of-turn token is what it writes right after an assistant reply.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import jinja2
from pydantic import BaseModel, Field

from modeldrop.checkpoint.chat.bounded_child import ChildRefused, run_bounded
from modeldrop.checkpoint.chat.chat_template_render import RenderRefused, compile_template, render
from modeldrop.checkpoint.chat.side_files import parse_json
from modeldrop.checkpoint.chat.vocabulary import PRESENT, Vocabulary, token_text, vocabulary
from modeldrop.contracts.models import Finding

SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
# What the template is asked to render: it must write the assistant's reply where this is.
REPLY = "modeldrop-reply-7f3a"
# A marker that looks like a special token: <|im_end|>, DeepSeek's full-width-bar kind, <end_of_turn>, [/INST].
_MARKER = re.compile(
    r"<\|[^<>|\s]{1,64}\|>|<\uff5c[^\uff5c\s]{1,64}\uff5c>" r"|<[A-Za-z_/][^<>\s]{0,62}>|\[/?[A-Z_]{2,32}\]"
)
# What rendering a chat template may take (a real one renders its eight conversations in milliseconds).
RENDER_SECONDS = 10.0
RENDER_MEMORY_BYTES = 128 << 20
TEMPLATE_HINT = "fix the chat template (tokenizer.apply_chat_template must render it) and save it with the tokenizer"


class ChatContract(BaseModel):
    """What a checkpoint's chat behaviour rests on, compared between a channel's versions."""

    template_sha256: str | None = None
    tokenizer_eos: str | None = None
    tokenizer_eos_id: int | None = None
    stop_ids: list[int] = Field(default_factory=list)  # generation_config's (config.json's without one)
    end_of_turn: str | None = None
    generation_config_sha256: str | None = None
    tokenizer_sha256: str | None = None


def _ids(value: Any) -> list[int]:
    items = value if isinstance(value, list) else [value]
    return [v for v in items if isinstance(v, int) and not isinstance(v, bool)]


def _side(name: str, small_files: dict[str, bytes], findings: list[Finding]) -> dict[str, Any]:
    """A JSON side file held to side_files' bounds (a refused one is a finding, and empty here)."""
    raw = small_files.get(name)
    return (parse_json(name, raw, findings) or {}) if raw is not None else {}


def template_source(
    tokenizer_config: dict[str, Any], small_files: dict[str, bytes], findings: list[Finding] | None = None
) -> str | None:
    """The template transformers would use: chat_template.jinja, then chat_template.json, then
    tokenizer_config.json's (a named list's "default")."""
    if "chat_template.jinja" in small_files:
        return small_files["chat_template.jinja"].decode("utf-8", "replace")
    refused: list[Finding] = []
    side = _side("chat_template.json", small_files, refused)
    if findings is not None and any(f.code == "JSON_TOO_LARGE" for f in refused):
        findings += refused  # modeldrop's bound, not the library's: refused, not ignored
    elif refused and findings is not None:  # transformers skips a chat_template.json it cannot read
        findings.append(
            _finding(
                "CHAT_TEMPLATE_FILE_IGNORED",
                "warning",
                refused[0].message + ": transformers ignores it and uses tokenizer_config.json's template, if any",
                "re-save chat_template.json, or delete it",
            )
        )
    value = side.get("chat_template") or tokenizer_config.get("chat_template")
    if findings is not None and not _template_shaped(value):
        findings.append(
            _finding(
                "CHAT_TEMPLATE_INVALID",
                "error",
                f"the chat_template is {type(value).__name__} {str(value)[:40]!r}, not a Jinja template (a string, or "
                "a list of {name, template}): the engine starts, then refuses every chat request (vLLM: \"Can't "
                'compile non template nodes")',
                TEMPLATE_HINT,
            )
        )
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if isinstance(value, dict):
        value = value.get("default")
    return value if isinstance(value, str) and value else None  # "" is no template, as in transformers


def _template_shaped(value: Any) -> bool:
    """What transformers takes as a chat template: none, a string, or named templates whose bodies are strings."""
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, list):
        return all(isinstance(t, dict) and isinstance(t.get("template"), str) for t in value)
    if isinstance(value, dict):
        return all(isinstance(t, str) for t in value.values())
    return False


def _sha(raw: bytes | None) -> str | None:
    return hashlib.sha256(raw).hexdigest() if raw is not None else None


def _finding(code: str, severity: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity=severity, message=message, hint=hint)  # type: ignore[arg-type]


def _conversations(system: bool, reply_last: bool = True) -> list[dict[str, str]]:
    turns = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": REPLY}]
    if not reply_last:  # a template may refuse a conversation that does not end with the user
        turns.append({"role": "user", "content": "Thanks."})
    return ([{"role": "system", "content": "You are helpful."}] if system else []) + turns


def _render_reply(source: str, specials: dict[str, Any]) -> tuple[str | None, str | None]:
    """(what follows the assistant's reply, None) or (None, why the template does not render)."""
    try:
        template = compile_template(source)
    except jinja2.TemplateSyntaxError as exc:
        return None, f"is not valid Jinja (line {exc.lineno}: {exc.message})"
    except RecursionError:
        return None, "is not valid Jinja (nested past what the parser takes)"
    error = ""
    # A template may refuse a system turn (Gemma's raise_exception) or an assistant turn last.
    for system, reply_last in ((True, True), (False, True), (True, False), (False, False)):
        try:
            text = render(
                template, messages=_conversations(system, reply_last), add_generation_prompt=False, **specials
            )
            render(template, messages=_conversations(system)[:-1], add_generation_prompt=True, **specials)
        except RenderRefused as exc:
            return None, f"was stopped: {exc}"
        except (jinja2.TemplateError, TypeError, ValueError, LookupError, AttributeError, ArithmeticError,
                RecursionError) as exc:  # fmt: skip
            error = f"fails to render system/user/assistant turns: {type(exc).__name__}: {str(exc)[:200]}"
            continue
        if REPLY not in text:
            return None, "renders the turns without the assistant's reply"
        return text[text.rindex(REPLY) + len(REPLY) :], None
    return None, error


def _end_of_turn(after_reply: str, known: set[str]) -> str | None:
    """The token the template closes an assistant turn with: the longest known token it starts
    with, else the special-token-like marker there."""
    rest = after_reply.lstrip()
    matches = [t for t in known if t and rest.startswith(t)]
    if matches:
        return max(matches, key=len)
    marker = _MARKER.match(rest)
    return marker.group(0) if marker else None


def chat_contract(
    config: dict[str, Any], tokenizer_config: dict[str, Any] | None, small_files: dict[str, bytes]
) -> tuple[ChatContract, list[Finding]]:
    """The contract and its findings (a checkpoint with no tokenizer is TOKENIZER_MISSING's)."""
    tok = tokenizer_config or {}
    findings: list[Finding] = []  # a refused side file's own finding first
    special_map = _side("special_tokens_map.json", small_files, findings)
    specials = {k: token_text(tok.get(k)) or token_text(special_map.get(k)) for k in SPECIAL_KEYS}
    vocab = vocabulary(tokenizer_config, small_files)
    generation = _side("generation_config.json", small_files, findings)
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    config_ids = _ids(config.get("eos_token_id", (text_config or {}).get("eos_token_id")))
    from_generation = "eos_token_id" in generation and _ids(generation["eos_token_id"])
    stop_ids = _ids(generation["eos_token_id"]) if from_generation else config_ids
    stop_file = "generation_config.json" if from_generation else "config.json"
    eos = specials["eos_token"]
    eos_id = vocab.id_of(eos) if eos else None
    contract = ChatContract(
        tokenizer_eos=eos,
        tokenizer_eos_id=eos_id if eos_id != PRESENT else None,
        stop_ids=stop_ids,
        generation_config_sha256=_sha(small_files.get("generation_config.json")),
        tokenizer_sha256=_sha(small_files.get("tokenizer.json") or small_files.get("tokenizer.model")),
    )
    findings += _eos_findings(eos, eos_id, vocab, stop_ids, stop_file, config_ids if from_generation else [])
    findings += _past_embedding(vocab, (text_config or {}).get("vocab_size", config.get("vocab_size")))
    source = template_source(tok, small_files, findings)
    if source is not None:
        contract.template_sha256 = hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest()
        findings += _template_findings(source, specials, vocab, eos_id, stop_ids, contract)
    return contract, findings


def _eos_findings(
    eos: str | None, eos_id: int | None, vocab: Vocabulary, stop_ids: list[int], stop_file: str, config_ids: list[int]
) -> list[Finding]:
    """The EOS rules: CONFIG_IDS is config.json's eos_token_id when a generation config overrides it."""
    findings: list[Finding] = []
    if not eos and not stop_ids:
        findings.append(
            _finding(
                "CHAT_NO_EOS",
                "error",
                "no end-of-sequence token anywhere: tokenizer_config.json has no eos_token and neither "
                "generation_config.json nor config.json has an eos_token_id, so generation runs to max_tokens",
                "set the tokenizer's eos_token and generation_config.eos_token_id to the token that ends a reply, "
                "then save both with save_pretrained",
            )
        )
    if eos and eos_id is None and vocab.complete:
        findings.append(
            _finding(
                "CHAT_EOS_NOT_IN_VOCAB",
                "error",
                f"the tokenizer's eos_token {eos!r} is not in its vocabulary: no engine can stop on it",
                "set eos_token to a token the tokenizer has (added with tokenizer.add_special_tokens if new)",
            )
        )
    if eos_id is not None and eos_id != PRESENT and stop_ids and eos_id not in stop_ids:
        findings.append(
            _finding(
                "CHAT_EOS_MISMATCH",
                "error",
                f"{stop_file} stops on eos_token_id {stop_ids} but the tokenizer's eos_token {eos!r} is id {eos_id}: "
                "engines that stop on the generation config (transformers, LMI) run past the end of a reply",
                f"add {eos_id} to eos_token_id in {stop_file} (model.generation_config.eos_token_id = [...]), or set "
                "the tokenizer's eos_token to the token the model was trained to end with",
            )
        )
    if config_ids and not set(config_ids) <= set(stop_ids):
        findings.append(
            _finding(
                "CHAT_EOS_CONFIG_DRIFT",
                "warning",
                f"config.json's eos_token_id {config_ids} is not among generation_config.json's {stop_ids}: tools "
                "that read config.json stop elsewhere than the engines",
                "save config.json and generation_config.json from the same trained model",
            )
        )
    return findings


def _past_embedding(vocab: Vocabulary, rows: Any) -> list[Finding]:
    """A token the tokenizer can produce that the embedding has no row for: vLLM loads the model, then fails
    (IndexError) on the first request whose text holds that token."""
    highest = vocab.highest_id()
    if highest is None or not isinstance(rows, int) or isinstance(rows, bool) or highest[0] < rows:
        return []
    return [
        _finding(
            "TOKENIZER_PAST_EMBEDDING",
            "error",
            f"the tokenizer has token ids up to {highest[0]} ({highest[1][:40]!r}) but config.json's vocab_size is "
            f"{rows}: the first id past the embedding is {rows}, and the engine dies (IndexError) on the first "
            f"request that holds one of ids {rows}-{highest[0]}",
            "call model.resize_token_embeddings(len(tokenizer)) after adding tokens, then save the model and "
            "the tokenizer together with save_pretrained",
        )
    ]


def _template_findings(
    source: str,
    specials: dict[str, Any],
    vocab: Vocabulary,
    eos_id: int | None,
    stop_ids: list[int],
    contract: ChatContract,
) -> list[Finding]:
    try:  # in a child: a template's work is bounded whatever path it takes (bounded_child)
        after, problem = run_bounded(
            _render_reply, source, specials, seconds=RENDER_SECONDS, memory_bytes=RENDER_MEMORY_BYTES
        )
    except ChildRefused as exc:
        after, problem = None, f"was stopped: {exc}"
    if after is None:
        return [_finding("CHAT_TEMPLATE_INVALID", "error", f"the chat template {problem}", TEMPLATE_HINT)]
    known = vocab.added_tokens() | {v for v in specials.values() if v}
    end = _end_of_turn(after, known)
    contract.end_of_turn = end
    if end is None:
        return []
    end_id = vocab.id_of(end)
    if end_id is None and vocab.complete:
        return [
            _finding(
                "CHAT_END_OF_TURN_MISSING",
                "error",
                f"the chat template ends an assistant turn with {end!r}, which is not in the tokenizer's vocabulary: "
                "the model cannot emit it, so it never ends a turn",
                f"add {end!r} as a special token (tokenizer.add_special_tokens, then resize the embeddings and "
                "train), or use the template the model was trained with",
            )
        ]
    stops = set(stop_ids) | ({eos_id} if eos_id is not None else set())
    if stops and end_id is not None and end_id != PRESENT and end_id not in stops:
        return [
            _finding(
                "CHAT_END_OF_TURN_NOT_STOP",
                "warning",
                f"the chat template ends an assistant turn with {end!r} (id {end_id}), which is neither the "
                f"tokenizer's eos nor in eos_token_id {sorted(stops)}: replies run on past the turn until the "
                "model writes its EOS",
                f"add {end_id} to eos_token_id in generation_config.json",
            )
        ]
    return []


def drift(serving: ChatContract, candidate: ChatContract) -> list[str]:
    """What changed in the chat contract between the serving version and a candidate."""
    labels = {
        "template_sha256": "chat template",
        "tokenizer_eos": "tokenizer eos_token",
        "tokenizer_eos_id": "tokenizer eos id",
        "stop_ids": "eos_token_id (stop ids)",
        "end_of_turn": "end-of-turn token",
        "generation_config_sha256": "generation_config.json",
        "tokenizer_sha256": "tokenizer",
    }
    changes = []
    for key, label in labels.items():
        old, new = getattr(serving, key), getattr(candidate, key)
        if old != new:
            shown = (old, new) if "sha256" not in key else (str(old)[:12], str(new)[:12])
            changes.append(f"{label}: {shown[0]} -> {shown[1]}")
    return changes


def drift_finding(serving: ChatContract | None, candidate: ChatContract | None) -> Finding | None:
    """A warning naming what changed in the chat contract since the serving version, or None."""
    if serving is None or candidate is None:
        return None
    changes = drift(serving, candidate)
    if not changes:
        return None
    return _finding(
        "CHAT_CONTRACT_DRIFT",
        "warning",
        "the chat contract changed since the serving version: " + "; ".join(changes),
        "expected if the fine-tune changed its template or tokenizer; otherwise save the tokenizer and "
        "generation config the serving version was trained with",
    )
