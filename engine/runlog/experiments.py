"""The queries of the experiment harness: finished runs to reuse, and per-run metrics for
the results table."""

from __future__ import annotations

import json
from pathlib import Path

from engine.runlog.schema import check_readable, connect, log_exists


def finished_experiment_runs(db: str | Path) -> list[dict]:
    """Finished runs whose id starts with `exp.`, newest first: run_id, config (parsed),
    model, optimizer_model, graph_yaml. None when the log does not exist yet."""
    if not log_exists(db):
        return []
    check_readable(db)
    with connect(db, read_only=True) as con:
        rows = con.execute("SELECT run_id, config, model, optimizer_model, graph_yaml FROM runs "
                           "WHERE starts_with(run_id, 'exp.') AND status = 'finished' "
                           "ORDER BY started_at DESC").fetchall()
    return [{"run_id": r[0], "config": json.loads(r[1]), "model": r[2],
             "optimizer_model": r[3], "graph_yaml": r[4]} for r in rows]


def run_metrics(db: str | Path, run_ids: list[str]) -> dict[str, dict]:
    """Per run: test score, last validation score (and the starting prompts', `val0`),
    steps, accepted edits, calls, tokens,
    cost, models; and the test examples behind the score: `test_n` scored, `test_sum` of
    their scores, `test_binary` when every score is 0 or 1 (a pass rate, so an interval)."""
    if not run_ids:
        return {}
    with connect(db, read_only=True) as con:
        cursor = con.execute("""
            SELECT r.run_id, r.model, r.optimizer_model, r.backend, t.test, s.steps, s.val,
                   s.val0,
                   coalesce(u.accepted, 0) AS accepted, coalesce(c.calls, 0) AS calls,
                   coalesce(c.tokens, 0) AS tokens, c.cost,
                   coalesce(tl.test_n, 0) AS test_n, tl.test_sum, tl.test_binary
            FROM runs r
            LEFT JOIN (SELECT run_id, max(value) AS test FROM metrics
                       WHERE key = 'test_score' GROUP BY run_id) t USING (run_id)
            LEFT JOIN (SELECT run_id, max(step) AS steps, arg_max(val_score, step) AS val,
                              arg_min(val_score, step) AS val0
                       FROM steps GROUP BY run_id) s USING (run_id)
            LEFT JOIN (SELECT run_id, count(*) FILTER (WHERE accepted) AS accepted
                       FROM updates GROUP BY run_id) u USING (run_id)
            LEFT JOIN (SELECT run_id, count(*) AS calls,
                              sum(prompt_tokens + completion_tokens) AS tokens,
                              sum(cost_usd) AS cost
                       FROM llm_calls GROUP BY run_id) c USING (run_id)
            LEFT JOIN (SELECT run_id, count(score) AS test_n, sum(score) AS test_sum,
                              bool_and(score IN (0, 1)) AS test_binary
                       FROM losses l WHERE split = 'test' AND step = (
                           SELECT max(step) FROM losses m
                           WHERE m.run_id = l.run_id AND m.split = 'test')
                       GROUP BY run_id) tl USING (run_id)
            WHERE list_contains(?, r.run_id)""", [run_ids])
        names = [d[0] for d in cursor.description]
        return {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}


def test_outcomes(db: str | Path, run_ids: list[str]) -> dict[str, dict[str, float]]:
    """Per run, each test example's score at the run's last scored test step: what a
    paired comparison of two runs on the same examples reads."""
    if not run_ids:
        return {}
    with connect(db, read_only=True) as con:
        rows = con.execute("""
            SELECT run_id, example_id, score FROM losses l
            WHERE split = 'test' AND score IS NOT NULL AND list_contains(?, run_id)
              AND step = (SELECT max(step) FROM losses m
                          WHERE m.run_id = l.run_id AND m.split = 'test')""",
                           [run_ids]).fetchall()
    outcomes: dict[str, dict[str, float]] = {r: {} for r in run_ids}
    for run_id, example_id, score in rows:
        outcomes[run_id][example_id] = float(score)
    return outcomes
