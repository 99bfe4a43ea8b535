"""Run the smoke eval against a SageMaker endpoint through sagemaker-runtime."""

from __future__ import annotations

import json
import time
from typing import Any

from botocore.exceptions import ClientError

from modeldrop.models import EvalThresholds
from modeldrop.smoke_eval import CaseResult, EvalCase, EvalReport, chat_request, judge, verdict


def invoke_case(runtime: Any, endpoint_name: str, case: EvalCase, max_tokens: int) -> CaseResult:
    body = chat_request(case, max_tokens)
    started = time.monotonic()
    try:
        response = runtime.invoke_endpoint(
            EndpointName=endpoint_name,
            ContentType="application/json",
            Accept="application/json",
            Body=json.dumps(body).encode(),
        )
    except ClientError as exc:
        err = exc.response.get("Error", {})
        # A ModelError carries the container's own status; other errors only the API's.
        status = exc.response.get("OriginalStatusCode") or exc.response.get("ResponseMetadata", {}).get(
            "HTTPStatusCode"
        )
        return CaseResult(
            id=case.id,
            outcome="error",
            max_tokens=max_tokens,
            detail=f"{err.get('Code')}: {err.get('Message')} (HTTP {status}, endpoint {endpoint_name})",
        )
    latency = round(time.monotonic() - started, 4)
    return judge(case, max_tokens, response["Body"].read(), latency)


def run_eval(
    runtime: Any, endpoint_name: str, cases: list[EvalCase], thresholds: EvalThresholds, default_max_tokens: int
) -> EvalReport:
    results = [invoke_case(runtime, endpoint_name, c, c.max_tokens or default_max_tokens) for c in cases]
    return verdict(endpoint_name, results, thresholds)
