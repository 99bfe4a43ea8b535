"""A fine-tune against its base checkpoint: which tensors of the base the fine-tune lacks.

Whatever the architecture: a tensor the base has and the fine-tune does not is one an engine
built from the base's config may expect (Gemma-4's KV-shared k_proj / v_proj / k_norm are the
known case). Pure: works on two scans' headers.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from modeldrop.checkpoint.archive.artifact_scan import ArtifactScan
from modeldrop.checkpoint.headers.safetensors_header import TensorInfo
from modeldrop.contracts.models import Finding

MIN_SHARED_FRACTION = 0.5


class BaseComparison(BaseModel):
    base_source: str
    base_tensor_count: int
    shared_tensor_count: int
    missing: list[str] = Field(default_factory=list)
    missing_bytes: int = 0
    shape_mismatches: list[str] = Field(default_factory=list)

    @property
    def shared_fraction(self) -> float:
        return self.shared_tensor_count / self.base_tensor_count if self.base_tensor_count else 0.0


def tensor_index(scan: ArtifactScan) -> dict[str, tuple[str, TensorInfo]]:
    """Tensor name -> (shard, header entry), first shard wins."""
    out: dict[str, tuple[str, TensorInfo]] = {}
    for rel in sorted(scan.headers):
        for name, info in scan.headers[rel].tensors.items():
            out.setdefault(name, (rel, info))
    return out


def compare_to_base(fine: ArtifactScan, base: ArtifactScan) -> BaseComparison:
    mine = tensor_index(fine)
    theirs = tensor_index(base)
    missing = sorted(n for n in theirs if n not in mine)
    mismatches = sorted(
        f"{n}: {mine[n][1].dtype}{list(mine[n][1].shape)} here, {info.dtype}{list(info.shape)} in the base"
        for n, (_rel, info) in theirs.items()
        if n in mine and (mine[n][1].shape, mine[n][1].dtype) != (info.shape, info.dtype)
    )
    return BaseComparison(
        base_source=base.source,
        base_tensor_count=len(theirs),
        shared_tensor_count=sum(1 for n in theirs if n in mine),
        missing=missing,
        missing_bytes=sum(theirs[n][1].nbytes for n in missing),
        shape_mismatches=mismatches,
    )


def base_findings(cmp: BaseComparison, source: str) -> list[Finding]:
    findings: list[Finding] = []
    if cmp.base_tensor_count and cmp.shared_fraction < MIN_SHARED_FRACTION:
        findings.append(
            Finding(
                code="BASE_MISMATCH",
                severity="error",
                message=(
                    f"the base {cmp.base_source} shares only {cmp.shared_tensor_count} of its "
                    f"{cmp.base_tensor_count} tensor names with this checkpoint"
                ),
                hint="check that BASE is the model this one was fine-tuned from, saved with the same naming",
            )
        )
        return findings
    if cmp.missing:
        shown = ", ".join(cmp.missing[:3]) + (", ..." if len(cmp.missing) > 3 else "")
        findings.append(
            Finding(
                code="BASE_TENSORS_MISSING",
                severity="error",
                message=(
                    f"{len(cmp.missing)} tensors of the base ({cmp.missing_bytes:,} bytes) are not in this "
                    f"checkpoint: {shown}"
                ),
                hint=f"modeldrop repair {source} --base {cmp.base_source} --out DEST",
            )
        )
    if cmp.shape_mismatches:
        findings.append(
            Finding(
                code="BASE_SHAPE_MISMATCH",
                severity="warning",
                message=f"{len(cmp.shape_mismatches)} tensors differ in shape or dtype from the base: "
                + "; ".join(cmp.shape_mismatches[:3]),
                hint="expected after a vocabulary resize or a dtype change; otherwise the base is the wrong one",
            )
        )
    return findings
