"""Regenerate the published request grammars from the pydantic model: schemas/deployment-request.schema.json
(a direct start) and schemas/modeldrop-marker.schema.json (what a modeldrop.json marker may override).
`--check` fails when either file is stale. The starter and NormalizeRequest parse with the same model
in strict mode; tests/contracts/test_marker_grammar.py holds the two to the same verdicts.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from modeldrop.contracts.models import DeploymentRequest, GateThresholds
from modeldrop.pipeline.deployment.starter import MARKER_ONLY_BY_DIRECT_START

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
PATH = SCHEMAS / "deployment-request.schema.json"
MARKER_PATH = SCHEMAS / "modeldrop-marker.schema.json"
# Python's `$` also matches before a final newline; ECMA-262's does not. A pattern's end is stated so
# that both read it as the end of the string (pydantic's engine reads `$` so).
_END = r"(?![\s\S])"


def _ends(node: Any) -> Any:
    if isinstance(node, dict):
        out = {k: _ends(v) for k, v in node.items()}
        pattern = out.get("pattern")
        if isinstance(pattern, str) and pattern.endswith("$") and not pattern.endswith("\\$"):
            out["pattern"] = pattern[:-1] + _END
        return out
    if isinstance(node, list):
        return [_ends(v) for v in node]
    return node


def request_schema() -> dict[str, Any]:
    schema = _ends(DeploymentRequest.model_json_schema())
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "modeldrop/deployment-request.schema.json"
    return schema


def marker_schema() -> dict[str, Any]:
    """The request's grammar less what a marker may not set (where the artifact is and how it came, and
    the capabilities only a direct start has), its gate bounded by the defaults: tightened, never loosened."""
    schema = copy.deepcopy(request_schema())
    schema["$id"] = "modeldrop/modeldrop-marker.schema.json"
    schema["title"] = "ModeldropMarker"
    schema["description"] = (
        "A modeldrop.json marker: the overrides it may carry for the prefix it closes (UTF-8 JSON, one object)."
    )
    for name in ["artifact_uri", "source", *sorted(MARKER_ONLY_BY_DIRECT_START)]:
        schema["properties"].pop(name, None)
    schema.pop("required", None)
    gate = copy.deepcopy(schema["$defs"]["GateThresholds"])
    defaults = GateThresholds()
    for name, prop in gate["properties"].items():
        if name == "latency_slack_s":
            continue  # noise in seconds: bounded by the stack's MaxGateLatencySlack
        bound = "minimum" if name == "min_tokens_per_s_ratio" else "maximum"
        prop[bound] = getattr(defaults, name)
    gate["title"] = "MarkerGateThresholds"
    schema["$defs"]["MarkerGateThresholds"] = gate
    schema["properties"]["gate"] = {**schema["properties"]["gate"], "$ref": "#/$defs/MarkerGateThresholds"}
    return schema


def render(schema: dict[str, Any] | None = None) -> str:
    return json.dumps(schema or request_schema(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    wanted = {PATH: render(request_schema()), MARKER_PATH: render(marker_schema())}
    if "--check" in argv:
        stale = [str(p.name) for p, text in wanted.items() if not p.is_file() or p.read_text() != text]
        if stale:
            print(f"stale: {', '.join(stale)} (run `make schema`)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in wanted.items():
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
