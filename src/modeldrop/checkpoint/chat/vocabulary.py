"""Token lookups in a checkpoint's tokenizer files, without building the tokenizer.

A real tokenizer.json holds 100k-260k vocabulary entries and as many merges (Gemma's is 33 MB):
parsed whole it is a million Python objects, so the few tokens the chat contract needs are found
in its bytes instead (a vocabulary entry is `"TOKEN": ID`, an added token `"id": ID, "content":
"TOKEN"`, a Unigram entry `["TOKEN", SCORE]`). A sentencepiece `tokenizer.model` is a protobuf whose
repeated field 1 holds the pieces in id order; it is walked field by field.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# A token is in the vocabulary but its id could not be read (a Unigram list entry).
PRESENT = -1
MAX_TOKEN_CHARS = 256


def token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _spellings(token: str) -> list[bytes]:
    ascii_form = json.dumps(token).encode()
    utf8_form = json.dumps(token, ensure_ascii=False).encode()
    return [ascii_form] if ascii_form == utf8_form else [ascii_form, utf8_form]


_MODEL_VOCAB = re.compile(rb'"model"\s*:\s*\{')
_VOCAB_START = re.compile(rb'"vocab"\s*:\s*([\[{])')
_ENTRY = re.compile(rb'("(?:[^"\\]|\\.){0,1024}")\s*:\s*(\d{1,9})\s*(?=[,}])')
_UNIGRAM_ENTRY = re.compile(rb'\[\s*"(?:[^"\\]|\\.){0,1024}"\s*,\s*-?[\d.eE+-]+\s*\]')


def _model_vocab_highest(raw: bytes) -> list[tuple[int, str]]:
    """The highest id of tokenizer.json's own model vocabulary (not only its added tokens): a WordLevel,
    WordPiece or BPE `{"TOKEN": ID}` map, or a Unigram list whose ids are its positions. Read from the
    bytes up to where the vocabulary closes (merges hold no ids)."""
    model = _MODEL_VOCAB.search(raw)
    start = _VOCAB_START.search(raw, model.end()) if model else None
    if start is None:
        return []
    if start.group(1) == b"[":
        count = sum(1 for _ in _UNIGRAM_ENTRY.finditer(raw, start.end()))
        return [(count - 1, "the last Unigram piece")] if count else []
    best: tuple[int, str] | None = None
    position = start.end()
    while True:  # entries until the map's closing brace (a brace inside a token is inside its quotes)
        entry = _ENTRY.match(raw, _skip_separators(raw, position))
        if entry is None:
            break
        if best is None or int(entry.group(2)) > best[0]:
            try:
                best = (int(entry.group(2)), str(json.loads(entry.group(1))))
            except ValueError:
                best = (int(entry.group(2)), "?")
        position = entry.end()
    return [best] if best else []


def _skip_separators(raw: bytes, position: int) -> int:
    while position < len(raw) and raw[position : position + 1] in (b" ", b"\n", b"\r", b"\t", b","):
        position += 1
    return position


@dataclass
class Vocabulary:
    """What the tokenizer files say of a token: its id, PRESENT, or None (absent, when `complete`)."""

    added: dict[str, int] = field(default_factory=dict)  # tokenizer_config's added_tokens_decoder
    tokenizer_json: bytes | None = None
    pieces: dict[str, int] | None = None  # tokenizer.model's, in id order

    @property
    def complete(self) -> bool:
        """A whole vocabulary was read, so a token not found is not there."""
        return self.tokenizer_json is not None or self.pieces is not None

    def id_of(self, token: str) -> int | None:
        if len(token) > MAX_TOKEN_CHARS:  # no vocabulary holds one: not searched for in 64 MiB
            return None
        if self.tokenizer_json is not None:  # transformers' fast tokenizer takes ids from tokenizer.json first
            found = self._in_json(token)
            if found is not None:
                return found
        if token in self.added:
            return self.added[token]
        if self.pieces is not None and token in self.pieces:
            return self.pieces[token]
        return None

    def added_tokens(self) -> set[str]:
        """Every added (special) token the files name."""
        names = set(self.added)
        if self.tokenizer_json is not None:
            for match in _ADDED.finditer(self.tokenizer_json):
                try:
                    names.add(json.loads(match.group(2)))
                except ValueError:
                    continue
        return names

    def highest_id(self) -> tuple[int, str] | None:
        """The highest token id the files name, and which token: the added tokens' (tokenizer_config's
        decoder, tokenizer.json's added_tokens) and sentencepiece's last piece. Added tokens are where a
        tokenizer outgrows its model (special tokens added without resize_token_embeddings)."""
        found = [(i, text) for text, i in self.added.items()]
        if self.tokenizer_json is not None:
            for match in _ADDED.finditer(self.tokenizer_json):
                try:
                    found.append((int(match.group(1)), str(json.loads(match.group(2)))))
                except ValueError:
                    continue
            found += _model_vocab_highest(self.tokenizer_json)
        if self.pieces:
            found.append((len(self.pieces) - 1, "the last sentencepiece piece"))
        return max(found) if found else None

    def _in_json(self, token: str) -> int | None:
        raw = self.tokenizer_json or b""
        for spelled in _spellings(token):
            quoted = re.escape(spelled)
            added = re.search(rb'"id"\s*:\s*(\d{1,9})\s*,\s*"content"\s*:\s*' + quoted, raw)
            if added:
                return int(added.group(1))
            entry = re.search(quoted + rb"\s*:\s*(\d{1,9})\s*[,}]", raw)
            if entry:
                return int(entry.group(1))
            if re.search(rb"\[\s*" + quoted + rb"\s*,\s*-?[\d.eE+-]+\s*\]", raw):
                return PRESENT
        return None


_ADDED = re.compile(rb'"id"\s*:\s*(\d{1,9})\s*,\s*"content"\s*:\s*("(?:[^"\\]|\\.){1,200}")')


def vocabulary(tokenizer_config: dict[str, Any] | None, small_files: dict[str, bytes]) -> Vocabulary:
    vocab = Vocabulary()
    decoder = (tokenizer_config or {}).get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for key, value in decoder.items():
            text = token_text(value)
            if text is not None and key.isdigit():
                vocab.added[text] = int(key)
    vocab.tokenizer_json = small_files.get("tokenizer.json")
    model = small_files.get("tokenizer.model")
    if model is not None and vocab.tokenizer_json is None:
        vocab.pieces = sentencepiece_pieces(model)
    return vocab


def _varint(raw: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(raw) and shift < 64:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise ValueError("truncated varint")


def _fields(raw: bytes) -> list[tuple[int, bytes | int]]:
    """The top-level (field number, value) pairs of a protobuf message."""
    out: list[tuple[int, bytes | int]] = []
    at = 0
    while at < len(raw):
        key, at = _varint(raw, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(raw, at)
            out.append((number, value))
        elif wire == 2:
            length, at = _varint(raw, at)
            if at + length > len(raw):
                raise ValueError("a field runs past the end")
            out.append((number, raw[at : at + length]))
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return out


def sentencepiece_pieces(raw: bytes) -> dict[str, int] | None:
    """A sentencepiece ModelProto's pieces by id (field 1, each a SentencePiece whose field 1 is the
    text), or None when the bytes are not one."""
    try:
        pieces: dict[str, int] = {}
        entries = [value for number, value in _fields(raw) if number == 1 and isinstance(value, bytes)]
        for piece_id, entry in enumerate(entries):
            text = next((v for n, v in _fields(entry) if n == 1 and isinstance(v, bytes)), b"")
            pieces.setdefault(text.decode("utf-8", "surrogateescape"), piece_id)
        return pieces or None
    except ValueError:
        return None
