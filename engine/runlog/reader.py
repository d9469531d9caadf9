"""The queries the dashboard and the CLI need. Each opens a short-lived read-only
connection (retried while a writer holds the lock) and returns DataFrames."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.runlog.schema import connect


def query(db: str | Path, sql: str, params: list | None = None) -> pd.DataFrame:
    with connect(db, read_only=True) as con:
        return con.execute(sql, params or []).df()


def list_runs(db: str | Path) -> pd.DataFrame:
    """One row per run with its progress and totals."""
    return query(db, """
        SELECT r.run_id, r.graph_name, r.method, r.backend, r.model, r.optimizer_model,
               r.seed, r.status, r.started_at, r.ended_at, r.error,
               s.steps, s.best_val, s.last_val, c.calls, c.tokens, c.cost_usd
        FROM runs r
        LEFT JOIN (SELECT run_id, max(step) AS steps, max(val_score) AS best_val,
                          arg_max(val_score, step) AS last_val
                   FROM steps GROUP BY run_id) s USING (run_id)
        LEFT JOIN (SELECT run_id, count(*) AS calls,
                          sum(prompt_tokens + completion_tokens) AS tokens,
                          sum(cost_usd) AS cost_usd
                   FROM llm_calls GROUP BY run_id) c USING (run_id)
        ORDER BY r.started_at DESC""")


def step_table(db: str | Path, run_id: str) -> pd.DataFrame:
    """Steps of a run with the number of accepted and proposed edits."""
    return query(db, """
        SELECT s.step, s.train_score, s.val_score, s.accepted, s.started_at, s.ended_at,
               coalesce(u.proposed, 0) AS proposed, coalesce(u.accepted_edits, 0) AS accepted_edits
        FROM steps s
        LEFT JOIN (SELECT step, count(*) FILTER (WHERE new_prompt <> old_prompt) AS proposed,
                          count(*) FILTER (WHERE accepted) AS accepted_edits
                   FROM updates WHERE run_id = ? GROUP BY step) u USING (step)
        WHERE s.run_id = ? ORDER BY s.step""", [run_id, run_id])


def node_activations(db: str | Path, run_id: str, node_id: str) -> pd.DataFrame:
    """One node's activations across all steps and splits."""
    return query(db, """
        SELECT step, split, example_id, prompt_version, input_text, output_text, error,
               parse_error, call_id
        FROM node_outputs WHERE run_id = ? AND node_id = ?
        ORDER BY step, split, example_id""", [run_id, node_id])


def example_trace(db: str | Path, run_id: str, step: int, example_id: str
                  ) -> dict[str, pd.DataFrame]:
    """Everything that happened to one example at one step, in one connection."""
    params = [run_id, step, example_id]
    with connect(db, read_only=True) as con:
        return {
            "activations": con.execute(
                "SELECT * FROM node_outputs WHERE run_id = ? AND step = ? AND example_id = ? "
                "ORDER BY split", params).df(),
            "losses": con.execute(
                "SELECT * FROM losses WHERE run_id = ? AND step = ? AND example_id = ?",
                params).df(),
            "gradients": con.execute(
                "SELECT * FROM gradients WHERE run_id = ? AND step = ? AND example_id = ?",
                params).df(),
            "calls": con.execute(
                "SELECT * FROM llm_calls WHERE run_id = ? AND step = ? AND example_id = ? "
                "ORDER BY started_at", params).df(),
        }


def token_totals(db: str | Path, run_id: str) -> pd.DataFrame:
    """Calls, tokens, cost and latency per node and phase (purpose)."""
    return query(db, """
        SELECT coalesce(node_id, '') AS node_id, purpose, count(*) AS calls,
               sum(prompt_tokens) AS prompt_tokens, sum(completion_tokens) AS completion_tokens,
               sum(prompt_tokens + completion_tokens) AS tokens, sum(cost_usd) AS cost_usd,
               sum(CASE WHEN cache_hit THEN 1 ELSE 0 END) AS cache_hits,
               avg(latency_ms) AS mean_latency_ms
        FROM llm_calls WHERE run_id = ?
        GROUP BY ALL ORDER BY node_id, purpose""", [run_id])
