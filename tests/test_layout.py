"""Module layout: the arrows the architecture asks for (issue 13). Every import statement
counts, also those inside functions and under TYPE_CHECKING."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[1] / "engine"


def imports_of(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_experiment_harness_never_imports_the_command_line():
    for path in sorted((ENGINE / "experiment").glob("*.py")):
        assert "engine.cli" not in imports_of(path), path.name


def test_cells_and_estimate_import_in_one_direction():
    cells = imports_of(ENGINE / "experiment" / "cells.py")
    assert not any(name.startswith("engine.experiment.estimate") for name in cells)
    assert "engine.experiment.cells" in imports_of(ENGINE / "experiment" / "estimate.py")


def test_the_engine_core_never_imports_test_support_or_the_dashboard():
    for path in sorted(ENGINE.rglob("*.py")):
        names = imports_of(path)
        assert not any(n.startswith(("tests", "dashboard")) for n in names), path


def test_only_the_entry_points_import_the_command_line():
    # engine.cli wires subcommands together; a module it imports must not import it back.
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name != "__main__.py" and path.parent.name != "cli":
            names = imports_of(path)
            assert not any(n.startswith("engine.cli") for n in names), path.relative_to(ENGINE)


ROOT = ENGINE.parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the engine and dashboard modules it imports, counting every import
    statement (lazy ones inside functions and those under TYPE_CHECKING too)."""
    paths = sorted([*ENGINE.rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")])
    modules = {module_name(p): p for p in paths}
    edges: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
        edges[name] = {m for m in found if m in modules and m != name}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_among_engine_and_dashboard_modules():
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_a_lazy_import():
    edges = {"a": {"b"}, "b": set()}
    assert cycles(edges) == []
    edges["b"].add("a")
    assert cycles(edges) == [["a", "b"]]


def test_engine_root_keeps_only_the_packages_face():
    modules = sorted(p.name for p in ENGINE.glob("*.py"))
    extra = [m for m in modules if m not in ("__init__.py", "__main__.py")]
    assert len(extra) <= 4, extra


LAYERS = {  # a package may import only the packages listed for it (and itself)
    "engine.llm": {"engine.events", "engine.processes"},
    "engine.data": set(),
    "engine.prompts": {"engine.llm"},
    "engine.core": {"engine.events", "engine.llm", "engine.prompts", "engine.data"},
    "engine.runlog": {"engine.events", "engine.llm", "engine.core", "engine.prompts",
                      "engine.data"},
    # imported traces: a run is made with the run machinery; probes and the CLI sit above
    "engine.traces": {"engine.events", "engine.llm", "engine.core", "engine.prompts",
                      "engine.data", "engine.runlog", "engine.runs"},
    # the gateway re-runs a user's pipeline: it imports traces as a run and drives steps
    "engine.gateway": {"engine.events", "engine.llm", "engine.core", "engine.prompts",
                       "engine.data", "engine.runlog", "engine.runs", "engine.traces"},
}


def test_layers_import_only_downward():
    for module, imported in import_graph().items():
        for layer, allowed in LAYERS.items():
            if module == layer or module.startswith(layer + "."):
                for target in imported:
                    top = ".".join(target.split(".")[:2])
                    assert top in allowed | {layer, "engine"} or target == "engine", \
                        f"{module} imports {target}"


def test_no_private_name_is_imported_from_another_module():
    for path in sorted([*ENGINE.rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and \
                    node.module.startswith(("engine", "dashboard")):
                private = [a.name for a in node.names if a.name.startswith("_")
                           and not a.name.startswith("__")]
                assert not private, f"{path.relative_to(ROOT)} imports {private}"


def test_comments_say_why_instead_of_citing_issue_numbers():
    import re

    cites = re.compile(r"\bissues? #?\d+\b", re.I)
    for path in sorted(p for folder in ("engine", "dashboard", "tests", "benchmarks")
                       for p in (ROOT / folder).rglob("*.py")):
        if path.name == "test_layout.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not cites.search(line), f"{path.relative_to(ROOT)}:{number}: {line.strip()}"


SQL = __import__("re").compile(
    r"\bSELECT\b[\s\S]+\bFROM\b|\bINSERT\s+INTO\b|\bUPDATE\s+\w+\s+SET\b|\bDELETE\s+FROM\b|"
    r"\bCREATE\s+(TABLE|VIEW|INDEX)\b|\bALTER\s+TABLE\b")


def sql_strings(path: Path) -> list[str]:
    return [node.value for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and SQL.search(node.value)]


def test_no_file_outside_the_run_log_holds_sql():
    runlog = ENGINE / "runlog"
    for path in sorted([*ENGINE.rglob("*.py"), *(ROOT / "dashboard").rglob("*.py")]):
        if runlog not in path.parents:
            assert not sql_strings(path), f"{path.relative_to(ROOT)}: {sql_strings(path)[0]!r}"


def test_the_sql_check_sees_a_query():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write('q = ("SELECT step "\n     "FROM steps WHERE run_id = ?")\nlabel = "Select a run"\n')
    assert sql_strings(Path(fh.name)) == ["SELECT step FROM steps WHERE run_id = ?"]


def test_views_are_pure_and_widgets_draw():
    """dashboard/views/ turns rows into what a page shows: it imports no streamlit, starts
    no process and imports no widget or job; dashboard/widgets/ draws (docs/architecture.md)."""
    views = ROOT / "dashboard" / "views"
    for path in sorted(views.glob("*.py")):
        names = imports_of(path)
        assert not any(n == "streamlit" or n.startswith("streamlit.") for n in names), path.name
        assert not any(n.startswith(("subprocess", "dashboard.widgets", "dashboard.jobs",
                                     "dashboard.trace_jobs", "dashboard.screens"))
                       for n in names), path.name
        assert "dashboard.jobs" not in names and "dashboard" not in {
            n for n in names if n.endswith(".jobs")}, path.name
