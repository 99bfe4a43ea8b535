"""Eval verdicts and the S3 starter's key rules, as pure functions."""

from __future__ import annotations

import json

import pytest
from conftest import CHAT_CUT, CHAT_OK

from modeldrop.errors import RequestInvalid
from modeldrop.models import EvalThresholds, deployment_id_for, resource_name_for
from modeldrop.smoke_eval import EvalCase, judge, parse_eval_set, verdict
from modeldrop.starter import classify_key, execution_name, parse_marker

CASE = EvalCase.model_validate(
    {"id": "c", "messages": [{"role": "user", "content": "hi"}], "checks": {"contains": ["Hello"]}}
)


def test_truncation_is_its_own_verdict() -> None:
    cut = judge(CASE, 64, json.dumps(CHAT_CUT).encode(), 0.1)
    assert cut.outcome == "truncated" and cut.recommended_max_tokens == 128
    assert judge(CASE, 64, json.dumps(CHAT_OK).encode(), 0.1).outcome == "pass"
    wrong = {**CHAT_OK, "choices": [{"message": {"content": "Bye"}, "finish_reason": "stop"}]}
    assert judge(CASE, 64, json.dumps(wrong).encode(), 0.1).outcome == "check_failed"
    assert judge(CASE, 64, b"body", 0.1).outcome == "error"
    for odd in (b"5", b"[1]", b'{"error": "boom"}', b'{"choices": []}'):
        assert judge(CASE, 64, odd, 0.1).outcome == "error"


def test_thresholds_decide_the_deployment() -> None:
    results = [
        judge(CASE, 64, json.dumps(CHAT_CUT).encode(), 0.1),
        judge(CASE, 64, json.dumps(CHAT_OK).encode(), 0.1),
    ]
    assert not verdict("ep", results, EvalThresholds()).passed
    report = verdict("ep", results, EvalThresholds(max_truncated=1))
    assert report.passed and "truncated: c" in report.summary


def test_eval_set_errors_name_the_line() -> None:
    with pytest.raises(RequestInvalid, match="line 2"):
        parse_eval_set('{"id": "a", "messages": []}\n{"id": 3}\n', "s3://b/e.jsonl")


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("a/model.tar.gz", "archive"),
        ("model.tar.gz", "archive"),
        ("a/modeldrop.json", "marker"),
        ("a/model.tar.gz.tmp", None),
        ("a/config.json", None),
        ("a/my-modeldrop.json", None),
    ],
)
def test_key_classification(key: str, kind: str | None) -> None:
    assert classify_key(key) == kind


def test_execution_name_is_deterministic_per_version() -> None:
    assert execution_name("b", "k", "v1") == execution_name("b", "k", "v1")
    assert execution_name("b", "k", "v1") != execution_name("b", "k", "v2")
    assert len(execution_name("b", "k" * 500, None)) <= 80


def test_marker_overrides_are_checked() -> None:
    assert parse_marker(b"", "u") == {}
    assert parse_marker(b'{"engine": "lmi"}', "u") == {"engine": "lmi"}
    with pytest.raises(RequestInvalid, match="unknown override"):
        parse_marker(b'{"role_arn": "x"}', "u")
    with pytest.raises(RequestInvalid, match="not valid JSON"):
        parse_marker(b"{", "u")


def test_ids_fit_sagemaker_names() -> None:
    long = deployment_id_for("Pipeline Run #42 for Gemma-4 E4B with a very long description")
    assert len(resource_name_for("modeldrop", long)) <= 63
    assert deployment_id_for("run-7") == "run-7"
