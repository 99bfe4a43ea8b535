"""Eval verdicts, checks, token budgets and context-length errors, as pure functions."""

from __future__ import annotations

import json

import pytest

from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import EvalThresholds
from modeldrop.evaluation.chat_protocol import Completion, ProtocolError, StreamAssembler, build_body, parse_completion
from modeldrop.evaluation.context_budget import budget_for, parse_context_overflow
from modeldrop.evaluation.eval_sets import default_eval_set, parse_eval_set
from modeldrop.evaluation.report import emit_metrics, to_markdown
from modeldrop.evaluation.smoke_eval import EvalCase, Timing, judge, percentiles, verdict

CASE = EvalCase.model_validate(
    {"id": "c", "messages": [{"role": "user", "content": "hi"}], "checks": {"contains": ["Hello"]}}
)
FAST = Timing(latency_s=0.5, ttft_s=0.1)


def test_truncation_by_max_tokens_recommends_a_higher_one() -> None:
    cut = judge(CASE, 64, "case", Completion("Hello th", "length", 12, 64), FAST)
    assert cut.outcome == "truncated" and cut.recommended_max_tokens == 128
    assert "raise max_tokens to 128" in cut.detail
    assert cut.tokens_per_s == 160.0  # 64 tokens after the first, in 0.4 s


def test_truncation_below_max_tokens_blames_a_server_side_cap() -> None:
    cut = judge(CASE, 512, "case", Completion("Hello", "length", 12, 8), FAST)
    assert cut.outcome == "truncated" and cut.recommended_max_tokens is None
    assert "raising max_tokens will not help" in cut.detail
    report = verdict("ep", [cut], EvalThresholds())
    assert any("server-side cap" in fix for fix in report.fixes)


def test_checks_pass_and_fail() -> None:
    assert judge(CASE, 64, "case", Completion("Hello there.", "stop", 3, 4), FAST).outcome == "pass"
    wrong = judge(CASE, 64, "case", Completion("Bye", "stop", 3, 1), FAST)
    assert wrong.outcome == "check_failed" and "does not contain 'Hello'" in wrong.detail
    json_case = EvalCase.model_validate(
        {
            "id": "j",
            "messages": [{"role": "user", "content": "x"}],
            "reference": '{"store": "Cafe Blue", "total": 12.5}',
            "checks": {"json_equals_reference": True},
        }
    )
    same = Completion('{"total": 12.5, "store": "Cafe Blue"}', "stop")
    assert judge(json_case, 64, "case", same, FAST).outcome == "pass"
    assert "differs" in judge(json_case, 64, "case", Completion('{"total": 1}', "stop"), FAST).detail
    assert "not valid JSON" in judge(json_case, 64, "case", Completion("total: 1", "stop"), FAST).detail
    similar = EvalCase.model_validate(
        {
            "id": "s",
            "messages": [{"role": "user", "content": "x"}],
            "reference": "a b c d",
            "checks": {"min_similarity": 0.8},
        }
    )
    assert judge(similar, 64, "case", Completion("a b c d", "stop"), FAST).outcome == "pass"
    assert "similarity" in judge(similar, 64, "case", Completion("zzzz", "stop"), FAST).detail


def test_thresholds_decide_the_deployment_and_name_cases_and_fixes() -> None:
    results = [
        judge(CASE, 64, "case", Completion("Hello th", "length", 12, 64), FAST),
        judge(CASE, 64, "case", Completion("Hello", "stop", 12, 2), FAST),
    ]
    failed = verdict("ep", results, EvalThresholds())
    assert not failed.passed and "truncated: c" in failed.summary
    assert failed.fixes == ["raise max_tokens for the truncated cases (c: 128) in the eval set"]
    assert verdict("ep", results, EvalThresholds(max_truncated=1)).passed


def test_percentiles_are_nearest_rank() -> None:
    assert percentiles([]).p50 is None
    p = percentiles([0.1, 0.2, 0.3, 0.4, 1.0])
    assert (p.p50, p.p90) == (0.3, 1.0)


def test_eval_set_errors_name_the_line() -> None:
    with pytest.raises(RequestInvalid, match="line 2"):
        parse_eval_set('{"id": "a", "messages": [{"role": "user", "content": "x"}]}\n{"id": 3}\n', "s3://b/e.jsonl")
    with pytest.raises(RequestInvalid, match="line 1"):
        parse_eval_set('{"id": "a", "messages": []}\n', "e.jsonl")
    with pytest.raises(RequestInvalid, match="used twice"):
        one = '{"id": "a", "messages": [{"role": "user", "content": "x"}]}'
        parse_eval_set(f"{one}\n{one}\n", "e.jsonl")
    with pytest.raises(RequestInvalid, match="reference it lacks"):
        parse_eval_set(
            '{"id": "a", "messages": [{"role": "user", "content": "x"}], "checks": {"min_similarity": 1}}', "e"
        )
    with pytest.raises(RequestInvalid, match="regex does not compile"):
        parse_eval_set('{"id": "a", "messages": [{"role": "user", "content": "x"}], "checks": {"regex": "("}}', "e")
    assert len(default_eval_set()) == 3


def test_budget_from_case_reference_default_and_context() -> None:
    msgs = [{"role": "user", "content": "x" * 400}]  # ~100 prompt tokens + template
    assert budget_for(msgs, 64, None, 1200, 4096).max_tokens == 64
    ref = budget_for(msgs, None, "y" * 300, 1200, 4096)  # ~100 answer tokens -> x1.5 + 32
    assert (ref.max_tokens, ref.source) == (182, "reference")
    assert budget_for(msgs, None, "y" * 6000, 1200, 4096).max_tokens == 1200  # the 60 s ceiling
    assert (
        budget_for(msgs, None, "y" * 30000, 1200, 4096).refused
        == "prompt ~104 tokens + 10000 needed > max_model_len 4096"
    )
    assert budget_for(msgs, None, None, 1200, 4096).max_tokens == 512
    tight = budget_for(msgs, None, None, 1200, 204)
    assert tight.max_tokens == 100  # what the context leaves
    refused = budget_for(msgs, 200, None, 1200, 204)
    assert refused.max_tokens is None and refused.refused == "prompt ~104 tokens + 200 requested > max_model_len 204"


@pytest.mark.parametrize(
    ("message", "numbers"),
    [
        (
            "This model's maximum context length is 2048 tokens. However, you requested 512 output tokens and your "
            "prompt contains at least 1537 input tokens, for a total of at least 2049 tokens.",
            (2048, 1537, 512),
        ),
        (
            "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the "
            "messages, 1000 in the completion). Please reduce the length of the messages or completion.",
            (4096, 4000, 1000),
        ),
        (
            "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is "
            "4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500).",
            (4096, 3500, 1000),
        ),
        (
            "This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens. Please "
            "reduce the length of the input messages.",
            (2048, 3000, None),
        ),
        (
            "Requested token count exceeds the model's maximum context length of 4,096 tokens. You requested a total "
            "of 5,000 tokens: 4,000 tokens from the input messages and 1,000 tokens for the completion.",
            (4096, 4000, 1000),
        ),
        ("The input (5000 tokens) is longer than the model's context length (4096 tokens).", (4096, 5000, None)),
    ],
)
def test_context_length_errors_become_numbers(message: str, numbers: tuple[int, int, int | None]) -> None:
    parsed = parse_context_overflow(json.dumps({"message": message}))
    assert parsed is not None
    assert (parsed.limit, parsed.prompt_tokens, parsed.requested_tokens) == numbers


def test_context_overflow_names_the_wrong_endpoint() -> None:
    parsed = parse_context_overflow(
        "This model's maximum context length is 2048 tokens. However, you requested 512 output tokens and your "
        "prompt contains at least 1537 input tokens, for a total of at least 2049 tokens."
    )
    assert parsed is not None
    text = parsed.describe("summary-ep", 4096)
    assert "configured with max_model_len 4096" in text and "different model server" in text
    assert "different" not in parsed.describe("mm-ep", 2048)
    assert parse_context_overflow("CUDA error: device-side assert triggered") is None


def test_protocol_parsing_both_schemas_and_stream_chunks() -> None:
    assert build_body("lmi", [{"role": "user", "content": "hi"}], 9, False)["parameters"]["max_new_tokens"] == 9
    assert build_body("chat", [{"role": "user", "content": "hi"}], 9, True)["stream_options"] == {"include_usage": True}
    lmi = parse_completion(
        "lmi", b'[{"generated_text": "x", "details": {"finish_reason": "length", "generated_tokens": 9}}]'
    )
    assert (lmi.finish_reason, lmi.completion_tokens) == ("length", 9)
    for odd in (b"body", b"5", b"[1]", b'{"error": "boom"}', b'{"choices": []}'):
        with pytest.raises(ProtocolError):
            parse_completion("chat", odd)
    assembler = StreamAssembler()
    assert assembler.add('{"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}') == ""
    assert assembler.add('{"choices": [{"delta": {"content": "Hi"}, "finish_reason": null}]}') == "Hi"
    assembler.add('{"choices": [{"delta": {}, "finish_reason": "stop"}]}')
    assembler.add('{"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 1}}')
    done = assembler.completion()
    assert (done.text, done.finish_reason, done.prompt_tokens, done.completion_tokens) == ("Hi", "stop", 5, 1)
    with pytest.raises(ProtocolError, match="error event"):
        StreamAssembler().add('{"error": {"message": "engine died"}}')


class _Sink:
    def __init__(self) -> None:
        self.metrics: dict[str, float] = {}

    def add_metric(self, name: str, unit: object, value: float) -> None:
        self.metrics[name] = value


def test_report_markdown_and_metrics() -> None:
    results = [
        judge(CASE, 64, "case", Completion("Hello | there", "stop", 12, 20), Timing(latency_s=0.3, ttft_s=0.1)),
        judge(CASE, 64, "reference", Completion("Hello th", "length", 12, 64), Timing(latency_s=0.9, ttft_s=0.2)),
    ]
    report = verdict("ep-1", results, EvalThresholds(), max_model_len=4096, streaming=True)
    text = to_markdown(report)
    assert text.startswith("# Smoke eval: FAILED")
    assert "`ep-1` (configured max_model_len: 4096)" in text and "Hello \\| there" not in text
    assert "| c | truncated | length | 64 | 64 (reference)" in text and "## What to change" in text
    sink = _Sink()
    emit_metrics(sink, report)
    assert sink.metrics["EvalCases_truncated"] == 1 and sink.metrics["EvalTTFTP50"] == 0.1
    assert sink.metrics["EvalTokensPerSecondP90"] == 100.0
