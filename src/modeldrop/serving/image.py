"""Serving image resolution: full-URI env -> version env -> assembled from data/images.json.

The region always comes from the caller (the endpoint's region) and must match the image's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from importlib import resources
from typing import Any

from modeldrop.contracts.errors import ImageUnresolvable
from modeldrop.contracts.step_payloads import Engine, ImageChoice

_ECR = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(\.cn)?/"
    r"(?P<repository>[a-z0-9._/-]+):(?P<tag>[A-Za-z0-9._-]+)$"
)
BYOC_WARNING = "the container must honour the SageMaker contract (port 8080, /ping, /invocations)"
_LMI_VERSION = re.compile(r"^\d+\.\d+\.\d+-lmi\d+\.\d+\.\d+$")


@cache
def image_table() -> dict[str, Any]:
    text = resources.files("modeldrop.serving").joinpath("data/images.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def registry_account(region: str) -> str:
    """The Deep Learning Containers' registry account in REGION (the SageMaker Python SDK's table);
    a region it does not list is refused, never guessed."""
    account = image_table()["registry_accounts"].get(region)
    if account is None:
        raise ImageUnresolvable(
            f"no Deep Learning Containers registry is known for {region}",
            "set the engine's *_IMAGE_URI to an image in that region, or deploy in a listed region",
        )
    return str(account)


def _dlc_accounts() -> set[str]:
    return set(image_table()["registry_accounts"].values())


def gpu_archs(engine: Engine) -> list[str]:
    """The GPU architectures the engine's DLC image is built for."""
    return list(image_table()["engines"][engine].get("gpu_archs", []))


def resolve_image(engine: Engine, region: str, env: Mapping[str, str], model_type: str | None = None) -> ImageChoice:
    spec = image_table()["engines"][engine]
    warnings: list[str] = []
    full = env.get(spec["uri_env"], "").strip()
    version = env.get(spec["version_env"], "").strip()
    if full:
        source = spec["uri_env"]
        uri = full
    elif version:
        if engine == "lmi" and not _LMI_VERSION.match(version):
            raise ImageUnresolvable(
                f"LMI_VERSION={version!r} names only one version axis",
                "give both axes, e.g. LMI_VERSION=0.36.0-lmi27.0.0: the lmi axis decides the "
                "bundled vLLM, and an SDK lookup of 0.36.0 alone lands on lmi26, which cannot load Gemma-4",
            )
        source = spec["version_env"]
        uri = _assemble(region, spec["repository"], spec["tag_pattern"].format(version=version))
    else:
        source = "default"
        uri = _assemble(region, spec["repository"], spec["tag"])

    match = _ECR.match(uri)
    if match is None:
        if "/" not in uri or ":" not in uri.rsplit("/", 1)[-1]:
            raise ImageUnresolvable(
                f"{source}={uri!r} is not an image URI (registry/repository:tag)",
                f"set {spec['uri_env']} to a full ECR image URI",
            )
        warnings.append(f"{uri} is not an ECR DLC: {BYOC_WARNING}")
    else:
        if match["region"] != region:
            raise ImageUnresolvable(
                f"image {uri} is in {match['region']} but the endpoint is in {region}",
                f"use the image from {region} (SageMaker pulls only from the endpoint's region)",
            )
        if match["account"] not in _dlc_accounts():
            warnings.append(f"{uri} is not an AWS DLC (BYOC): {BYOC_WARNING}")
        _check_compatibility(engine, match["tag"], model_type)
    return ImageChoice(engine=engine, image_uri=uri, source=source, region=region, warnings=warnings)


def _assemble(region: str, repository: str, tag: str) -> str:
    if not re.match(r"^[a-z]{2}(-gov)?-[a-z]+-\d$", region):
        raise ImageUnresolvable(f"{region!r} is not an AWS region", "set AWS_REGION / --region")
    suffix = ".amazonaws.com.cn" if region.startswith("cn-") else ".amazonaws.com"
    return f"{registry_account(region)}.dkr.ecr.{region}{suffix}/{repository}:{tag}"


def _check_compatibility(engine: Engine, tag: str, model_type: str | None) -> None:
    for rule in image_table()["incompatible"]:
        if rule["engine"] == engine and model_type in rule["model_types"] and re.search(rule["tag_regex"], tag):
            raise ImageUnresolvable(f"{engine} image tag {tag}: {rule['reason']}", rule["fix"])
