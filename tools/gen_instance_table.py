"""Refresh the EC2 facts of src/modeldrop/serving/data/instances.json from EC2 DescribeInstanceTypes
(run: python tools/gen_instance_table.py [--live]; --check exits 1 when the committed file differs).

Per type: the GPU's name, count and memory (`GpuInfo`), vCPUs and RAM. Without --live the answer
is moto's: its DescribeInstanceTypes serves AWS's own recorded answer (moto/ec2/resources), so the
table is generated offline and a contract test runs --check; --live asks the account's EC2 (any
region that offers the types). What EC2 does not say stays as written: the usable memory the CUDA
runtime reports (`gpu_gib`, measured) and prices (no Price List API here).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import boto3

OUT = Path(__file__).resolve().parents[1] / "src" / "modeldrop" / "serving" / "data" / "instances.json"
FIELDS = ("gpu", "gpus", "gpu_mib", "vcpu", "ram_gib")


def _describe(names: list[str]) -> list[dict[str, Any]]:
    ec2 = boto3.client("ec2", region_name=os.environ.get("AWS_REGION", "us-east-1"))
    found: list[dict[str, Any]] = []
    for start in range(0, len(names), 100):  # the API takes at most 100 names
        found += ec2.describe_instance_types(InstanceTypes=names[start : start + 100])["InstanceTypes"]
    return found


def ec2_facts(instance_types: list[str], live: bool = False) -> dict[str, dict[str, Any]]:
    """FIELDS of each SageMaker INSTANCE_TYPES (ml.X) from DescribeInstanceTypes of X."""
    names = sorted(t.removeprefix("ml.") for t in instance_types)
    if live:
        answer = _describe(names)
    else:
        from moto import mock_aws

        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        with mock_aws():
            answer = _describe(names)
    facts: dict[str, dict[str, Any]] = {}
    for item in answer:
        gpus = item["GpuInfo"]["Gpus"]
        if len(gpus) != 1:
            raise SystemExit(f"{item['InstanceType']}: {len(gpus)} GPU kinds; the table holds one")
        facts["ml." + item["InstanceType"]] = {
            "gpu": gpus[0]["Name"],
            "gpus": gpus[0]["Count"],
            "gpu_mib": gpus[0]["MemoryInfo"]["SizeInMiB"],
            "vcpu": item["VCpuInfo"]["DefaultVCpus"],
            "ram_gib": item["MemoryInfo"]["SizeInMiB"] // 1024,
        }
    missing = set(instance_types) - set(facts)
    if missing:
        raise SystemExit(f"EC2 does not describe {sorted(missing)}")
    return facts


def committed() -> dict[str, Any]:
    return dict(json.loads(OUT.read_text()))


def render(document: dict[str, Any], facts: dict[str, dict[str, Any]]) -> str:
    head = {k: v for k, v in document.items() if k != "instances"}
    lines = []
    for name, spec in document["instances"].items():
        merged = {**spec, **facts[name]}
        ordered = {k: merged[k] for k in (*FIELDS, "gpu_gib", "price")}
        lines.append(f"    {json.dumps(name)}: {json.dumps(ordered)}")
    body = json.dumps(head, indent=2)[:-2]
    return body + ',\n  "instances": {\n' + ",\n".join(lines) + "\n  }\n}\n"


def differences(document: dict[str, Any], facts: dict[str, dict[str, Any]]) -> list[str]:
    return [
        f"{name}.{key}: {spec.get(key)!r} != EC2's {facts[name][key]!r}"
        for name, spec in document["instances"].items()
        for key in FIELDS
        if spec.get(key) != facts[name][key]
    ]


if __name__ == "__main__":
    document = committed()
    facts = ec2_facts(list(document["instances"]), live="--live" in sys.argv)
    if "--check" in sys.argv:
        problems = differences(document, facts)
        print("\n".join(problems) or "instances.json agrees with EC2")
        sys.exit(1 if problems else 0)
    OUT.write_text(render(document, facts))
    print(f"wrote {OUT}")
