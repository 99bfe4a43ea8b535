"""One marker grammar: schemas/modeldrop-marker.schema.json (generated from the request model) and the
starter (parse_marker, then the request model in strict mode) give the same verdict on every marker --
the schema judged by the reference validator (jsonschema, draft 2020-12) over RFC 8259 JSON -- and the
starter refuses with RequestInvalid, never an exception. The same for direct starts against
schemas/deployment-request.schema.json."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import parse_request
from modeldrop.pipeline.deployment.starter import parse_marker, request_for

ROOT = Path(__file__).resolve().parents[2]
MARKER = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "modeldrop-marker.schema.json").read_text()))
REQUEST = jsonschema.Draft202012Validator(json.loads((ROOT / "schemas" / "deployment-request.schema.json").read_text()))
URI = "s3://bucket-1/runs/x/modeldrop.json"

# Values of every JSON kind, and the edges the request's fields draw (bounds, patterns, enums).
VALUES: list[Any] = [
    None, True, False, 0, 1, -1, 2, 2.0, 2.5, 3, 100, 1001, 1e300, "", "2", "true", "é", "auto", "vllm", "lmi",
    "main", "Main_1", "main\n", "ml.g6.2xlarge", "ml.g6.2xlarge\n", "ml.m5.xlarge", "s3://ab/x", "s3://bucket/e.jsonl",
    "s3://bucket/a/../e.jsonl", "s3://bucket/p/", "s3://bucket/m.tar.gz", [], ["ml.g6.2xlarge"],
    ["ml.g6.2xlarge", "ml.g6.2xlarge"], ["ml.g6.2xlarge", "ml.g6e.2xlarge"], {}, {"SM_VLLM_X": "1"}, {"": "1"},
    {"é": "1"}, {"HF_TOKEN": "x"}, {"A": 1}, {"A": "a\nb"}, {"max_truncated": 1}, {"max_length_ratio": 2},
    {"max_length_ratio": 4}, {"max_ttft_ratio": 50}, {"min_tokens_per_s_ratio": 0.1}, {"latency_slack_s": 30},
    {"max_regressed_cases": 1}, {"gpu_memory_utilization": 0.9}, {"dtype": 5}, {"image": 2}, {"x": 1},
]  # fmt: skip


def _fields() -> list[str]:
    return sorted(json.loads((ROOT / "schemas" / "deployment-request.schema.json").read_text())["properties"])


def _schema_says(validator: jsonschema.Draft202012Validator, raw: bytes) -> bool:
    """The reference's verdict: RFC 8259 JSON (UTF-8, no BOM, no NaN), then the schema."""
    if raw.startswith(b"\xef\xbb\xbf"):
        return False
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return False
    return validator.is_valid(data)


def _starter_says(raw: bytes) -> bool:
    try:
        marker = parse_marker(raw, URI)
        request_for("bucket-1", "runs/x/modeldrop.json", marker)
    except RequestInvalid:
        return False
    return True


def _markers() -> list[bytes]:
    one = [json.dumps({field: value}).encode() for field, value in itertools.product(_fields(), VALUES)]
    nested = [json.dumps({"channel": "main", field: {key: value}}).encode()
              for field, key in (("gate", "max_length_ratio"), ("gate", "latency_slack_s"),
                                 ("eval_thresholds", "max_errors"), ("engine_settings", "dtype"))
              for value in VALUES]  # fmt: skip
    encodings = [
        b"",
        b"   ",
        b"{}",
        b"\xef\xbb\xbf{}",
        '{"engine": "vllm"}'.encode("utf-16"),
        b"[]",
        b"null",
        b"{",
        b'{"ttl_hours": NaN}',
        b'{"ttl_hours": Infinity}',
        b'{"max_num_seqs": ' + b"9" * 5000 + b"}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"gate": ' + b"{" * 5000 + b"}" * 5001,
        b'{"engine": "\xff"}',
        b'{"engine": "vllm", "engine": "sglang"}',
        b'{"ttl_hours": 2, "max_num_seqs": 32.0}',
    ]
    return one + nested + encodings


@pytest.mark.parametrize("chunk", range(4))
def test_the_starter_and_the_marker_schema_give_the_same_verdict(chunk: int) -> None:
    markers = _markers()[chunk::4]
    differ = []
    for raw in markers:
        schema, starter = _schema_says(MARKER, raw), _starter_says(raw)
        if schema != starter:
            differ.append(f"{raw[:120]!r}: schema {'accepts' if schema else 'refuses'}, starter the opposite")
    assert differ == [], f"{len(differ)} of {len(markers)}:\n" + "\n".join(differ[:40])


def test_a_direct_start_is_read_as_its_schema_says() -> None:
    differ = []
    for field, value in itertools.product(_fields(), VALUES):
        data = {"artifact_uri": "s3://bucket-1/runs/x/", field: value}
        schema = REQUEST.is_valid(data)
        try:
            parse_request(data)
            model = True
        except ValueError:  # pydantic's ValidationError
            model = False
        if schema != model:
            differ.append(f"{field}={value!r}: schema {'accepts' if schema else 'refuses'}, model the opposite")
    assert differ == [], f"{len(differ)}:\n" + "\n".join(differ[:40])


def test_a_direct_start_nested_past_any_field_is_refused_not_a_recursion_error() -> None:
    """A direct start's input may be 256 KB of nesting: refused as the model refuses it, never a traceback."""
    deep: Any = 1.0
    for _ in range(20_000):
        deep = [deep]
    with pytest.raises(ValueError, match="engine_env"):
        parse_request({"artifact_uri": "s3://bucket-1/runs/x/", "engine_env": {"A": deep}})
