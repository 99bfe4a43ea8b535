"""EngineCheck, between ResolveImage and BuildEngineEnv: the resolved image's engine judges the served
copy before any GPU is paid for.

What the engine reads is rebuilt from what validation reads (the side files and every safetensors
header, by ranged GET from the served prefix): a skeleton directory whose shards hold their real
headers and sparse zeros where the tensor bytes were. engine_probe never reads a weight byte, so the
skeleton is judged as the checkpoint would be, at the cost of the headers. A refusal ends the
deployment as CheckpointRefused with the engine's own words, and a check that dies (its memory or
time bound, a signal) as EngineCheckFailed; where no engine can run here (a stack whose function
carries none, an SGLang image, a model class this CPU venv cannot import) the step says so and the
static verdict stands — never a silent pass.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from modeldrop.checkpoint.archive.artifact_scan import scan_source
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.engine.engine_check import (
    EngineCheck,
    engine_check,
    engine_python,
    engine_refusal,
    from_probe,
    probe,
)
from modeldrop.checkpoint.engine.skeleton import write_skeleton
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.errors import CheckpointRefused, EngineCheckFailed
from modeldrop.contracts.step_payloads import Engine
from modeldrop.serving.engine_options import resolved_version

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from modeldrop.aws.dynamodb.registry import Registry

ENABLED_ENV = "MODELDROP_ENGINE_CHECK"  # the stack's EngineCheck parameter: Enabled | Disabled
MAX_ADAPTER_CONFIG_BYTES = 1 << 20  # adapter_config.json is a few hundred bytes


def run_step(
    s3: S3Client,
    registry: Registry,
    deployment_id: str,
    served: ArtifactUri | None,
    engine: Engine,
    region: str,
    env: Mapping[str, str],
    owner: str,
) -> EngineCheck:
    """The EngineCheck step: the verdict for the resolved image's engine, recorded on the deployment this
    execution owns, and CheckpointRefused when the engine refuses. SERVED is None when the adapters join a
    live base (judged when that base was deployed)."""
    target = resolved_version(engine, region, env)
    if served is None:
        check = EngineCheck(
            engine=target.engine,
            verdict="unavailable",
            judged_for=target.describe(),
            message="no served copy: the adapters join a live base, checked when it was deployed",
        )
    else:
        check = check_served(s3, served, target)
    registry.record(deployment_id, "engine_check", check.model_dump(mode="json"), owner=owner, live=True)
    raise_if_refused(check)
    return check


def check_served(s3: S3Client, served: ArtifactUri, target: EngineVersion) -> EngineCheck:
    """The engine's verdict on the served copy."""
    if os.environ.get(ENABLED_ENV, "Enabled") == "Disabled":
        return EngineCheck(
            engine=target.engine,
            verdict="unavailable",
            judged_for=target.describe(),
            message="the stack's EngineCheck parameter is Disabled: the static rules judged alone",
        )
    python = engine_python()
    if python is None and target.runs_vllm:
        return EngineCheck(
            engine=target.engine,
            verdict="unavailable",
            judged_for=target.describe(),
            message="this function carries no engine (the container-image engine-check function is not deployed "
            "in this stack): the static rules judged alone",
        )
    scan = scan_source(str(served), s3)
    with tempfile.TemporaryDirectory(prefix="modeldrop-engine-") as tmp:
        model = write_skeleton(scan, Path(tmp) / "model")
        adapters = _adapter_dirs(s3, served, scan, model)
        if not adapters or not target.runs_vllm or python is None:  # engine_check says why it cannot judge
            return engine_check(model, target, python)
        # An adapter is judged as the engine's LoRA manager reads it (PEFTHelper against the LoRA rules),
        # beside its base in the same process; an adapter-only copy joins a live base judged when deployed.
        judged = [] if "config.json" not in scan.small_files else [model]
        try:
            lines = probe([*judged, *(Path(f"--adapter={d}") for d in adapters)], python)
        except OSError as exc:  # the engine's interpreter could not be started: a broken check, never a pass
            return EngineCheck(engine="vllm", verdict="failed", stage="probe", judged_for=target.describe(),
                               message=f"the engine check could not start: {type(exc).__name__}: {exc}")  # fmt: skip
        return from_probe(_first_refusal(lines, adapters), target, python)


def _adapter_dirs(s3: S3Client, served: ArtifactUri, scan: ArtifactScan, model: Path) -> list[Path]:
    """The adapters of the served copy, each as the directory the probe reads (its adapter_config.json):
    the copy itself when it is an adapter, else each beside the base -- a folder `<dir>/<name>/` (dedicated
    mode) or the archive `<dir>/<name>.tar.gz` an adapter inference component takes (shared mode)."""
    if "adapter_config.json" in scan.small_files and "config.json" not in scan.small_files:
        return [model]
    found = []
    for rel in sorted(scan.files):
        parts = rel.split("/")
        if len(parts) == 3 and parts[2] == "adapter_config.json" and scan.files[rel] <= MAX_ADAPTER_CONFIG_BYTES:
            body = s3.get_object(Bucket=served.bucket, Key=served.key + rel)["Body"].read(MAX_ADAPTER_CONFIG_BYTES)
            name, config = parts[1], body
        elif len(parts) == 2 and rel.endswith(".tar.gz"):  # read through the strict reader, as validation was
            packed = scan_source(f"s3://{served.bucket}/{served.key}{rel}", s3).small_files.get("adapter_config.json")
            if packed is None:
                continue
            name, config = parts[1].removesuffix(".tar.gz"), packed
        else:
            continue
        folder = model / parts[0] / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "adapter_config.json").write_bytes(config)
        found.append(folder)
    return found


def _first_refusal(lines: list[dict[str, object]], adapters: list[Path]) -> dict[str, object]:
    """One verdict for a base and its adapters: the first that is not `loads` (an adapter's named), else
    the base's (its cache layout), else the adapter's."""
    for line in lines:
        if line.get("verdict") != "loads":
            where = str(line.get("directory", ""))
            named = next((a for a in adapters if where.endswith(str(a))), None)
            if named is not None and named.name != "model":
                return {**line, "message": f"the adapter {named.name}: {line.get('message', '')}"}
            return line
    return lines[0]


def raise_if_refused(check: EngineCheck) -> None:
    """The rule `validate` applies (engine_refusal): a refusal, or weights the engine would serve
    uninitialised, ends the deployment before any endpoint in the engine's own words; a check that died
    is EngineCheckFailed: a checkpoint that was not judged does not pass."""
    if check.verdict == "failed":
        raise EngineCheckFailed(f"{check.judged_for}: {check.message[:1500]}")
    refusal = engine_refusal(check)
    if refusal is not None:
        raise CheckpointRefused(
            f"{refusal.code}: {check.judged_for}'s own code refuses the checkpoint at its {check.stage} stage "
            f"(judged by vLLM {check.version}): {refusal.message[:1500]}",
            f"{refusal.hint} (`modeldrop validate DIR` shows the same verdict locally)",
        )
