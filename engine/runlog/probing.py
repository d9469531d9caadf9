"""Queries of `blame` (engine/probes/blame.py): which steps to pool, and what became of
each proposal."""

from __future__ import annotations

from pathlib import Path

from engine.runlog.schema import connect


def backward_steps(db: str | Path, run_id: str) -> list[int]:
    """Complete steps that ran a backward pass (step 0 is the initial evaluation)."""
    with connect(db, read_only=True) as con:
        return [r[0] for r in con.execute(
            "SELECT step FROM steps WHERE run_id = ? AND step > 0 ORDER BY step",
            [run_id]).fetchall()]


def step_proposal(db: str | Path, run_id: str, step: int, node_id: str
                  ) -> tuple[str, str, str] | None:
    """(old prompt, new prompt, reject reason) of the node's update at the step."""
    with connect(db, read_only=True) as con:
        row = con.execute("SELECT old_prompt, new_prompt, reject_reason FROM updates WHERE "
                          "run_id = ? AND step = ? AND node_id = ?",
                          [run_id, step, node_id]).fetchone()
    return None if row is None else (row[0] or "", row[1] or "", row[2] or "")
