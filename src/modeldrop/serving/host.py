"""The host an image runs on: its NVIDIA driver (the instance family's default, or an inference AMI's)
against the CUDA the image was built for, and the GPU architecture against the ones the engine's
image carries kernels for.

A SageMaker real-time host runs its family's default driver (470 on ml.g5, 535 on ml.g6) unless the
endpoint config names an InferenceAmiVersion; a container built for a newer CUDA then fails to start
(CannotStartContainerError, often with no logs). The plan therefore picks the AMI whose driver
covers the image's CUDA on that instance family, or refuses the type with the reason.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from modeldrop.contracts.errors import PlanRefused
from modeldrop.contracts.step_payloads import Engine, ImageChoice

_CUDA_TAG = re.compile(r"(?:^|[-_.])cu(?P<major>\d{2})(?P<minor>\d)(?:$|[-_.])")


class HostIncompatible(PlanRefused):
    """No host of this instance type can run the image (driver or GPU architecture)."""


@cache
def _data(name: str) -> dict[str, Any]:
    text = resources.files("modeldrop.serving").joinpath(f"data/{name}").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def amis() -> dict[str, dict[str, Any]]:
    """AMI version -> {nvidia_driver, cuda}, as botocore's SageMaker model documents them."""
    return dict(_data("inference_amis.json")["amis"])


def image_cuda(image_uri: str) -> tuple[int, int] | None:
    """The CUDA version an image was built for, from its tag (`...-cu130-...` is 13.0); None if unknown."""
    tag = image_uri.rsplit(":", 1)[-1] if ":" in image_uri.rsplit("/", 1)[-1] else ""
    match = _CUDA_TAG.search(tag)
    return (int(match["major"]), int(match["minor"])) if match else None


def family(instance_type: str) -> str:
    """ml.g6e.2xlarge -> g6e."""
    parts = instance_type.split(".")
    return parts[1] if len(parts) == 3 else instance_type


def default_driver(instance_type: str) -> int | None:
    driver = _data("host_drivers.json")["default_driver"].get(family(instance_type))
    return int(driver) if driver is not None else None


def _cuda(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@dataclass(frozen=True)
class HostChoice:
    inference_ami_version: str | None
    driver: int | None
    cuda: str | None  # the image's
    note: str


def choose_host(image_uri: str, instance_type: str) -> HostChoice:
    """The inference AMI for IMAGE on INSTANCE_TYPE: the one with the lowest driver that still covers
    the image's CUDA and runs on the instance family. HostIncompatible when there is none."""
    needed = image_cuda(image_uri)
    fam = family(instance_type)
    families = _data("host_drivers.json")["ami_families"]
    if needed is None:
        # An NVIDIA driver runs images of every older CUDA: the newest AMI for the family is the one
        # most likely to run an image whose CUDA is unknown.
        newest = max(
            ((int(spec["nvidia_driver"]), name) for name, spec in amis().items() if fam in families.get(name, [])),
            default=None,
        )
        if newest is None:
            return HostChoice(
                None,
                default_driver(instance_type),
                None,
                f"the image's CUDA is not in its tag and no inference AMI lists {fam}: the host default driver is used",
            )
        return HostChoice(
            newest[1],
            newest[0],
            None,
            f"the image's CUDA is not in its tag: {newest[1]} (NVIDIA driver {newest[0]}), the newest AMI for {fam}, "
            "whose driver runs images of any older CUDA",
        )
    shown = f"{needed[0]}.{needed[1]}"
    fitting = [
        (spec["nvidia_driver"], name)
        for name, spec in amis().items()
        if fam in families.get(name, []) and _cuda(str(spec["cuda"])) >= needed
    ]
    if not fitting:
        default = default_driver(instance_type)
        raise HostIncompatible(
            f"no SageMaker inference AMI runs on {fam} instances with a driver for CUDA {shown} (the image's); "
            f"the family's default driver is {default or 'unknown'}",
            "use an image built for an older CUDA, or an instance family an AMI with a newer driver supports",
        )
    driver, name = min(fitting)
    default = default_driver(instance_type)
    return HostChoice(
        name,
        int(driver),
        shown,
        f"{name} (NVIDIA driver {driver}) for the image's CUDA {shown}; the {fam} default driver is "
        f"{default or 'unknown'}",
    )


def driver_runs(driver: int, cuda: tuple[int, int]) -> bool:
    """Whether a host on DRIVER starts a container built for CUDA (the newest CUDA of its branch)."""
    covered = _data("host_drivers.json")["driver_cuda"]
    newest = max((_cuda(v) for k, v in covered.items() if int(k) <= driver), default=(0, 0))
    return newest >= cuda


def gpu_arch(gpu: str | None) -> str | None:
    return _data("host_drivers.json")["gpu_arch"].get(gpu or "")


def check_gpu_arch(engine: str, archs: list[str], gpu: str | None, instance_type: str) -> None:
    """Refuse an instance whose GPU the engine's image has no kernels for."""
    arch = gpu_arch(gpu)
    if arch is None or not archs or arch in archs:
        return
    raise HostIncompatible(
        f"the {engine} image is built for {', '.join(archs)} GPUs; {instance_type} has an {gpu} ({arch})",
        "use an instance type with one of those GPUs, or another engine (vllm, lmi) for this one",
    )


def host_for(image: ImageChoice, engine: Engine, instance_type: str) -> HostChoice:
    """HostIncompatible when no host of INSTANCE_TYPE runs IMAGE: a driver too old for its CUDA with no
    AMI to fix it, or a GPU its kernels were not built for (checked for the engine's own DLC images)."""
    if not image.warnings:  # an AWS DLC of this engine, not a BYOC image
        from modeldrop.serving.image import gpu_archs
        from modeldrop.serving.memory_plan import instance

        spec = instance(instance_type)
        check_gpu_arch(engine, gpu_archs(engine), str(spec["gpu"]) if spec else None, instance_type)
    return choose_host(image.image_uri, instance_type)
