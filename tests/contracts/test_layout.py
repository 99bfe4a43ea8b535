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
        "import sys, modeldrop.pipeline.reaper.reaper; "
        "heavy = [m for m in sys.modules if m.split('.')[0] == 'jinja2' or m.startswith('modeldrop.evaluation')]; "
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# Each package with parts, by what each part holds: what each may import of the others (nothing runs
# back up). "" is the package's own modules: in `local` they are below every part, in `checkpoint` they
# put the parts together (above them all), in `pipeline` and `aws` they are what every part shares.
_EMULATED = {"emulator.s3", "emulator.stepfunctions", "emulator.iam", "emulator.sagemaker", "emulator.autoscaling"}
_CHECKPOINT_PARTS = {"headers", "archive", "weights", "chat", "adapters", "engine"}
PARTS: dict[str, dict[str, set[str]]] = {
    "local": {
        "": set(),  # faults: data the emulator reads too
        "samples": set(),
        "engines": set(),
        "emulator.s3": set(),
        "emulator.stepfunctions": set(),
        "emulator.iam": set(),
        "emulator.autoscaling": set(),  # asks the component shims through hooks they set
        "emulator.sagemaker": {"emulator.iam", "emulator.autoscaling", "engines", ""},  # publishes metrics to it
        "emulator": {*_EMULATED, "engines", ""},  # moto_shims: installs every service's patches
        "stack": {"emulator", *_EMULATED, "engines", "", "samples"},
        "scenarios": {"emulator", *_EMULATED, "engines", "", "samples", "stack"},
    },
    "checkpoint": {
        "headers": set(),
        "archive": {"headers"},
        "weights": {"headers", "archive"},
        "chat": {"headers", "archive"},
        "adapters": {"headers", "archive", "chat"},
        "engine": {"weights", "archive"},  # each release's own lists; a skeleton from a scan
        "": _CHECKPOINT_PARTS,  # the checks, the report, validation and repair
    },
    "pipeline": {
        "": set(),  # settings, limits, the handlers' error contract, where reports go
        "adapters": {""},
        "deployment": {"", "adapters"},
        "channels": {"", "adapters", "deployment"},
        "reaper": {"", "deployment", "channels"},
    },
    "aws": {
        "": set(),  # clients, pages and the services of one module
        "sagemaker": {""},
        "s3": {""},
        "dynamodb": {""},
        "autoscaling": {""},
    },
}
# The packages of modeldrop, each importing only those before it: the ground floor imports nothing.
FLOORS = ["contracts", "serving", "checkpoint", "aws", "evaluation", "pipeline", "operate", "local", "cli"]


def _part(module: str) -> tuple[str, str] | None:
    """(package, part) of a module in a package with parts; "" for the package's own modules."""
    parts = module.split(".")
    if parts[0] != "modeldrop" or len(parts) < 3 or parts[1] not in PARTS:
        return None
    package, name = parts[1], parts[2]
    if not (SRC / package / name).is_dir():
        return package, ""
    if package == "local" and name == "emulator" and len(parts) > 3 and f"emulator.{parts[3]}" in PARTS["local"]:
        return package, f"emulator.{parts[3]}"
    return package, name


def _back_edges(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, deps in graph.items():
        here = _part(module)
        for dep in deps:
            there = _part(dep)
            same_package = here and there and here[0] == there[0] and there[1] != here[1]
            if same_package and there[1] not in PARTS[here[0]].get(here[1], set()):
                wrong.append(f"{module} -> {dep}")
    return sorted(wrong)


def _floor_breaches(graph: dict[str, set[str]]) -> list[str]:
    wrong = []
    for module, deps in graph.items():
        here = module.split(".")[1] if module.count(".") else None
        for dep in deps:
            there = dep.split(".")[1] if dep.count(".") else None
            if here in FLOORS and there in FLOORS and FLOORS.index(there) > FLOORS.index(here):
                wrong.append(f"{module} -> {dep}")
    return sorted(wrong)


def test_parts_import_only_what_lies_below_them() -> None:
    graph = _imports()
    unknown = sorted({f"{p[0]}.{p[1]}" for m in graph if (p := _part(m)) and p[1] not in PARTS[p[0]]})
    assert unknown == [], "a new part: place it in PARTS and in its package's __init__.py"
    assert _back_edges(graph) == []


def test_packages_import_only_the_floors_below_them() -> None:
    graph = _imports()
    assert sorted({m.split(".")[1] for m in graph if m.count(".")} - {*FLOORS, "__main__"}) == []
    assert _floor_breaches(graph) == []


def test_contracts_imports_nothing_else_of_modeldrop() -> None:
    graph = _imports()
    outside = sorted(
        f"{m} -> {d}" for m, deps in graph.items() if m.startswith("modeldrop.contracts") for d in deps
        if not d.startswith("modeldrop.contracts")
    )  # fmt: skip
    assert outside == []


def test_the_back_edge_finders_find_one() -> None:
    graph = {"modeldrop.local.emulator.sagemaker.hosting": {"modeldrop.local.stack.build"}}
    assert _back_edges(graph) == ["modeldrop.local.emulator.sagemaker.hosting -> modeldrop.local.stack.build"]
    graph = {"modeldrop.checkpoint.archive.tar_scan": {"modeldrop.checkpoint.weights.model_dims"}}
    assert _back_edges(graph) == ["modeldrop.checkpoint.archive.tar_scan -> modeldrop.checkpoint.weights.model_dims"]
    graph = {"modeldrop.pipeline.deployment.teardown": {"modeldrop.pipeline.channels.channel_close"}}
    assert _back_edges(graph) == ["modeldrop.pipeline.deployment.teardown -> modeldrop.pipeline.channels.channel_close"]
    graph = {"modeldrop.pipeline.config": {"modeldrop.pipeline.deployment.steps"}}
    assert _back_edges(graph) == ["modeldrop.pipeline.config -> modeldrop.pipeline.deployment.steps"]
    graph = {"modeldrop.contracts.channel": {"modeldrop.serving.idle_plan"}}
    assert _floor_breaches(graph) == ["modeldrop.contracts.channel -> modeldrop.serving.idle_plan"]


def test_every_part_opens_by_saying_what_it_holds() -> None:
    silent = [
        str(p.relative_to(ROOT))
        for package in PARTS
        for p in (SRC / package).rglob("__init__.py")
        if not (ast.get_docstring(ast.parse(p.read_text())) or "").strip()
    ]
    assert silent == []
    assert sorted(p.name for p in (SRC / "local").glob("*.py")) == ["__init__.py", "faults.py"]


def test_no_directory_holds_more_than_fifteen_modules() -> None:
    crowded = {
        str(d.relative_to(ROOT)): n
        for d in [SRC, *(p for p in SRC.rglob("*") if p.is_dir())]
        if (n := len(list(d.glob("*.py")))) > 15
    }
    assert crowded == {}
