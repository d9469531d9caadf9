"""A run as its rows have it (`RunSnapshot`): settings, graph, complete steps, examples
and accepted prompt versions, read in one place for what starts from a logged run (a
probe, a diff)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass
class RunSnapshot:
    """A run as its rows have it: what a probe and a diff start from (one loader)."""

    run_id: str
    config: dict[str, Any]
    graph_yaml: str
    backend: str  # the forward calls' backend and model, as the runs row records them
    model: str
    steps: list[int]  # its complete steps
    examples: list[tuple[str, str, dict, str]]  # (split, example_id, fields, target)
    # the accepted prompt versions, in the order written: (node_id, version, prompt, step)
    versions: list[tuple[str, int, str, int]]

    def prompts(self, through: int) -> dict[str, tuple[int, str]]:
        """node_id -> (version, text) in effect after step `through`."""
        out: dict[str, tuple[int, str]] = {}
        for node_id, version, prompt, step in self.versions:
            if step <= through:
                out[node_id] = (version, prompt)
        return out


def run_snapshot(con: Any, run_id: str) -> RunSnapshot | None:
    """The run's snapshot on an open connection; None when there is no such run."""
    run = con.execute("SELECT config, graph_yaml, backend, model FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    if run is None:
        return None
    steps = [r[0] for r in con.execute("SELECT step FROM steps WHERE run_id = ? ORDER BY step",
                                       [run_id]).fetchall()]
    examples = [(r[0], r[1], json.loads(r[2]), r[3]) for r in con.execute(
        "SELECT split, example_id, fields, target FROM examples WHERE run_id = ? "
        "ORDER BY split, position", [run_id]).fetchall()]
    versions = [tuple(r) for r in con.execute(
        "SELECT node_id, version, prompt, step FROM prompt_versions WHERE run_id = ? AND "
        "accepted ORDER BY step, version", [run_id]).fetchall()]
    return RunSnapshot(run_id, json.loads(run[0]), run[1], run[2] or "", run[3] or "", steps,
                       examples, versions)
