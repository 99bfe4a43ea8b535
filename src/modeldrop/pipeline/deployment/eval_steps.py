"""SmokeEval: the eval set through the deployed endpoint -- through the adapter when there is one
(its name in the request, or its own inference component in shared mode), with a check that the
adapter's answers are not the base's -- its reports beside the artifact, and the verdict recorded."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts.errors import EvalFailed
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import AdapterComponent, EndpointRef, EnginePlan, EvalVerdict
from modeldrop.evaluation.eval_sets import load_eval_set
from modeldrop.evaluation.report import MetricSink, emit_metrics, to_markdown
from modeldrop.evaluation.runner import EvalTarget, RetryPolicy, adapter_ignored, run_eval
from modeldrop.evaluation.smoke_eval import EvalReport, error_count
from modeldrop.pipeline.reports import put_json, report_prefix
from modeldrop.serving.plan import max_tokens_ceiling

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient


def smoke_eval(
    runtime: SageMakerRuntimeClient,
    s3: S3Client,
    registry: Registry,
    req: NormalizedRequest,
    ref: EndpointRef,
    plan: EnginePlan,
    metrics: MetricSink | None = None,
    retry: RetryPolicy | None = None,
) -> EvalVerdict:
    cases = load_eval_set(req.eval_set_uri, s3)
    ceiling = plan.eval_max_tokens_ceiling or max_tokens_ceiling(req.engine)

    def run(target: EvalTarget) -> EvalReport:
        return run_eval(runtime, target, cases, req.eval_thresholds, ceiling, retry)

    name, limit = ref.endpoint_name, plan.max_model_len
    if ref.components is not None:
        # Shared: every adapter through its own component; the base's answers once, through the base's.
        base = run(EvalTarget(name, limit, schema="chat", stream=False, component=ref.components.base))
        parts: list[tuple[AdapterComponent | None, EvalReport]] = [
            (a, _not_ignored(run(EvalTarget(name, limit, component=a.component)), base, a.adapter))
            for a in ref.components.adapters
        ]
    else:
        # An adapter deployment is evaluated through the adapter (every request names it).
        adapter = req.adapter_name
        field = "adapters" if req.engine == "lmi" else "model"
        report = run(EvalTarget(name, limit, model=adapter, adapter_field=field))
        if adapter and report.passed:
            report = _not_ignored(report, run(EvalTarget(name, limit, stream=False)), adapter)
        parts = [(None, report)]
    verdicts = [_publish(s3, req, component, report, metrics) for component, report in parts]
    verdict = verdicts[0] if len(verdicts) == 1 and ref.components is None else _combined(verdicts)
    registry.record(
        req.deployment_id,
        "smoke_eval",
        verdict.model_dump(mode="json"),
        owner=req.execution_arn,
        live=True,
        eval_report_uri=verdict.report_uri,
    )
    if not verdict.passed:
        failed = [v for v in verdicts if not v.passed]
        raise EvalFailed(
            f"smoke eval failed on {name}: {verdict.summary}; report: {failed[0].report_markdown_uri}",
            "; ".join(failed[0].fixes) or EvalFailed.default_hint,
        )
    return verdict


def _not_ignored(report: EvalReport, base: EvalReport, adapter: str) -> EvalReport:
    """An adapter the engine silently ignores answers exactly as the base does: that fails the eval."""
    if not report.passed or not adapter_ignored(report, base):
        return report
    return report.model_copy(
        update={
            "passed": False,
            "summary": f"{report.summary}; the adapter {adapter!r} answered exactly as the base on every case: it is "
            "not applied",
            "fixes": [*report.fixes, "check the engine's LoRA settings and the adapter's target modules"],
        }
    )


def _publish(
    s3: S3Client,
    req: NormalizedRequest,
    through: AdapterComponent | None,
    report: EvalReport,
    metrics: MetricSink | None,
) -> EvalVerdict:
    bucket, prefix = report_prefix(req.artifact_uri, req.deployment_id)
    component = through.component if through else None
    stem = f"eval-{through.adapter}" if through else "eval"
    report_uri = put_json(s3, bucket, f"{prefix}{stem}.json", report)
    markdown_key = f"{prefix}{stem}.md"
    title = f"Smoke eval of {req.deployment_id}" + (f" through {component}" if component else "")
    s3.put_object(
        Bucket=bucket, Key=markdown_key, Body=to_markdown(report, title).encode(), ContentType="text/markdown"
    )
    if metrics is not None:
        emit_metrics(metrics, report)
    counts = report.counts
    return EvalVerdict(
        passed=report.passed,
        cases=len(report.cases),
        truncated=counts["truncated"],
        errors=error_count(counts),
        check_failures=counts["check_failed"],
        summary=f"{through.adapter} (component {component}): {report.summary}" if through else report.summary,
        report_uri=report_uri,
        report_markdown_uri=f"s3://{bucket}/{markdown_key}",
        ttft_p50_s=report.ttft_s.p50,
        tokens_per_s_p50=report.tokens_per_s.p50,
        component=component,
        fixes=report.fixes,
    )


def _combined(verdicts: list[EvalVerdict]) -> EvalVerdict:
    """One verdict for the deployment: it passes when every component's eval passed."""
    return EvalVerdict(
        passed=all(v.passed for v in verdicts),
        cases=sum(v.cases for v in verdicts),
        truncated=sum(v.truncated for v in verdicts),
        errors=sum(v.errors for v in verdicts),
        check_failures=sum(v.check_failures for v in verdicts),
        summary="; ".join(v.summary for v in verdicts),
        report_uri=verdicts[0].report_uri,
        report_markdown_uri=verdicts[0].report_markdown_uri,
        components=verdicts,
    )
