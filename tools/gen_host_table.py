"""Generate src/modeldrop/serving/data/inference_amis.json from botocore's SageMaker service model
(run: python tools/gen_host_table.py; --check exits 1 when the committed file differs).

The AMI versions SageMaker hosting accepts for ProductionVariant.InferenceAmiVersion, with each one's
NVIDIA driver and CUDA version, are documented in the model itself (the shape's documentation): the
reference, read here rather than copied by hand. A contract test runs --check.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import botocore
import botocore.session

OUT = Path(__file__).resolve().parents[1] / "src" / "modeldrop" / "serving" / "data" / "inference_amis.json"
_ENTRY = re.compile(r"<dt>(?P<name>[a-z0-9-]+)</dt>\s*<dd>(?P<body>.*?)</dd>", re.S)


def amis() -> dict[str, dict[str, object]]:
    model = botocore.session.get_session().get_service_model("sagemaker")
    shape = model.shape_for("ProductionVariant").members["InferenceAmiVersion"]
    enum = list(shape.enum)
    table: dict[str, dict[str, object]] = {}
    for match in _ENTRY.finditer(shape.documentation):
        body = re.sub(r"<[^>]+>", " ", match["body"])
        driver = re.search(r"NVIDIA driver version:\s*(\d+)", body)
        cuda = re.search(r"CUDA version:\s*(\d+\.\d+)", body)
        if match["name"] in enum and driver and cuda:
            table[match["name"]] = {"nvidia_driver": int(driver[1]), "cuda": cuda[1]}
    return dict(sorted(table.items()))


def render() -> str:
    document = {
        "_provenance": (
            "botocore's SageMaker service model: ProductionVariant.InferenceAmiVersion (enum and documentation); "
            "regenerate with tools/gen_host_table.py"
        ),
        "_botocore_version": botocore.__version__,
        "amis": amis(),
    }
    return json.dumps(document, indent=2) + "\n"


def committed_amis() -> dict[str, object]:
    return dict(json.loads(OUT.read_text())["amis"])


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if committed_amis() == amis() else 1)
    OUT.write_text(render())
    print(f"wrote {OUT}")
