"""adapter_mode shared, as NormalizeRequest reads it: every adapter named and pinned, LMI only, no
two adapters of one name; a plan sized for all of them."""

from __future__ import annotations

import pytest

from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import DeploymentRequest, ValidationSummary
from modeldrop.contracts.served import AdapterInfo
from modeldrop.pipeline.adapters.adapter_steps import adapter_fields
from modeldrop.serving.lora_plan import lora_gib, widest

BASE = "s3://bucket-a/base/model.tar.gz"


def _request(**fields: object) -> DeploymentRequest:
    return DeploymentRequest.model_validate(
        {"artifact_uri": "s3://bucket-a/runs/a1/adapter.tar.gz", "base": BASE, "adapter_mode": "shared", **fields}
    )


def test_every_adapter_is_named_after_its_folder() -> None:
    fields = adapter_fields(_request(adapters=["s3://bucket-a/runs/a2/adapter.tar.gz", "s3://bucket-a/runs/a3/"]))
    assert (str(fields["artifact_uri"]), fields["adapter_name"], fields["adapter_mode"]) == (BASE, "a1", "shared")
    assert [a["name"] for a in fields["more_adapters"]] == ["a2", "a3"]


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"engine": "sglang"}, "the sglang container does not take"),
        ({"adapters": ["s3://bucket-a/other/a1/adapter.tar.gz"]}, "share the name 'a1'"),
        ({"adapters": ["s3://bucket-a/runs/a2/"], "adapter_mode": "dedicated"}, "only in adapter_mode shared"),
        ({"adapters": [BASE]}, "the same artifact"),
    ],
)
def test_what_shared_mode_refuses(fields: dict[str, object], says: str) -> None:
    with pytest.raises(RequestInvalid, match=says):
        adapter_fields(_request(**fields))


def test_adapters_without_a_base_are_refused() -> None:
    request = DeploymentRequest.model_validate(
        {"artifact_uri": "s3://bucket-a/runs/a1/adapter.tar.gz", "adapters": ["s3://bucket-a/runs/a2/"]}
    )
    with pytest.raises(RequestInvalid, match="no base is named"):
        adapter_fields(request)


def test_the_lora_slots_hold_the_largest_adapter_for_every_one_resident() -> None:
    small = AdapterInfo(name="a", path="-", max_rank=8, modules=4, bytes=1, features=1000)
    large = AdapterInfo(name="b", path="-", max_rank=40, modules=4, bytes=1, features=3000)
    slots = widest([small, large])
    assert (slots.max_rank, slots.features) == (40, 3000)
    assert lora_gib(slots, 2) == pytest.approx(3000 * 64 * 2 * 2 / 1024**3)  # rank 40 takes a 64 slot
    summary = ValidationSummary.model_construct(adapter=small, more_adapters=[large])
    assert [a.name for a in summary.adapters] == ["a", "b"]


def test_base_endpoint_takes_the_adapters_only() -> None:
    request = DeploymentRequest.model_validate(
        {"artifact_uri": "s3://bucket-a/runs/a1/adapter.tar.gz", "base_endpoint": "modeldrop-team-base"}
    )
    fields = adapter_fields(request)
    assert (fields["adapter_name"], fields["adapter_mode"]) == ("a1", "shared") and "artifact_uri" not in fields
    with pytest.raises(RequestInvalid, match="both base and base_endpoint"):
        adapter_fields(_request(base_endpoint="modeldrop-team-base"))
    with pytest.raises(RequestInvalid, match="adapter_mode shared, on the LMI container"):
        adapter_fields(request.model_copy(update={"engine": "vllm"}))
