"""`experiment PLAN --parallel N`: runs at once in one process under one shared concurrency
limit, with the same results as one at a time."""

from __future__ import annotations

import csv
import json

import duckdb

from tests.test_experiment import SMOKE, experiment, smoke_args


def results(out) -> list[dict]:
    with open(out / "results.csv", newline="") as fh:
        return [{k: v for k, v in row.items() if k != "run_ids"} for row in csv.DictReader(fh)]


def runs(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT run_id, started_at, ended_at, status FROM runs "
                           "ORDER BY run_id").fetchall()


def scores(db) -> dict[str, list]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("""
            SELECT r.run_id, s.step, s.train_score, s.val_score, s.accepted
            FROM runs r JOIN steps s USING (run_id) ORDER BY r.run_id, s.step""").fetchall()
    by_cell: dict[str, list] = {}
    for run_id, *rest in rows:
        by_cell.setdefault(run_id.rsplit(".", 2)[0], []).append(rest)
    return by_cell


def test_parallel_runs_overlap_and_give_the_same_results(tmp_path):
    assert SMOKE.is_file()
    outcome = {}
    for n in (1, 4):
        db, out = tmp_path / f"p{n}.duckdb", tmp_path / f"out{n}"
        code, _, stderr = experiment(*smoke_args(db, out, "--yes", "--parallel", str(n)))
        assert code == 0, stderr
        outcome[n] = (results(out), scores(db), runs(db))
    assert outcome[1][0] == outcome[4][0]  # the results table, row for row
    assert outcome[1][1] == outcome[4][1]  # every step's scores, run for run
    assert len(outcome[4][2]) == 14 and all(r[3] == "finished" for r in outcome[4][2])

    def overlapping(rows):
        spans = sorted((start, end) for _, start, end, _ in rows)
        return sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])

    assert overlapping(outcome[1][2]) == 0
    assert overlapping(outcome[4][2]) >= 3
    assert json.dumps(outcome[4][0])  # plain rows
