"""What run-local shows of a shared deployment before it ends: the endpoint's inference components,
then one adapter torn down (as `modeldrop teardown --adapter` does) while the others go on serving,
each invoked through its own component, and the torn-down one refused."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.exceptions import ClientError

from modeldrop.pipeline.adapters.component_steps import adapter_components, teardown_adapter

PROBE = {"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}


def shared_check(stack: Any, deployment_id: str) -> dict[str, Any] | None:
    registry = stack.registry()
    record = registry.get(deployment_id)
    if record is None or not adapter_components(record):
        return None
    from modeldrop.local.stack.emulated import REGION

    sm = stack.client("sagemaker")
    runtime = boto3.client("sagemaker-runtime", region_name=REGION, endpoint_url=stack.runtime.url)
    endpoint = str(record.endpoint_name)

    def listed() -> list[dict[str, Any]]:
        items = sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"]
        out: list[dict[str, Any]] = []
        for c in items:
            desc = sm.describe_inference_component(InferenceComponentName=c["InferenceComponentName"])
            spec, runtime_config = desc.get("Specification") or {}, desc.get("RuntimeConfig") or {}
            row: dict[str, Any] = {"name": c["InferenceComponentName"], "status": c["InferenceComponentStatus"]}
            if "CurrentCopyCount" in runtime_config or "DesiredCopyCount" in runtime_config:
                row["copies"] = runtime_config.get("CurrentCopyCount", runtime_config.get("DesiredCopyCount"))
            if spec.get("StartupParameters"):
                row["startup_parameters"] = spec["StartupParameters"]
            out.append(row)
        base_copies = next((r.get("copies") for r in out if "copies" in r), None)
        for row in out:  # an adapter component runs in its base's copies
            row.setdefault("copies", base_copies)
        return out

    def probe(component: str) -> str:
        try:
            body = runtime.invoke_endpoint(
                EndpointName=endpoint,
                InferenceComponentName=component,
                ContentType="application/json",
                Body=json.dumps(PROBE).encode(),
            )["Body"].read()
            return "answered: " + str(json.loads(body).get("generated_text", ""))[:60]
        except ClientError as exc:
            return (
                f"refused: {exc.response.get('Error', {}).get('Code')}: {exc.response.get('Error', {}).get('Message')}"
            )

    before = listed()
    adapters = adapter_components(record)
    removed = adapters[0]
    deleted = teardown_adapter(sm, registry, record, str(removed["adapter"]))
    listed()  # SageMaker lists a deleted component as Deleting until it is gone
    after = listed()
    return {
        "endpoint": endpoint,
        "components": before,
        "torn_down": {"adapter": removed["adapter"], "deleted": deleted},
        "components_after": after,
        "invoked_after": {str(a["component"]): probe(str(a["component"])) for a in adapters},
    }
