"""Regenerate schemas/deployment-request.schema.json from the pydantic model."""

from __future__ import annotations

import json
from pathlib import Path

from modeldrop.contracts.models import DeploymentRequest

PATH = Path(__file__).resolve().parent.parent / "schemas" / "deployment-request.schema.json"


def render() -> str:
    schema = DeploymentRequest.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "modeldrop/deployment-request.schema.json"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    PATH.write_text(render())
    print(f"wrote {PATH}")
