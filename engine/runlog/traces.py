"""Queries of imported traces (engine/traces): the failing examples a step scored, and the
run's settings rewritten when `backprop` is pointed at another server or model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.runlog.schema import connect


def failing_count(db: str | Path, run_id: str, step: int) -> int:
    """Training examples that scored below 1 without an error at `step`."""
    with connect(db, read_only=True) as con:
        return con.execute("SELECT count(*) FROM losses WHERE run_id = ? AND step = ? AND "
                           "split = 'train' AND score < 1 AND error IS NULL",
                           [run_id, step]).fetchall()[0][0]


def store_config(db: str | Path, run_id: str, config: dict[str, Any]) -> None:
    """Replace the run's recorded settings (`runs.config`): later probes and blame of the
    run read the server and model from there."""
    with connect(db) as con:
        con.execute("UPDATE runs SET config = ?, model = coalesce(?, model) WHERE run_id = ?",
                    [json.dumps(config, sort_keys=True), config.get("model"), run_id])
