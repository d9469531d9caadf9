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
