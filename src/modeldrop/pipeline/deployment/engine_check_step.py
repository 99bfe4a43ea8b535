"""EngineCheck, between ResolveImage and BuildEngineEnv: the resolved image's engine judges the served
copy before any GPU is paid for.

What the engine reads is rebuilt from what validation reads (the side files and every safetensors
header, by ranged GET from the served prefix): a skeleton directory whose shards hold their real
headers and sparse zeros where the tensor bytes were. engine_probe never reads a weight byte, so the
skeleton is judged as the checkpoint would be, at the cost of the headers. A refusal ends the
deployment as CheckpointRefused with the engine's own words; where no engine can run here (a stack
whose function carries none, an SGLang image, a model class this CPU venv cannot import) the step
says so and the static verdict stands — never a silent pass.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from modeldrop.checkpoint.archive.artifact_scan import scan_source
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.engine.engine_check import EngineCheck, engine_check, engine_python
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.errors import CheckpointRefused
from modeldrop.contracts.step_payloads import Engine
from modeldrop.serving.engine_options import resolved_version

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from modeldrop.aws.dynamodb.registry import Registry

ENABLED_ENV = "MODELDROP_ENGINE_CHECK"  # the stack's EngineCheck parameter: Enabled | Disabled


def write_skeleton(scan: ArtifactScan, out: Path) -> Path:
    """OUT holding SCAN's side files and, per shard, its header followed by sparse zeros (no bytes written
    for the tensors: the file only claims their length)."""
    out.mkdir(parents=True, exist_ok=True)
    for rel, data in scan.small_files.items():
        if "/" not in rel:
            (out / rel).write_bytes(data)
    for rel, header in scan.headers.items():
        if "/" in rel:
            continue
        entries: dict[str, object] = {"__metadata__": header.metadata} if header.metadata else {}
        for name, info in header.tensors.items():
            entries[name] = {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [info.begin, info.end]}
        raw = json.dumps(entries, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        with (out / rel).open("wb") as fh:
            fh.write(len(raw).to_bytes(8, "little") + raw)
            fh.truncate(8 + len(raw) + header.data_len)
    return out


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
        return engine_check(write_skeleton(scan, Path(tmp) / "model"), target, python)


def raise_if_refused(check: EngineCheck) -> None:
    """A refusal ends the deployment before any endpoint, in the engine's own words."""
    if check.verdict == "refused":
        raise CheckpointRefused(
            f"ENGINE_REFUSED: {check.judged_for}'s own code refuses the checkpoint at its {check.stage} stage "
            f"(judged by vLLM {check.version}): {check.message[:1500]}",
            "fix what the engine names (`modeldrop validate DIR --engine-check` shows the same verdict locally)",
        )
