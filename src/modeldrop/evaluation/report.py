"""The eval report as Markdown, and as metrics for any Powertools-like `add_metric` sink."""

from __future__ import annotations

from typing import Any, Protocol

from modeldrop.evaluation.smoke_eval import EvalReport, Percentiles


class MetricSink(Protocol):
    def add_metric(self, name: str, unit: Any, value: float) -> None: ...


def _fmt(value: float | int | None, unit: str = "") -> str:
    if value is None:
        return "-"
    return f"{value:g}{unit}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(report: EvalReport, title: str | None = None) -> str:
    lines = [
        f"# {title or 'Smoke eval'}: {'PASSED' if report.passed else 'FAILED'}",
        "",
        f"- Endpoint invoked: `{report.endpoint_name}` (configured max_model_len: {_fmt(report.max_model_len)})",
        f"- Calls: {'streaming' if report.streaming else 'non-streaming'}, schema `{report.schema_name}`",
        f"- Summary: {report.summary}",
        f"- Thresholds: truncated <= {report.thresholds.max_truncated}, errors <= {report.thresholds.max_errors}, "
        f"check failures <= {report.thresholds.max_check_failures}",
        "",
        "| metric | p50 | p90 |",
        "|---|---|---|",
    ]
    for name, pct in (
        ("TTFT (s)", report.ttft_s),
        ("latency (s)", report.latency_s),
        ("tokens/s", report.tokens_per_s),
    ):
        lines.append(f"| {name} | {_fmt(pct.p50)} | {_fmt(pct.p90)} |")
    lines += [
        "",
        "| case | outcome | finish | tokens | max_tokens | TTFT s | latency s | tok/s | detail |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in report.cases:
        lines.append(
            f"| {_cell(c.id)} | {c.outcome} | {c.finish_reason or '-'} | {_fmt(c.completion_tokens)} | "
            f"{_fmt(c.max_tokens)} ({c.max_tokens_source}) | {_fmt(c.ttft_s)} | {_fmt(c.latency_s)} | "
            f"{_fmt(c.tokens_per_s)} | {_cell(c.detail)} |"
        )
    if report.fixes:
        lines += ["", "## What to change", ""] + [f"- {fix}" for fix in report.fixes]
    return "\n".join(lines) + "\n"


def emit_metrics(sink: MetricSink, report: EvalReport) -> None:
    for outcome, count in report.counts.items():
        sink.add_metric(name=f"EvalCases_{outcome}", unit="Count", value=count)
    series: dict[str, tuple[Percentiles, str]] = {
        "EvalTTFT": (report.ttft_s, "Seconds"),
        "EvalLatency": (report.latency_s, "Seconds"),
        "EvalTokensPerSecond": (report.tokens_per_s, "Count/Second"),
    }
    for name, (pct, unit) in series.items():
        if pct.p50 is not None:
            sink.add_metric(name=f"{name}P50", unit=unit, value=pct.p50)
        if pct.p90 is not None:
            sink.add_metric(name=f"{name}P90", unit=unit, value=pct.p90)
