"""The emulator's IAM model is the Service Authorization Reference's data (tools/gen_iam_table.py):
a rule that folds an action into another, forgets a resource type the call names, or conditions on a
key the SAR does not give the action is refused before any policy is evaluated."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from modeldrop.local.emulator.iam.calls import RULES, Call, UnmappedCall, requests_for
from modeldrop.local.emulator.iam.policy import AuthRequest
from modeldrop.local.emulator.iam.sar import NotInReference, check, table

ROOT = Path(__file__).resolve().parents[2]
ENDPOINT = "arn:aws:sagemaker:us-east-1:123456789012:endpoint/modeldrop-x"
COMPONENT = "arn:aws:sagemaker:us-east-1:123456789012:inference-component/modeldrop-x-base"


class _NoLookups:
    def sagemaker_tags(self, arn: str) -> dict[str, str] | None:
        return None

    def secret(self, secret_id: str) -> tuple[str, str | None] | None:
        return None

    def parameter_key(self, name: str) -> str | None:
        return None


def test_the_streaming_invoke_is_its_own_action_with_two_resource_types() -> None:
    spec = table()["sagemaker:InvokeEndpointWithResponseStream"]
    assert {r.kind for r in spec.resources} == {"endpoint", "inference-component"}
    folded = [AuthRequest("sagemaker:InvokeEndpoint", ENDPOINT)]
    with pytest.raises(NotInReference, match="InvokeEndpointWithResponseStream in the SAR"):
        check("sagemaker-runtime", "InvokeEndpointWithResponseStream", {"EndpointName": "modeldrop-x"}, folded)


def test_a_component_the_call_names_must_be_authorized_too() -> None:
    params = {"EndpointName": "modeldrop-x", "InferenceComponentName": "modeldrop-x-base"}
    endpoint_only = [AuthRequest("sagemaker:InvokeEndpoint", ENDPOINT)]
    with pytest.raises(NotInReference, match="inference-component"):
        check("sagemaker-runtime", "InvokeEndpoint", params, endpoint_only)
    check(
        "sagemaker-runtime",
        "InvokeEndpoint",
        params,
        [*endpoint_only, AuthRequest("sagemaker:InvokeEndpoint", COMPONENT)],
    )


def test_resources_and_condition_keys_are_the_sars() -> None:
    with pytest.raises(NotInReference, match="none of the resource types"):
        check("sagemaker", "DescribeModel", {"ModelName": "m"}, [AuthRequest("sagemaker:DescribeModel", ENDPOINT)])
    with pytest.raises(NotInReference, match="takes no resource"):
        check("sagemaker", "ListEndpoints", {}, [AuthRequest("sagemaker:ListEndpoints", ENDPOINT)])
    prefixed = AuthRequest("s3:ListBucketMultipartUploads", "arn:aws:s3:::b", {"s3:prefix": "x/"})
    with pytest.raises(NotInReference, match="s3:prefix is not a condition key"):
        check("s3", "ListMultipartUploads", {"Bucket": "b"}, [prefixed])
    with pytest.raises(NotInReference, match="not in the generated SAR table"):
        check("sagemaker", "FooModel", {}, [AuthRequest("sagemaker:FooModel", "*")])


def test_the_emulators_rules_pass_the_reference() -> None:
    # The invoke rules as the emulator applies them, streamed and with a component.
    for op in ("InvokeEndpoint", "InvokeEndpointWithResponseStream"):
        call = Call("sagemaker-runtime", op, {"EndpointName": "e", "InferenceComponentName": "c"}, "us-east-1", "1")
        assert [r.action for r in requests_for(call, _NoLookups())] == [f"sagemaker:{op}"] * 2
    # Every operation the emulator maps that the SAR names as an action is in the generated table.
    prefix = {"sagemaker-runtime": "sagemaker", "stepfunctions": "states", "service-quotas": "servicequotas"}
    named = {f"{prefix.get(s, s)}:{op}" for s, op in RULES}
    assert {"sagemaker:InvokeEndpointWithResponseStream", "sagemaker:CreateInferenceComponent"} <= set(table())
    assert not {"s3:HeadObject", "s3:ListObjectsV2"} & set(table())  # authorized by other actions
    assert named & set(table())
    with pytest.raises(UnmappedCall, match=r"add it to iam_calls\.RULES"):
        requests_for(
            Call("sagemaker", "UpdateEndpointWeightsAndCapacities", {"EndpointName": "e"}, "us-east-1", "1"),
            _NoLookups(),
        )


def test_every_action_the_template_grants_is_in_the_table() -> None:
    text = (ROOT / "template.yaml").read_text()
    granted = {
        f"{s}:{a}"
        for s, a in re.findall(r"(?<![:\w-])([a-z0-9-]+):([A-Z][A-Za-z0-9]+)\b(?![/:]|\"\s*:|'\s*:)", text)
        if s != "aws"
    }
    assert granted and granted <= set(table()), sorted(granted - set(table()))


def test_the_committed_table_is_what_the_generator_writes_from_pypi() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_iam_table.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
