"""The queries the dashboard and the CLI need. Each opens a short-lived read-only
connection (retried while a writer holds the lock) and returns DataFrames."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.runlog.probing import sampled_examples
from engine.runlog.schema import connect


def query(db: str | Path, sql: str, params: list | dict | None = None) -> pd.DataFrame:
    with connect(db, read_only=True) as con:
        return con.execute(sql, params or []).df()


# One definition of the figures every page and command shows of a run's calls: a model
# call is a cache miss (what was paid for; a cache hit is free and counted apart), and the
# run's own calls leave out the probes and diffs made on it afterwards (counted apart), so
# a blame or diff re-run on a run never changes its figures.
PAID = "NOT coalesce(cache_hit, false)"
# A call's time at the model: its latency (ask to answer) less the time it waited for a
# turn (the run's concurrency limit, the embedded model's slots, its server's start), which
# with many calls in flight can be most of it; rows logged before schema 9 did not measure
# the wait
MODEL_MS = "(latency_ms - coalesce(queued_ms, 0))"
OWN = "purpose NOT IN ('probe', 'diff')"


def list_runs(db: str | Path) -> pd.DataFrame:
    """One row per run with its progress and totals: the run's own model calls (cache
    misses), their tokens and cost, its cache hits apart, and the model calls of probes
    and diffs made on it afterwards (`probe_calls`, see PAID and OWN)."""
    return query(db, f"""
        SELECT r.run_id, r.graph_name, r.method, r.backend, r.model, r.optimizer_model,
               r.seed, r.status, r.started_at, r.ended_at, r.error, r.parent_run_id,
               s.steps, s.best_val, s.last_val, c.calls, c.tokens, c.cache_hits, c.cost_usd,
               c.probe_calls
        FROM runs r
        LEFT JOIN (SELECT run_id, max(step) AS steps, max(val_score) AS best_val,
                          arg_max(val_score, step) AS last_val
                   FROM steps GROUP BY run_id) s USING (run_id)
        LEFT JOIN (SELECT run_id,
                          count(*) FILTER (WHERE {PAID} AND {OWN}) AS calls,
                          coalesce(sum(prompt_tokens + completion_tokens)
                                   FILTER (WHERE {PAID} AND {OWN}), 0) AS tokens,
                          count(*) FILTER (WHERE cache_hit AND {OWN}) AS cache_hits,
                          sum(cost_usd) FILTER (WHERE {OWN}) AS cost_usd,
                          count(*) FILTER (WHERE {PAID} AND NOT ({OWN})) AS probe_calls
                   FROM llm_calls GROUP BY run_id) c USING (run_id)
        ORDER BY r.started_at DESC""")


def step_table(db: str | Path, run_id: str) -> pd.DataFrame:
    """Steps of a run with the number of accepted and proposed edits, and `train_scored`:
    whether the run scored training at the step itself (a fork's starting step that
    re-measured nothing carries its parent's train score of that step)."""
    return query(db, """
        SELECT s.step, s.train_score, s.val_score, s.accepted, s.started_at, s.ended_at,
               coalesce(u.proposed, 0) AS proposed, coalesce(u.accepted_edits, 0) AS accepted_edits,
               t.step IS NOT NULL AS train_scored
        FROM steps s
        LEFT JOIN (SELECT step, count(*) FILTER (WHERE new_prompt <> old_prompt) AS proposed,
                          count(*) FILTER (WHERE accepted) AS accepted_edits
                   FROM updates WHERE run_id = ? GROUP BY step) u USING (step)
        LEFT JOIN (SELECT DISTINCT step FROM losses WHERE run_id = ? AND split = 'train') t
             USING (step)
        WHERE s.run_id = ? ORDER BY s.step""", [run_id, run_id, run_id])


def node_activations(db: str | Path, run_id: str, node_id: str) -> pd.DataFrame:
    """One node's activations across all steps and splits."""
    # Thousands of rows of text: fetched as Arrow and sorted there (the keys are unique),
    # this is ~8 ms faster than ORDER BY + .df() on a 100-step run
    # (benchmarks/runlog_queries.py). Same columns and values as .df(); a text column
    # that is entirely NULL comes back as strings with NaN rather than objects with None.
    with connect(db, read_only=True) as con:
        rows = con.sql("""
            SELECT step, split, example_id, prompt_version, input_text, output_text, error,
                   parse_error, call_id
            FROM node_outputs WHERE run_id = $run_id AND node_id = $node_id""",
                       params={"run_id": run_id, "node_id": node_id}).to_arrow_table()
    return rows.sort_by([("step", "ascending"), ("split", "ascending"),
                         ("example_id", "ascending")]).to_pandas()


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
    """Model calls (cache misses), their tokens, cost and latency per node and phase
    (purpose; probes and diffs are phases of their own), cache hits apart (see PAID).
    `mean_latency_ms` is the model's time on a call (MODEL_MS: its wait for a turn left
    out), `mean_wait_ms` that wait (NULL for calls logged before it was measured)."""
    return query(db, f"""
        SELECT coalesce(node_id, '') AS node_id, purpose,
               count(*) FILTER (WHERE {PAID}) AS calls,
               coalesce(sum(prompt_tokens) FILTER (WHERE {PAID}), 0) AS prompt_tokens,
               coalesce(sum(completion_tokens) FILTER (WHERE {PAID}), 0) AS completion_tokens,
               coalesce(sum(prompt_tokens + completion_tokens) FILTER (WHERE {PAID}), 0)
                   AS tokens,
               sum(cost_usd) AS cost_usd,
               count(*) FILTER (WHERE cache_hit) AS cache_hits,
               avg({MODEL_MS}) FILTER (WHERE {PAID}) AS mean_latency_ms,
               avg(queued_ms) FILTER (WHERE {PAID}) AS mean_wait_ms
        FROM llm_calls WHERE run_id = ?
        GROUP BY ALL ORDER BY node_id, purpose""", [run_id])


# --- queries the dashboard pages need ---------------------------------------------------
# Each takes the database path (never a connection, so callers may cache on it) and
# filters in the database: pages receive only the rows they show.


def run_record(db: str | Path, run_id: str) -> dict | None:
    """The run's row (graph YAML and config included), or None when there is no such run."""
    frame = query(db, "SELECT * FROM runs WHERE run_id = ?", [run_id])
    return None if frame.empty else frame.iloc[0].to_dict()


def step_examples(db: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """Examples evaluated at `step` with their score and how many messages (gradients, or
    gtbp targets) they sent back through the graph.

    Back-propagated examples come first, then train before val, then dataset order."""
    return query(db, """
        SELECT l.example_id, l.split, l.score, l.prediction, l.target, l.error,
               coalesce(g.gradients, 0) AS gradients, e.position
        FROM losses l
        LEFT JOIN (SELECT example_id, count(*) AS gradients FROM gradients
                   WHERE run_id = ? AND step = ? AND kind IN ('gradient', 'target')
                   GROUP BY example_id) g USING (example_id)
        LEFT JOIN (SELECT example_id, min(position) AS position FROM examples
                   WHERE run_id = ? GROUP BY example_id) e USING (example_id)
        WHERE l.run_id = ? AND l.step = ?
        ORDER BY (coalesce(g.gradients, 0) = 0), (l.split <> 'train'), e.position,
                 l.example_id""", [run_id, step, run_id, run_id, step])


def node_step_stats(db: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """Per node at one step: share of failing train examples, mean length of the
    aggregated gradient, the fate of its proposed edit, and its calls and tokens.

    edit: 'accepted', 'rejected' (changed but the gate said no), 'unchanged' (the update
    call kept the prompt) or NULL (no update call at this step)."""
    return query(db, f"""
        WITH acts AS (
            SELECT a.node_id, a.split, a.error, l.score
            FROM node_outputs a
            LEFT JOIN losses l ON l.run_id = a.run_id AND l.step = a.step
                 AND l.split = a.split AND l.example_id = a.example_id
            WHERE a.run_id = ? AND a.step = ?),
        chosen AS (  -- train examples when the step has any, else every split
            SELECT * FROM acts
            WHERE split = 'train' OR NOT EXISTS (SELECT 1 FROM acts WHERE split = 'train')),
        fail AS (
            SELECT node_id, count(*) AS activations,
                   avg(CASE WHEN error IS NOT NULL OR coalesce(score, 0) < 1 THEN 1.0
                            ELSE 0.0 END) AS fail_share,
                   count(error) AS errors
            FROM chosen GROUP BY node_id),
        grads AS (
            SELECT node_id,
                   avg(length(content)) FILTER (WHERE kind = 'aggregate' AND content <> '')
                       AS grad_chars,
                   count(*) FILTER (WHERE kind IN ('gradient', 'target')) AS gradients
            FROM gradients WHERE run_id = ? AND step = ? GROUP BY node_id),
        edits AS (
            SELECT node_id,
                   CASE WHEN bool_or(accepted) THEN 'accepted'
                        WHEN bool_or(new_prompt <> old_prompt) THEN 'rejected'
                        ELSE 'unchanged' END AS edit
            FROM updates WHERE run_id = ? AND step = ? GROUP BY node_id),
        calls AS (  -- the step's own model calls: a blame or diff re-run adds none
            SELECT node_id, count(*) FILTER (WHERE {PAID}) AS calls,
                   coalesce(sum(prompt_tokens + completion_tokens) FILTER (WHERE {PAID}), 0)
                       AS tokens, sum(cost_usd) AS cost_usd
            FROM llm_calls WHERE run_id = ? AND step = ? AND node_id IS NOT NULL AND {OWN}
            GROUP BY node_id)
        SELECT node_id, f.activations, f.fail_share, f.errors, g.grad_chars,
               coalesce(g.gradients, 0) AS gradients, e.edit,
               coalesce(c.calls, 0) AS calls, coalesce(c.tokens, 0) AS tokens, c.cost_usd
        FROM fail f
        FULL JOIN grads g USING (node_id)
        FULL JOIN edits e USING (node_id)
        FULL JOIN calls c USING (node_id)
        ORDER BY node_id""", [run_id, step] * 4)


def gradient_flows(db: str | Path, run_id: str, step: int, example_id: str | None = None
                   ) -> pd.DataFrame:
    """Which gradients (or gtbp targets) flowed at a step: one row per (from_node_id ->
    node_id) with the number of messages and their mean length; one example's when given."""
    where = ("run_id = ? AND step = ? AND kind IN ('gradient', 'target') "
             "AND from_node_id IS NOT NULL")
    params: list = [run_id, step]
    if example_id is not None:
        where += " AND example_id = ?"
        params.append(example_id)
    return query(db, f"""
        SELECT from_node_id, node_id, count(*) AS messages,
               avg(length(content)) AS mean_chars
        FROM gradients WHERE {where}
        GROUP BY from_node_id, node_id ORDER BY from_node_id, node_id""", params)


def node_view(db: str | Path, run_id: str, step: int, example_id: str, node_id: str
              ) -> dict[str, pd.DataFrame]:
    """Everything about one node for one example at one step, in one connection.

    activation: the node's activation joined with its forward call (messages, tokens,
    latency, cost, cache hit) and the prompt text of the version it ran with.
    received: gradients rows for the node (every kind), each joined with the call that
    produced it (the exact backward prompt and reply).
    sent: gradients (gtbp: targets) the node's backward call wrote for its predecessors.
    update: the update proposed for the node at this step, with its call.
    loss: the example's loss rows at this step."""
    key = [run_id, step, example_id]
    with connect(db, read_only=True) as con:
        return {
            "activation": con.execute("""
                SELECT a.*, p.prompt, c.messages, c.response, c.prompt_tokens,
                       c.completion_tokens, c.latency_ms, c.queued_ms, c.cost_usd, c.cache_hit,
                       c.retries, c.model
                FROM node_outputs a
                LEFT JOIN prompt_versions p ON p.run_id = a.run_id
                     AND p.node_id = a.node_id AND p.version = a.prompt_version
                LEFT JOIN llm_calls c ON c.call_id = a.call_id
                WHERE a.run_id = ? AND a.step = ? AND a.example_id = ? AND a.node_id = ?
                ORDER BY (a.split <> 'train'), a.split LIMIT 1""", [*key, node_id]).df(),
            "received": con.execute("""
                SELECT g.from_node_id, g.kind, g.method, g.content, g.parse_error, g.call_id,
                       c.node_id AS call_node_id, c.purpose, c.messages, c.response,
                       c.prompt_tokens, c.completion_tokens, c.latency_ms, c.queued_ms, c.cost_usd,
                       c.cache_hit
                FROM gradients g LEFT JOIN llm_calls c ON c.call_id = g.call_id
                WHERE g.run_id = ? AND g.step = ? AND g.example_id = ? AND g.node_id = ?
                ORDER BY CASE g.kind WHEN 'gradient' THEN 0 WHEN 'target' THEN 0
                              WHEN 'aggregate' THEN 1 ELSE 2 END, g.from_node_id""",
                [*key, node_id]).df(),
            "sent": con.execute("""
                SELECT g.node_id, g.kind, g.content, g.parse_error, g.call_id,
                       c.messages, c.response
                FROM gradients g LEFT JOIN llm_calls c ON c.call_id = g.call_id
                WHERE g.run_id = ? AND g.step = ? AND g.example_id = ?
                  AND g.from_node_id = ? AND g.kind IN ('gradient', 'target')
                ORDER BY g.node_id""", [*key, node_id]).df(),
            "update": con.execute("""
                SELECT u.*, c.messages, c.response AS call_response, c.prompt_tokens,
                       c.completion_tokens, c.latency_ms, c.queued_ms, c.cost_usd, c.cache_hit
                FROM updates u LEFT JOIN llm_calls c ON c.call_id = u.call_id
                WHERE u.run_id = ? AND u.step = ? AND u.node_id = ?
                ORDER BY coalesce(u.candidate, 0)""",
                [run_id, step, node_id]).df(),
            "loss": con.execute("""
                SELECT * FROM losses WHERE run_id = ? AND step = ? AND example_id = ?
                ORDER BY (split <> 'train'), split""", key).df(),
        }


def step_updates(db: str | Path, run_id: str, step: int | None = None) -> pd.DataFrame:
    """Proposed updates (one row per node and step, and per candidate under --proposals),
    oldest first: the step's, or with `step` None every step's."""
    where, params = "run_id = ?", [run_id]
    if step is not None:
        where += " AND step = ?"
        params.append(step)
    return query(db, f"""
        SELECT step, node_id, old_prompt, new_prompt, accepted, val_before, val_after,
               val_alone, reject_reason, parse_error, reasoning, call_id,
               coalesce(candidate, 0) AS candidate
        FROM updates WHERE {where} ORDER BY step, node_id, candidate""", params)


def prompt_history(db: str | Path, run_id: str) -> pd.DataFrame:
    """Every prompt version of every node: (node_id, version, prompt, step, accepted)."""
    return query(db, """
        SELECT node_id, version, prompt, step, accepted FROM prompt_versions
        WHERE run_id = ? ORDER BY node_id, version""", [run_id])


def prompt_versions_up_to(db: str | Path, run_id: str, step: int) -> list[dict]:
    """The prompt versions written at steps 0..`step`, in the order they were written (what a
    fork copies from its parent)."""
    rows = query(db, """
        SELECT node_id, version, prompt, step, accepted FROM prompt_versions
        WHERE run_id = ? AND step <= ? ORDER BY step, node_id, version""", [run_id, step])
    return rows.to_dict("records")


def example_gradients(db: str | Path, run_id: str, step: int, example_id: str
                      ) -> pd.DataFrame:
    """One example's gradients at one step (every kind), for side-by-side comparison."""
    return query(db, """
        SELECT node_id, from_node_id, kind, content, method FROM gradients
        WHERE run_id = ? AND step = ? AND example_id = ?
        ORDER BY node_id, CASE kind WHEN 'gradient' THEN 0 WHEN 'aggregate' THEN 1
                                    ELSE 2 END, from_node_id""", [run_id, step, example_id])


def step_phase_costs(db: str | Path, run_id: str) -> pd.DataFrame:
    """Per step and phase: model calls (cache misses), their prompt and completion tokens,
    the prompt tokens the provider's prefix cache served, their cost, and this engine's
    cache hits apart (free). The phases are the progress line's (engine/runs/progress.py):
    a call's purpose, except that forward and loss calls on validation examples in a step
    that made update calls are the `gate`, and calls on test examples the `test`."""
    return query(db, f"""
        WITH updated AS (SELECT DISTINCT step FROM llm_calls
                         WHERE run_id = $run AND purpose = 'update'),
        split_of AS (SELECT DISTINCT example_id, split FROM examples WHERE run_id = $run),
        phased AS (
            SELECT c.*,
                   CASE WHEN c.purpose NOT IN ('forward', 'loss') THEN c.purpose
                        WHEN e.split = 'test' THEN 'test'
                        WHEN e.split = 'val' AND u.step IS NOT NULL THEN 'gate'
                        ELSE c.purpose END AS phase
            FROM llm_calls c
            LEFT JOIN split_of e USING (example_id)
            LEFT JOIN updated u ON u.step = c.step
            WHERE c.run_id = $run)
        SELECT step, phase,
               count(*) FILTER (WHERE {PAID}) AS model_calls,
               coalesce(sum(prompt_tokens + completion_tokens) FILTER (WHERE {PAID}), 0)
                   AS tokens,
               coalesce(sum(cached_tokens) FILTER (WHERE {PAID}), 0) AS provider_cached_tokens,
               sum(cost_usd) AS cost_usd,
               count(*) FILTER (WHERE cache_hit) AS cache_hits,
               coalesce(sum(prompt_tokens + completion_tokens) FILTER (WHERE cache_hit), 0)
                   AS cache_hit_tokens
        FROM phased GROUP BY step, phase
        ORDER BY step, list_position(['forward', 'loss', 'backward', 'update', 'gate',
                                      'test', 'probe', 'diff'], phase), phase""",
                 {"run": run_id})


def step_totals(db: str | Path, run_id: str) -> pd.DataFrame:
    """Model calls (cache misses), their tokens and cost per step and phase (purpose),
    as token_totals counts them."""
    return query(db, f"""
        SELECT step, purpose, count(*) FILTER (WHERE {PAID}) AS calls,
               coalesce(sum(prompt_tokens + completion_tokens) FILTER (WHERE {PAID}), 0)
                   AS tokens, sum(cost_usd) AS cost_usd
        FROM llm_calls WHERE run_id = ? GROUP BY ALL ORDER BY step, purpose""", [run_id])


def probe_rows(db: str | Path, run_id: str, step: int | None = None,
               example_id: str | None = None, node_id: str | None = None) -> pd.DataFrame:
    """Counterfactual probes of a run (see docs/runlog.md), oldest first, optionally of
    one step, example and node."""
    where, params = "run_id = ?", [run_id]
    for column, value in (("step", step), ("example_id", example_id), ("node_id", node_id)):
        if value is not None:
            where += f" AND {column} = ?"
            params.append(value)
    return query(db, f"SELECT * FROM probes WHERE {where} ORDER BY created_at, probe_id",
                 params)


def probe_outputs(db: str | Path, probe_id: str) -> pd.DataFrame:
    """The node outputs one probe re-computed (its downstream nodes), never the run's own."""
    return query(db, "SELECT * FROM probe_outputs WHERE probe_id = ? ORDER BY node_id",
                 [probe_id])


def node_blame(db: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """Per node at one step, from the probes: failing examples probed by following the
    gradient or replacing the output, how many of them that flipped to correct, and the
    same for the node's edit applied alone; leaks counts flips whose intervention
    contained the target (not credit, so not among the flips).

    The edit counts are `engine blame`'s: only probes of the optimizer's own proposal at
    the step (not a prompt typed in What-if), one per example (with repeats, the
    majority's flip), leaving out flips that leak the target, and leaving out examples the
    update call saw (in-sample) altogether: fixed or not, they are no evidence about the
    edit out of sample."""
    return query(db, """
        WITH proposal_draws AS (
            SELECT p.node_id, p.example_id,
                   count(*) FILTER (WHERE p.error IS NULL) AS ok,
                   count(*) FILTER (WHERE p.error IS NULL AND p.after_score >= 1) AS fixed,
                   bool_or(p.error IS NULL AND p.after_score >= 1
                           AND coalesce(p.leaks_target, false)) AS leaked,
                   list_contains($sampled::VARCHAR[], p.example_id) AS in_sample
            FROM probes p
            WHERE p.run_id = $run AND p.step = $step AND p.kind = 'edit'
              AND p.before_score < 1
              AND EXISTS (SELECT 1 FROM updates u WHERE u.run_id = p.run_id
                          AND u.step = p.step AND u.node_id = p.node_id
                          AND u.new_prompt = p.intervention)
            GROUP BY p.node_id, p.example_id),
        edits AS (
            SELECT node_id, count(*) FILTER (WHERE ok > 0 AND NOT in_sample) AS edit_probed,
                   count(*) FILTER (WHERE fixed * 2 > ok AND NOT leaked AND NOT in_sample)
                       AS edit_flips
            FROM proposal_draws GROUP BY node_id),
        others AS (
            SELECT node_id,
                count(DISTINCT example_id) FILTER (WHERE kind IN ('gradient', 'output')
                    AND before_score < 1 AND error IS NULL) AS probed,
                count(DISTINCT example_id) FILTER (WHERE kind IN ('gradient', 'output')
                    AND before_score < 1 AND after_score >= 1
                    AND NOT coalesce(leaks_target, false)) AS flips,
                count(DISTINCT example_id) FILTER (WHERE before_score < 1 AND after_score >= 1
                    AND coalesce(leaks_target, false)) AS leaks
            FROM probes WHERE run_id = $run AND step = $step GROUP BY node_id)
        SELECT o.node_id, o.probed, o.flips, coalesce(e.edit_probed, 0) AS edit_probed,
               coalesce(e.edit_flips, 0) AS edit_flips, o.leaks
        FROM others o LEFT JOIN edits e USING (node_id) ORDER BY o.node_id""",
                 {"run": run_id, "step": int(step),
                  "sampled": sampled_examples(db, run_id, int(step))})


def step_call_costs(db: str | Path, run_id: str) -> list[dict]:
    """Per step: model calls (cache misses), cache hits, the misses' prompt and completion
    tokens (and of those, the prompt tokens the provider's prefix cache served) and cost,
    and the step's wall seconds (NULL for a step not finished)."""
    frame = query(db, """
        SELECT c.step,
               sum(CASE WHEN c.cache_hit THEN 0 ELSE 1 END) AS calls,
               sum(CASE WHEN c.cache_hit THEN 1 ELSE 0 END) AS cache_hits,
               sum(CASE WHEN c.cache_hit THEN 0 ELSE c.prompt_tokens END) AS prompt_tokens,
               sum(CASE WHEN c.cache_hit THEN 0 ELSE c.completion_tokens END)
                   AS completion_tokens,
               coalesce(sum(CASE WHEN c.cache_hit THEN 0 ELSE c.cached_tokens END), 0)
                   AS provider_cached_tokens,
               sum(c.cost_usd) AS cost_usd,
               any_value(s.ended_at - s.started_at) AS seconds
        FROM llm_calls c LEFT JOIN steps s ON s.run_id = c.run_id AND s.step = c.step
        WHERE c.run_id = ? GROUP BY c.step ORDER BY c.step""", [run_id])
    return [{k: (None if pd.isna(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")]


def step_calls_by_purpose(db: str | Path, run_id: str, step: int) -> pd.DataFrame:
    """Calls written for one step, per purpose (forward, loss, backward, update, probe...)."""
    return query(db, """
        SELECT purpose, count(*) AS calls FROM llm_calls
        WHERE run_id = ? AND step = ? GROUP BY purpose""", [run_id, step])


def split_fields(db: str | Path, run_id: str, split: str) -> pd.DataFrame:
    """The input fields (JSON) of every example of one split."""
    return query(db, "SELECT fields FROM examples WHERE run_id = ? AND split = ?",
                 [run_id, split])


def kept_prompt_rows(db: str | Path, run_id: str) -> list[dict]:
    """Per node, the prompt the run keeps: its latest accepted version (by step, then
    version) with the step that wrote it, the node's first version (`original`), and the
    accepted update that proposed the kept prompt at that step, if one did (`val_before`,
    `val_after`, `val_alone`; null for the starting prompt or one set by hand at a fork).
    What `python -m engine prompts` hands back."""
    return query(db, """
        WITH ranked AS (
            SELECT node_id, version, prompt, step, accepted,
                   row_number() OVER (PARTITION BY node_id ORDER BY step, version) AS first,
                   row_number() OVER (PARTITION BY node_id, accepted
                                      ORDER BY step DESC, version DESC) AS latest
            FROM prompt_versions WHERE run_id = $run),
        updates_kept AS (
            SELECT node_id, step, new_prompt, any_value(val_before) AS val_before,
                   any_value(val_after) AS val_after, any_value(val_alone) AS val_alone
            FROM updates WHERE run_id = $run AND accepted GROUP BY ALL)
        SELECT k.node_id, k.prompt, k.version, k.step, o.prompt AS original,
               o.version AS original_version, u.val_before, u.val_after, u.val_alone,
               u.node_id IS NOT NULL AS proposed
        FROM ranked k JOIN ranked o ON o.node_id = k.node_id AND o.first = 1
        LEFT JOIN updates_kept u ON u.node_id = k.node_id AND u.step = k.step
             AND u.new_prompt = k.prompt
        WHERE k.accepted AND k.latest = 1 ORDER BY k.node_id""",
                 {"run": run_id}).to_dict("records")


def example_fields(db: str | Path, run_id: str) -> str | None:
    """The fields (JSON) of the run's first example (training first): what an imported
    run's nodes recorded of their calls (the `recorded_calls` field)."""
    frame = query(db, """SELECT fields FROM examples WHERE run_id = ?
                         ORDER BY split <> 'train', split, position LIMIT 1""", [run_id])
    return None if frame.empty else str(frame.iloc[0]["fields"])


def split_sizes(db: str | Path, run_id: str) -> dict[str, int]:
    """Examples per split of one run ({"train": 8, "val": 24, ...}; a split it lacks is
    absent): what `blame --examples failing|val` chooses its failing examples from."""
    frame = query(db, """SELECT split, count(DISTINCT example_id) AS n FROM examples
                         WHERE run_id = ? GROUP BY split""", [run_id])
    return {str(split): int(n) for split, n in frame.itertuples(index=False)}


def step_request_times(db: str | Path, run_id: str, step: int) -> list[tuple[float, float]]:
    """(started, ended) in epoch seconds of each call of one step that reached the model
    (cache misses): what a step's dependent rounds are measured from."""
    frame = query(db, """
        SELECT started_at, started_at + latency_ms / 1000.0 AS ended_at FROM llm_calls
        WHERE run_id = ? AND step = ? AND NOT cache_hit""", [run_id, step])
    return [(float(s), float(e)) for s, e in frame.itertuples(index=False)]


def paired_gradients(db: str | Path, run_a: str, run_b: str, step: int, node_id: str
                     ) -> pd.DataFrame:
    """The gradient `node_id` received at `step` in two runs of the same graph and seed
    (say a semantic run and its TextGrad pair), on every example both runs back-propagated
    to it: one row per example with each side's backward prompt (the call's messages) and
    gradient, and whether the prompts and the gradients differ. The Learn tour's sibling
    stage counts these rows."""
    table = query(db, """
        WITH g AS (
            SELECT g.run_id, g.example_id, g.content, CAST(c.messages AS VARCHAR) AS messages
            FROM gradients g LEFT JOIN llm_calls c ON c.call_id = g.call_id
            WHERE g.run_id IN ($a, $b) AND g.step = $step AND g.node_id = $node
              AND g.kind = 'gradient')
        SELECT a.example_id, a.messages AS messages_a, b.messages AS messages_b,
               a.content AS gradient_a, b.content AS gradient_b
        FROM (SELECT * FROM g WHERE run_id = $a) a
        JOIN (SELECT * FROM g WHERE run_id = $b) b USING (example_id)
        ORDER BY a.example_id""",
        {"a": run_a, "b": run_b, "step": int(step), "node": node_id})
    table["prompts_differ"] = table["messages_a"].fillna("") != table["messages_b"].fillna("")
    table["gradients_differ"] = (table["gradient_a"].fillna("").str.strip()
                                 != table["gradient_b"].fillna("").str.strip())
    return table
