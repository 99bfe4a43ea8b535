"""Run the smoke eval against an endpoint through the sagemaker-runtime client the caller passes.

Both `invoke_endpoint` and `invoke_endpoint_with_response_stream`; errors are classified into the
case outcomes (context overflow with its numbers, timeout, error with the container's own status),
and throttling is retried here with backoff (the client should be built with retries off, so the
attempts are counted once).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from botocore.config import Config
from botocore.exceptions import ClientError, EventStreamError, ReadTimeoutError

from modeldrop.aws.sagemaker.sagemaker_resources import THROTTLE_CODES, endpoint_container_env
from modeldrop.contracts import clock
from modeldrop.contracts.errors import EvalOutOfTime, RequestInvalid
from modeldrop.contracts.models import EvalThresholds
from modeldrop.evaluation.chat_protocol import (
    Completion,
    ProtocolError,
    Schema,
    StreamAssembler,
    build_body,
    parse_completion,
)
from modeldrop.evaluation.context_budget import budget_for, parse_context_overflow
from modeldrop.evaluation.gate import GateReport, GateThresholds, compare
from modeldrop.evaluation.smoke_eval import CaseResult, EvalCase, EvalReport, Timing, judge, verdict
from modeldrop.evaluation.sse import SSEDecoder
from modeldrop.serving.engine_env import engine_of_env, max_model_len_of_env
from modeldrop.serving.plan import max_tokens_ceiling

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient


def runtime_client_config() -> Config:
    """Retries off (the eval retries throttling itself and counts attempts); read past the 60 s cap."""
    from modeldrop.aws.clients import RUNTIME

    return RUNTIME


@dataclass(frozen=True)
class EvalTarget:
    endpoint_name: str
    max_model_len: int | None
    schema: Schema = "chat"
    stream: bool = True
    model: str | None = None  # a LoRA adapter's name: every request names it (None: the base model)
    # Where the name goes: OpenAI's `model` (vLLM, SGLang), or LMI's own `adapters` list.
    adapter_field: str = "model"
    component: str | None = None  # an inference component's name: SageMaker routes the request to it

    @property
    def routing(self) -> dict[str, str]:
        """The invocation's target: the endpoint, and the inference component when there is one."""
        routed = {"EndpointName": self.endpoint_name}
        if self.component:
            routed["InferenceComponentName"] = self.component
        return routed

    @property
    def streams(self) -> bool:
        """Streaming is asked for and the schema has a stream (LMI's inputs schema is read whole)."""
        return self.stream and self.schema == "chat"


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 5
    base_seconds: float = 0.5
    cap_seconds: float = 8.0
    sleep: Callable[[float], None] = time.sleep

    def backoff(self, attempt: int) -> float:
        # Full jitter, as the AWS SDKs do.
        return random.uniform(0, self.ceiling(attempt))

    def ceiling(self, attempt: int) -> float:
        return min(self.cap_seconds, self.base_seconds * 2**attempt)

    def longest_wait(self) -> float:
        """The most this policy sleeps over one call's attempts (a retry follows attempts 1 .. n-1)."""
        return sum(self.ceiling(attempt) for attempt in range(1, self.attempts))


class _CallFailed(Exception):
    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def _invoke_plain(
    runtime: SageMakerRuntimeClient, target: EvalTarget, body: dict[str, Any]
) -> tuple[Completion, float | None]:
    response = runtime.invoke_endpoint(
        **target.routing,
        ContentType="application/json",
        Accept="application/json",
        Body=json.dumps(body).encode(),
    )
    return parse_completion(target.schema, response["Body"].read()), None


def _invoke_stream(
    runtime: SageMakerRuntimeClient, target: EvalTarget, body: dict[str, Any], started: float
) -> tuple[Completion, float | None]:
    response = runtime.invoke_endpoint_with_response_stream(
        **target.routing,
        ContentType="application/json",
        Accept="text/event-stream",
        Body=json.dumps(body).encode(),
    )
    decoder = SSEDecoder()
    assembler = StreamAssembler()
    ttft: float | None = None
    done = False
    for event in response["Body"]:
        if "PayloadPart" not in event:
            # Stream errors arrive as modeled events when botocore does not raise them.
            kind, info = next(iter(cast(dict[str, dict[str, Any]], event).items()))
            raise _CallFailed("error", f"{kind}: {info.get('Message')} ({info.get('ErrorCode')})")
        for sse in decoder.feed(event["PayloadPart"]["Bytes"]):
            if sse.is_done:
                done = True
                continue
            if assembler.add(sse.data) and ttft is None:
                ttft = time.monotonic() - started
    for sse in decoder.close():
        if not sse.is_done:
            assembler.add(sse.data)
        done = done or sse.is_done
    completion = assembler.completion()
    if not done and completion.finish_reason is None:
        raise _CallFailed("error", "the stream ended without a finish_reason or [DONE]")
    return completion, ttft


def _classify(exc: Exception, target: EvalTarget) -> _CallFailed:
    if isinstance(exc, EventStreamError):
        err = exc.response.get("Error", {})
        code = err.get("Code")
        outcome = "timeout" if "ModelInvocationTimeExceeded" in str(exc.response) else "error"
        return _CallFailed(outcome, f"{code} during the stream: {err.get('Message')} (endpoint {target.endpoint_name})")
    if isinstance(exc, ReadTimeoutError):
        return _CallFailed("timeout", f"no answer from {target.endpoint_name} before the client's read timeout")
    if isinstance(exc, ProtocolError):
        return _CallFailed("error", str(exc))
    if isinstance(exc, ClientError):
        err = exc.response.get("Error", {})
        code = str(err.get("Code"))
        message = str(err.get("Message"))
        if code == "ModelError":
            original = str(exc.response.get("OriginalMessage") or message)
            status = exc.response.get("OriginalStatusCode")
            overflow = parse_context_overflow(original)
            if overflow is not None:
                return _CallFailed("context_overflow", overflow.describe(target.endpoint_name, target.max_model_len))
            if "timed out" in original:
                return _CallFailed("timeout", f"{target.endpoint_name}: {original}")
            logs = exc.response.get("LogStreamArn")
            return _CallFailed(
                "error",
                f"ModelError from {target.endpoint_name}: container answered HTTP {status}: {original[:500]}"
                + (f" (logs: {logs})" if logs else ""),
            )
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return _CallFailed("error", f"{code} (HTTP {status}) from {target.endpoint_name}: {message}")
    raise exc


def invoke_case(
    runtime: SageMakerRuntimeClient,
    target: EvalTarget,
    case: EvalCase,
    max_tokens: int,
    source: str,
    retry: RetryPolicy,
) -> CaseResult:
    body = build_body(
        target.schema, case.message_dicts(), max_tokens, target.streams, target.model, target.adapter_field
    )
    attempt = 0
    while True:
        attempt += 1
        started = time.monotonic()
        try:
            if target.streams:
                completion, ttft = _invoke_stream(runtime, target, body, started)
            else:
                completion, ttft = _invoke_plain(runtime, target, body)
            latency = time.monotonic() - started
            return judge(case, max_tokens, source, completion, Timing(latency_s=latency, ttft_s=ttft, attempts=attempt))
        except _CallFailed as failed:
            return _failure(case, max_tokens, source, failed, attempt)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code in THROTTLE_CODES and attempt < retry.attempts:
                retry.sleep(retry.backoff(attempt))
                continue
            classified = _classify(exc, target)
            if code in THROTTLE_CODES:
                classified = _CallFailed("error", f"{classified.detail}; still throttled after {attempt} attempts")
            return _failure(case, max_tokens, source, classified, attempt)
        except (ReadTimeoutError, ProtocolError) as exc:
            return _failure(case, max_tokens, source, _classify(exc, target), attempt)


def _failure(case: EvalCase, max_tokens: int, source: str, failed: _CallFailed, attempts: int) -> CaseResult:
    return CaseResult(
        id=case.id,
        outcome=failed.outcome,  # type: ignore[arg-type]
        max_tokens=max_tokens,
        max_tokens_source=source,
        detail=failed.detail,
        attempts=attempts,
    )


def run_eval(
    runtime: SageMakerRuntimeClient,
    target: EvalTarget,
    cases: list[EvalCase],
    thresholds: EvalThresholds,
    ceiling: int,
    retry: RetryPolicy | None = None,
    must_finish: bool = False,
) -> EvalReport:
    """CASES against TARGET, one after another, inside the Lambda's remaining time: a case that could
    outlive it is not sent (and says why), or with MUST_FINISH the run stops there (EvalOutOfTime)."""
    retry = retry or RetryPolicy()
    results: list[CaseResult] = []
    for case in cases:
        time_left = clock.time_left()
        if time_left is not None and time_left < case_seconds(retry):
            if must_finish:
                raise EvalOutOfTime(
                    f"{target.endpoint_name}: ran {len(results)} of {len(cases)} eval cases, then the Lambda had "
                    f"{time_left:.0f} s left, less than one case may take ({case_seconds(retry):.0f} s)"
                )
            # A case started now could outlive the Lambda: it is not sent, and says why.
            results.append(_not_sent(case, target, time_left, case_seconds(retry)))
            continue
        budget = budget_for(case.message_dicts(), case.max_tokens, case.reference, ceiling, target.max_model_len)
        if budget.refused or budget.max_tokens is None:
            results.append(
                CaseResult(
                    id=case.id,
                    outcome="context_overflow",
                    max_tokens=None,
                    max_tokens_source=budget.source,
                    attempts=0,
                    detail=f"not sent: {budget.refused} (endpoint {target.endpoint_name})",
                )
            )
            continue
        results.append(invoke_case(runtime, target, case, budget.max_tokens, budget.source, retry))
    return verdict(
        target.endpoint_name,
        results,
        thresholds,
        max_model_len=target.max_model_len,
        streaming=target.streams,
        schema_name=target.schema,
    )


# What the Lambda needs after the last case: the reports and the record.
AFTER_CASES_SECONDS = 30.0


def case_seconds(retry: RetryPolicy) -> float:
    """The longest one case can take: the runtime client's read timeout, RETRY's sleeps, and what
    the Lambda needs after the last case."""
    read_timeout = runtime_client_config().read_timeout  # type: ignore[attr-defined]  # set from kwargs at runtime
    return float(read_timeout) + retry.longest_wait() + AFTER_CASES_SECONDS


def _not_sent(case: EvalCase, target: EvalTarget, time_left: float, needed: float) -> CaseResult:
    return CaseResult(
        id=case.id,
        outcome="error",
        max_tokens=None,
        max_tokens_source="not sent",
        attempts=0,
        detail=f"not sent: the eval's Lambda had {time_left:.0f} s left, less than one case may take "
        f"({needed:.0f} s) on {target.endpoint_name}; a smaller eval set (or fewer adapters) fits its timeout",
    )


def adapter_ignored(adapter: EvalReport, base: EvalReport) -> bool:
    """The adapter answered exactly as the base on every case both answered: it was not applied."""
    pairs = [
        (a.answer_preview, b.answer_preview)
        for a, b in zip(adapter.cases, base.cases, strict=False)
        if a.outcome == "pass" and b.outcome == "pass"
    ]
    return bool(pairs) and all(a == b for a, b in pairs)


def evaluate_endpoint(
    sm: SageMakerClient,
    runtime: SageMakerRuntimeClient,
    endpoint_name: str,
    cases: list[EvalCase],
    thresholds: EvalThresholds,
    stream: bool = True,
    schema: Schema = "chat",
    retry: RetryPolicy | None = None,
    component: str | None = None,
    must_finish: bool = False,
) -> EvalReport:
    """The smoke eval against any existing endpoint (COMPONENT: through that inference component),
    with its max model length read from its container env."""
    from modeldrop.aws.sagemaker.inference_components import component_container_env

    found = component_container_env(sm, component) if component else endpoint_container_env(sm, endpoint_name)
    what = f"inference component {component}" if component else f"endpoint {endpoint_name}"
    if found is None:
        raise RequestInvalid(
            f"{what} does not exist in this account and region",
            "check the name (`modeldrop list`) and the region (--region)",
        )
    status, env = found
    if status not in ("InService", "Updating"):
        raise RequestInvalid(f"{what} is {status}, not InService", "wait for InService, then retry")
    engine = engine_of_env(env) or "vllm"
    target = EvalTarget(endpoint_name, max_model_len_of_env(env), schema=schema, stream=stream, component=component)
    return run_eval(runtime, target, cases, thresholds, max_tokens_ceiling(engine), retry, must_finish)


def compare_endpoints(
    sm: SageMakerClient,
    runtime: SageMakerRuntimeClient,
    champion: str,
    candidate: str,
    cases: list[EvalCase],
    thresholds: GateThresholds,
    stream: bool = True,
    schema: Schema = "chat",
    components: tuple[str | None, str | None] = (None, None),
) -> GateReport:
    """The champion/challenger gate: one eval set on both endpoints (or on both inference COMPONENTS,
    champion's then candidate's), compared case by case. Every case may fail on its own: the gate
    judges change, not the smoke verdict. Both runs must finish inside the Lambda's time (EvalOutOfTime
    otherwise): a candidate whose cases were never sent has not regressed."""
    lenient = EvalThresholds(max_truncated=len(cases), max_errors=len(cases), max_check_failures=len(cases))
    reports = [
        evaluate_endpoint(
            sm, runtime, name, cases, lenient, stream=stream, schema=schema, component=component, must_finish=True
        )
        for name, component in zip((champion, candidate), components, strict=True)
    ]
    return compare(reports[0], reports[1], thresholds)
