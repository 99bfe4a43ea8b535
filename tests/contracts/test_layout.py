"""The code's shape: no import circles, no module over the size a reader holds at once, no function
of complexity D or worse (radon's grades: D from 21 decision points)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "modeldrop"
MAX_LINES = 450
MAX_COMPLEXITY = 20  # radon's C ends at 20


def _imports() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        module = ".".join(path.relative_to(SRC.parent).with_suffix("").parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("modeldrop"):
                deps |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("modeldrop")}
        graph[module] = deps
    # A package's own __init__ importing its modules is how packages work, not a circle.
    return {m: {d for d in deps if d in graph and d != m and not m.startswith(d + ".")} for m, deps in graph.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles() -> None:
    assert _circles(_imports()) == []


def test_the_circle_finder_finds_one() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_no_module_is_over_the_limit() -> None:
    over = {
        str(p.relative_to(ROOT)): n
        for p in [*SRC.rglob("*.py"), *(ROOT / "functions").rglob("*.py")]
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert over == {}


def test_no_function_of_complexity_d_or_worse() -> None:
    from radon.complexity import cc_visit

    worse = {
        f"{p.relative_to(ROOT)}:{block.lineno} {block.name}": block.complexity
        for p in [*SRC.rglob("*.py"), *(ROOT / "functions").rglob("*.py")]
        for block in cc_visit(p.read_text())
        if block.complexity > MAX_COMPLEXITY
    }
    assert worse == {}


def test_the_reaper_imports_no_eval_or_template_code() -> None:
    """The reaper runs every few minutes with 256 MB: channel upkeep and adapter release stay light."""
    import subprocess
    import sys

    probe = (
        "import sys, modeldrop.pipeline.reaper; "
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'jinja2' or m.startswith('modeldrop.evaluation')]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# src/modeldrop/local, by what each part holds: what each may import of the others (nothing runs back
# up: the emulator never imports the stack built on it, nor the stack run-local's scenarios).
_EMULATED = {"emulator.s3", "emulator.stepfunctions", "emulator.iam", "emulator.sagemaker", "emulator.autoscaling"}
LOCAL_PARTS: dict[str, set[str]] = {
    "faults": set(),
    "samples": set(),
    "engines": set(),
    "emulator.s3": set(),
    "emulator.stepfunctions": set(),
    "emulator.iam": set(),
    "emulator.autoscaling": set(),  # asks the component shims through hooks they set
    "emulator.sagemaker": {"emulator.iam", "emulator.autoscaling", "engines", "faults"},  # publishes metrics to it
    "emulator": {*_EMULATED, "engines", "faults"},  # moto_shims: installs every service's patches
    "stack": {"emulator", *_EMULATED, "engines", "faults", "samples"},
    "scenarios": {"emulator", *_EMULATED, "engines", "faults", "samples", "stack"},
}


def _local_part(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["modeldrop", "local"] or len(parts) < 3:
        return None
    if parts[2] == "emulator" and len(parts) > 3 and f"emulator.{parts[3]}" in LOCAL_PARTS:
        return f"emulator.{parts[3]}"
    return parts[2]


def _back_edges(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, deps in graph.items():
        here = _local_part(module)
        for dep in deps:
            there = _local_part(dep)
            if here and there and there != here and there not in LOCAL_PARTS.get(here, set()):
                wrong.append(f"{module} -> {dep}")
    return sorted(wrong)


def test_local_parts_import_only_what_lies_below_them() -> None:
    graph = _imports()
    unknown = sorted({p for m in graph if (p := _local_part(m)) and p not in LOCAL_PARTS})
    assert unknown == [], "a new part of modeldrop.local: place it in LOCAL_PARTS and local/__init__.py"
    assert _back_edges(graph) == []


def test_the_back_edge_finder_finds_one() -> None:
    graph = {"modeldrop.local.emulator.sagemaker.hosting": {"modeldrop.local.stack.build"}}
    assert _back_edges(graph) == ["modeldrop.local.emulator.sagemaker.hosting -> modeldrop.local.stack.build"]


def test_every_part_of_local_opens_by_saying_what_it_holds() -> None:
    local = SRC / "local"
    silent = [
        str(p.relative_to(ROOT))
        for p in local.rglob("*.py")
        if p.name == "__init__.py" and not (ast.get_docstring(ast.parse(p.read_text())) or "").strip()
    ]
    assert silent == []
    assert sorted(p.name for p in local.glob("*.py")) == ["__init__.py", "faults.py"]
