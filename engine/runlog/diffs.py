"""The SQL of run diffs (engine/probes/diff.py): what a side of a diff reads from the log,
and where a diff's patch runs are written.

A diff's rows live in their own tables, created IF NOT EXISTS when a diff first writes,
so that logs written before diffs existed need no schema upgrade and the runs' own
activations (`node_outputs`, `losses`) never receive a patched output:

- `diffs`: one row per example a diff looked at (scores on both sides, the source
  changes, the smallest explaining set, its patched score);
- `diff_patches`: one row per patch tried (the nodes patched from A into B, the score B
  then gets, the outputs it re-computed, the calls it made).

Model calls of a diff are `llm_calls` rows with purpose `diff` under run B's id.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.events import Activation
from engine.runlog.schema import RunLogError, check_readable, connect, user_tables, write
from engine.runlog.snapshot import run_snapshot
from engine.runlog.writer import insert_rows

if TYPE_CHECKING:  # pandas only where a diff is read (a command that only writes, as
    import pandas as pd  # import-traces, never loads it)

DIFF_TABLES: dict[str, str] = {
    "diffs": """diff_id VARCHAR, run_a VARCHAR, step_a INTEGER, run_b VARCHAR,
        step_b INTEGER, split VARCHAR, example_id VARCHAR, score_a DOUBLE, score_b DOUBLE,
        sources JSON, explained_by JSON, patched_score DOUBLE, tried INTEGER,
        created_at DOUBLE""",
    "diff_patches": """diff_id VARCHAR, example_id VARCHAR, nodes JSON, score DOUBLE,
        prediction VARCHAR, outputs JSON, call_ids JSON, error VARCHAR""",
}


def _columns(table: str) -> list[str]:
    return [part.split()[0] for part in " ".join(DIFF_TABLES[table].split()).split(", ")]


@dataclass
class RunSide:
    """One side of a diff as the log has it: a run's settings, graph, examples, and the
    prompts in effect after `step` (the versions accepted at that step or before)."""

    run_id: str
    step: int
    config: dict[str, Any]
    graph_yaml: str
    examples: list[tuple[str, str, dict, str]]  # (split, example_id, fields, target)
    prompts: dict[str, tuple[int, str]]  # node_id -> (version, text), accepted through step
    backend: str = ""  # the forward calls' backend and model, as the runs row records them
    model: str = ""


def load_side(db: str | Path, run_id: str, step: int | None) -> RunSide:
    """Run `run_id` after `step` (default: its last complete step)."""
    check_readable(db)
    with connect(db, read_only=True) as con:
        snap = run_snapshot(con, run_id)
    if snap is None:
        raise RunLogError(f"{db}: no run '{run_id}' (see: python -m engine runs --db {db})")
    steps = snap.steps
    if not steps:
        raise RunLogError(f"run '{run_id}' has no complete step yet")
    if step is None:
        step = steps[-1]
    if step not in steps:
        raise RunLogError(f"run '{run_id}' has no complete step {step} "
                          f"(steps {steps[0]}..{steps[-1]})")
    return RunSide(run_id, step, snap.config, snap.graph_yaml, snap.examples,
                   snap.prompts(step), snap.backend, snap.model)


def run_costs(db: str | Path, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """Each run's own calls (diffs and probes left out): calls, model calls, tokens and the
    summed latency in seconds."""
    with connect(db, read_only=True) as con:
        rows = con.execute("""
            SELECT run_id, count(*), count(*) FILTER (WHERE NOT coalesce(cache_hit, false)),
                   coalesce(sum(prompt_tokens + completion_tokens), 0),
                   coalesce(sum(latency_ms), 0) / 1000.0,
                   max(started_at) - min(started_at)
            FROM llm_calls WHERE run_id IN (SELECT unnest(?)) AND purpose NOT IN ('diff', 'probe')
            GROUP BY run_id""", [list(dict.fromkeys(run_ids))]).fetchall()
        spans = {r[0]: (r[1], r[2]) for r in con.execute(
            "SELECT run_id, started_at, ended_at FROM runs WHERE run_id IN (SELECT unnest(?))",
            [list(dict.fromkeys(run_ids))]).fetchall()}
    costs = {}
    for run_id, calls, model_calls, tokens, latency, _ in rows:
        start, end = spans.get(run_id, (None, None))
        costs[run_id] = {"calls": calls, "model_calls": model_calls, "tokens": tokens,
                         "call_seconds": latency,
                         "seconds": (end - start) if start and end else None}
    return costs


def save_diff(db: str | Path, calls: list[dict], diffs: list[dict], patches: list[dict],
              cache_rows: list[dict]) -> None:
    """Write a diff's calls, rows and new cache entries in one transaction (retried while a
    running run holds the file)."""
    def body(con: Any) -> None:
        for name, columns in DIFF_TABLES.items():
            con.execute(f"CREATE TABLE IF NOT EXISTS {name} ({columns})")
        insert_rows(con, "llm_calls", calls)
        insert_rows(con, "diffs", diffs, _columns("diffs"))
        insert_rows(con, "diff_patches", patches, _columns("diff_patches"))
        insert_rows(con, "llm_cache", cache_rows)

    write(db, body)


def _has_diffs(con: Any) -> bool:
    return "diffs" in user_tables(con)


def diff_rows(db: str | Path, run_a: str | None = None, run_b: str | None = None
              ) -> pd.DataFrame:
    """Logged diff rows, newest first (empty when no diff was ever run on this log)."""
    import pandas as pd

    with connect(db, read_only=True) as con:
        if not _has_diffs(con):
            return pd.DataFrame(columns=_columns("diffs"))
        where, params = [], []
        for column, value in (("run_a", run_a), ("run_b", run_b)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        sql = "SELECT * FROM diffs" + (" WHERE " + " AND ".join(where) if where else "")
        return con.execute(sql + " ORDER BY created_at DESC, example_id", params).df()


def diff_patch_rows(db: str | Path, diff_id: str) -> pd.DataFrame:
    """The patches one diff tried."""
    import pandas as pd

    with connect(db, read_only=True) as con:
        if not _has_diffs(con):
            return pd.DataFrame(columns=_columns("diff_patches"))
        return con.execute("SELECT * FROM diff_patches WHERE diff_id = ? ORDER BY example_id",
                           [diff_id]).df()


@dataclass
class LoggedExample:
    """One example's logged trace whose every node ran with the wanted prompt versions."""

    step: int
    split: str
    activations: dict[str, Activation]
    score: float | None
    prediction: str


def logged_traces(db: str | Path, run_id: str, versions: dict[str, int],
                  example_ids: list[str]) -> dict[str, LoggedExample]:
    """Per example, the latest logged trace (any step, any split) in which every node ran
    with `versions` and that was scored; examples without one are left out. One query for
    all examples (a diff reads dozens)."""
    with connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT example_id, step, split, node_id, prompt_version, input_text, output_text, "
            "error, raw_text, parse_error, call_id FROM node_outputs WHERE run_id = ? AND "
            "example_id IN (SELECT unnest(?)) ORDER BY step DESC",
            [run_id, list(example_ids)]).fetchall()
        losses = {(r[0], r[1], r[2]): (r[3], r[4]) for r in con.execute(
            "SELECT example_id, step, split, score, prediction FROM losses WHERE run_id = ? "
            "AND example_id IN (SELECT unnest(?))", [run_id, list(example_ids)]).fetchall()}
    groups: dict[tuple[str, int, str], dict[str, Activation]] = {}
    for r in rows:
        groups.setdefault((r[0], r[1], r[2]), {})[r[3]] = Activation(
            run_id, r[1], r[2], r[0], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10])
    found: dict[str, LoggedExample] = {}
    for (example_id, step, split), acts in groups.items():  # latest step first
        if example_id in found or (example_id, step, split) not in losses:
            continue
        if set(acts) == set(versions) and all(acts[n].prompt_version == v
                                              for n, v in versions.items()):
            score, prediction = losses[(example_id, step, split)]
            found[example_id] = LoggedExample(step, split, acts, score, prediction)
    return found
