"""Which SageMaker hosting instance types exist, and which can serve a GPU engine.

The names come from botocore's own SageMaker service model (the `ProductionVariantInstanceType`
enum the CreateEndpointConfig API validates against), so a new type arrives with botocore and a
typo is caught before anything is created, not by SageMaker minutes later.
"""

from __future__ import annotations

import difflib
import re
from functools import lru_cache

from modeldrop.contracts.text import nearest

# NVIDIA GPU families (g4dn, g5, g6, g6e, gr6, p4d, p5, ...); the vLLM/SGLang/LMI DLCs are
# x86_64 CUDA images, so Graviton GPU families (g5g) and Inferentia/Trainium (inf*, trn*) cannot serve them.
_GPU_FAMILY = re.compile(r"^ml\.(g\d+[a-z]*|gr\d+[a-z]*|p\d+[a-z]*)\.")
_GRAVITON = re.compile(r"^ml\.g\d+g\.")


@lru_cache(maxsize=1)
def hosting_instance_types() -> frozenset[str]:
    """Every instance type a production variant may use, as botocore's SageMaker model lists them."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    names: list[str] = model.shape_for("ProductionVariantInstanceType").enum  # type: ignore[attr-defined]
    return frozenset(names)


def is_gpu(instance_type: str) -> bool:
    return bool(_GPU_FAMILY.match(instance_type)) and not _GRAVITON.match(instance_type)


def closest(instance_type: str, candidates: frozenset[str] | None = None, n: int = 3) -> list[str]:
    """The hosting types nearest INSTANCE_TYPE by edit distance, within its kind: a GPU family asked for
    (`ml.g99.huge`) is answered with GPU types only, never a CPU type that happens to be as near."""
    pool = sorted(candidates if candidates is not None else hosting_instance_types())
    family = re.match(r"^ml\.([a-z]+)", instance_type)
    if (family and family.group(1) in ("g", "gr", "p")) or _GPU_FAMILY.match(instance_type):
        pool = [t for t in pool if is_gpu(t)]
    near = nearest(instance_type, pool, n=n, most=max(3, len(instance_type) // 2))
    return near or difflib.get_close_matches(instance_type, pool, n=n, cutoff=0.6)


def instance_type_problem(instance_type: str, gpu_engine: bool = True) -> tuple[str, str] | None:
    """(message, fix) when INSTANCE_TYPE cannot host the deployment; None when it can."""
    known = hosting_instance_types()
    if instance_type not in known:
        near = closest(instance_type)
        return (
            f"{instance_type!r} is not a SageMaker hosting instance type",
            f"did you mean {', '.join(near)}?"
            if near
            else "see the SageMaker pricing page for real-time instance types",
        )
    if gpu_engine and not is_gpu(instance_type):
        return (
            f"{instance_type} has no NVIDIA GPU; the vLLM, SGLang and LMI containers need one",
            "use a GPU instance type such as ml.g6.2xlarge (L4, 24 GB) or ml.g6e.2xlarge (L40S, 48 GB)",
        )
    return None
