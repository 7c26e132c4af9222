"""The layout rules, read from the source's imports (TYPE_CHECKING and function-level ones too):
packages talk through public faces, product and bench/ import nothing from tests/, and no
module imports itself back through others."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("common", "gateway", "backends", "loadtest", "loadreport", "loadgen", "zerogap")
OURS = (*PRODUCT, "bench", "tests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(*packages: str) -> dict[str, Path]:
    return {module_name(p): p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))}


KNOWN = modules(*OURS)


def imports(name: str, path: Path) -> Iterator[str]:
    """The modules of ours that `name` imports (a `from a import b` names a.b when b is a module)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in KNOWN else base for a in node.names]
        else:
            continue
        for target in targets:
            if target.split(".")[0] in OURS:
                yield target


def graph(*packages: str) -> dict[str, set[str]]:
    return {name: set(imports(name, path)) for name, path in modules(*packages).items()}


def test_no_package_reaches_into_another_packages_private_modules() -> None:
    bad = []
    for name, targets in graph(*PRODUCT, "bench").items():
        for target in targets:
            top = target.split(".")[0]
            private = any(part.startswith("_") and part != "__init__" for part in target.split(".")[1:])
            if private and top != name.split(".")[0]:
                bad.append(f"{name} imports {target}")
    assert not bad, "use the package's public face (its __init__) instead:\n" + "\n".join(bad)


def test_product_and_bench_import_nothing_from_tests() -> None:
    bad = [f"{n} imports {t}" for n, ts in graph(*PRODUCT, "bench").items() for t in ts if t.split(".")[0] == "tests"]
    assert not bad, "\n".join(bad)


def test_nothing_imports_conftest() -> None:
    """conftest.py holds fixtures; importing it as a module runs it twice under two names."""
    bad = [f"{n} imports {t}" for n, ts in graph(*OURS).items() for t in ts if t.endswith("conftest")]
    assert not bad, "import plain helpers from tests/support.py instead:\n" + "\n".join(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    edges = graph(*PRODUCT, "bench")
    for name in edges:  # a package's own __init__ re-exporting its modules is its face, not a cycle
        edges[name] = {t for t in edges[name] if not (name.startswith(t + ".") and KNOWN[t].name == "__init__.py")}
    assert not cycles(edges), cycles(edges)


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


# Two layers at the top: common/ is the ground (config, ports and readiness, Prometheus text, argument types,
# the `zerogap` child command, the HTML page shell, an OpenAI request's rules, process groups, the supervisor of
# child processes), shared by every package and importing none of ours; zerogap/ is the roof (the dispatcher,
# demo, tune, running Locust), which may import anything and which nothing imports.
BELOW_THE_ROOF = ("common", "gateway", "backends", "loadtest", "loadreport", "loadgen")


def layer_breaches(edges: dict[str, set[str]]) -> list[str]:
    """common importing anything of ours but common; a package below the roof importing zerogap."""
    bad = []
    for name, targets in sorted(edges.items()):
        top = name.split(".")[0]
        if top == "common":
            bad += [f"the ground's {name} imports {t}" for t in sorted(targets) if t.split(".")[0] != "common"]
        elif top in BELOW_THE_ROOF:
            bad += [f"{name} imports the roof's {t}" for t in sorted(targets) if t.split(".")[0] == "zerogap"]
    return bad


def test_the_ground_imports_only_the_ground_and_nothing_below_the_roof_imports_the_roof() -> None:
    bad = layer_breaches(graph(*PRODUCT))
    assert not bad, "move the piece both need into common/ (the ground):\n" + "\n".join(bad)


def test_the_layer_rule_finds_each_breach() -> None:
    edges = {
        "common.net": {"common.config.model", "gateway.app"},
        "common.config.model": {"zerogap.tune.trial"},
        "gateway.app": {"common.config", "zerogap.cli"},
        "loadreport.report": {"common.html_page", "common"},
        "zerogap.tune.cli": {"gateway", "loadtest", "zerogap.demo"},
    }
    assert layer_breaches(edges) == [
        "the ground's common.config.model imports zerogap.tune.trial",
        "the ground's common.net imports gateway.app",
        "gateway.app imports the roof's zerogap.cli",
    ]


def top_folder_edges(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which top folder imports which (a folder's imports of itself left out)."""
    tops: dict[str, set[str]] = {}
    for name, targets in edges.items():
        top = name.split(".")[0]
        tops.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return tops


def test_no_loop_between_top_folders() -> None:
    """The product's top folders form no loop (common below all, zerogap above all, the load test's three in a row)."""
    tops = top_folder_edges(graph(*PRODUCT))
    assert not cycles(tops), f"top folders in a loop: {cycles(tops)}; edges: {tops}"


def test_the_top_folder_rule_finds_a_loop() -> None:
    tops = top_folder_edges({"gateway.app": {"common.net"}, "common.net": {"gateway.pool.health"}, "common.x": set()})
    assert cycles(tops) == [["common", "gateway"]]


def builds_zerogap_command(path: Path) -> bool:
    """The module spells out [sys.executable, "-m", "zerogap", ...] itself."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.List) and len(node.elts) >= 3:
            first, *rest = node.elts[:3]
            spelled = [e.value for e in rest if isinstance(e, ast.Constant)]
            if ast.unparse(first) == "sys.executable" and spelled == ["-m", "zerogap"]:
                return True
    return False


def test_product_code_runs_zerogap_children_through_zerogap_command() -> None:
    found = {name for name, path in modules(*PRODUCT).items() if builds_zerogap_command(path)} - {"common.commands"}
    assert not found, f"use common.commands.zerogap_command(*args) in {sorted(found)}"


# The load test is three packages: loadtest/ (the locustfile folder and the public face), loadreport/ (the
# report side, light) and loadgen/ (the live run under Locust and gevent). loadreport imports neither of the
# others; the rest of the product imports the load test through `loadtest`, or reads reports through
# `loadreport`'s own face (its __init__), never its modules.
LOAD_TEST = ("loadtest", "loadreport", "loadgen")
LIGHT = ("loadtest", "loadgen", *modules("loadreport"))  # what reads and renders reports, and the faces


def load_test_breaches(edges: dict[str, set[str]]) -> list[str]:
    """loadreport importing loadgen or loadtest; a package outside the load test importing loadgen, or
    loadreport's modules rather than its face."""
    bad = []
    for name, targets in sorted(edges.items()):
        top = name.split(".")[0]
        for target in sorted(targets):
            reached = target.split(".")[0]
            if top == "loadreport" and reached in ("loadgen", "loadtest"):
                bad.append(f"the report side's {name} imports {target}")
            elif top not in LOAD_TEST and reached in ("loadreport", "loadgen") and target != "loadreport":
                bad.append(f"{name} imports {target} (import it from loadtest)")
    return bad


def test_the_report_side_imports_no_live_side_and_others_use_loadtests_face() -> None:
    bad = load_test_breaches(graph(*PRODUCT, "bench"))
    assert not bad, "\n".join(bad)


def test_the_load_test_rule_finds_each_breach() -> None:
    edges = {
        "loadreport.summary": {"loadgen.run", "loadreport.plan"},
        "loadreport.report": {"loadtest"},
        "loadgen.harness": {"loadreport.report", "loadgen.client"},
        "zerogap.tune.runner": {"loadreport.diagnosis", "loadtest"},
        "backends.sim.calibrate.runs": {"loadreport"},
        "loadtest": {"loadreport.report", "loadgen.workload"},
    }
    assert load_test_breaches(edges) == [
        "the report side's loadreport.report imports loadtest",
        "the report side's loadreport.summary imports loadgen.run",
        "zerogap.tune.runner imports loadreport.diagnosis (import it from loadtest)",
    ]


HEAVY = ("gevent", "locust", "matplotlib")


def _heavy_after_importing(name: str) -> list[str]:
    """The heavy packages a fresh interpreter holds after importing name (and nothing else of ours)."""
    script = (
        f"import importlib, json, sys; importlib.import_module({name!r}); "
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found: list[str] = json.loads(done.stdout)
    return found


def test_reading_reports_imports_no_load_generator_and_no_plotting_library() -> None:
    """One fresh interpreter per module (one module's imports would hide another's): importing it loads
    none of gevent, Locust or matplotlib."""
    heavy = {name: found for name in LIGHT if (found := _heavy_after_importing(name))}
    assert not heavy, f"import these lazily, inside the functions that need them: {heavy}"
