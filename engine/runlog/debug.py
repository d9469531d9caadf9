"""Queries behind the dashboard's debugging views: the examples table of a step (filtered,
searched and paged in the database), one example's calls as a trace, a node's prompt
history with the examples each accepted edit flipped, and two runs compared example by
example. Each opens a short-lived read-only connection (see reader.query)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.runlog.probing import sampled_examples
from engine.runlog.reader import query
from engine.runlog.schema import connect

PREVIEW = 160  # characters of prediction and target kept per example row

# An example fails when its loss has an error or a score below 1 (as in node_step_stats);
# it flipped when its pass/fail state at the previous step differs.
_FAILING = "(l.error IS NOT NULL OR coalesce(l.score, 0) < 1)"

_EXAMPLE_ROWS = f"""
    WITH prev AS (
        SELECT split, example_id, (error IS NOT NULL OR coalesce(score, 0) < 1) AS failing
        FROM losses WHERE run_id = $run AND step = $step - 1),
    acts AS (
        SELECT split, example_id, count(error) AS errors, count(parse_error) AS fallbacks,
               first(error) FILTER (WHERE error IS NOT NULL) AS first_error
        FROM node_outputs WHERE run_id = $run AND step = $step GROUP BY ALL),
    grads AS (
        SELECT example_id, count(*) AS gradients FROM gradients
        WHERE run_id = $run AND step = $step AND kind IN ('gradient', 'target')
        GROUP BY example_id),
    sampled AS (  -- back-propagated at the step: the update call saw these examples
        SELECT unnest($sampled::VARCHAR[]) AS example_id),
    gains AS (  -- per (example, node): the best score change of the probes that count as
                -- credit, and whether a gain leaked the target or was an in-sample edit
        SELECT p.example_id, p.node_id, count(*) AS probes,
               max(p.after_score - p.before_score) FILTER (
                   WHERE NOT coalesce(p.leaks_target, false)
                   AND NOT (p.kind = 'edit' AND s.example_id IS NOT NULL)) AS gain,
               bool_or(p.after_score > p.before_score AND coalesce(p.leaks_target, false))
                   AS leaked,
               bool_or(p.after_score > p.before_score AND p.kind = 'edit'
                       AND s.example_id IS NOT NULL AND NOT coalesce(p.leaks_target, false))
                   AS in_sample
        FROM probes p LEFT JOIN sampled s USING (example_id)
        WHERE p.run_id = $run AND p.step = $step AND p.error IS NULL
        GROUP BY ALL),
    blame AS (  -- leaks and in-sample edits are shown apart, never credited (as in blame)
        SELECT example_id,
               string_agg(node_id || ' ' || printf('%+.2f', gain), ', '
                          ORDER BY gain DESC, node_id) FILTER (WHERE gain > 0) AS blame,
               string_agg(node_id, ', ' ORDER BY node_id) FILTER (WHERE leaked) AS leaked,
               string_agg(node_id, ', ' ORDER BY node_id) FILTER (WHERE in_sample)
                   AS in_sample,
               sum(probes) AS probes
        FROM gains GROUP BY example_id),
    ex AS (
        SELECT split, example_id, min(position) AS position, any_value(fields) AS fields
        FROM examples WHERE run_id = $run GROUP BY ALL),
    rows AS (
        SELECT l.split, l.example_id, CAST(ex.fields AS VARCHAR) AS input,
               left(l.prediction, {PREVIEW}) AS prediction, left(l.target, {PREVIEW}) AS target,
               l.score, {_FAILING} AS failing,
               CASE WHEN p.failing IS NULL OR p.failing = {_FAILING} THEN NULL
                    WHEN p.failing THEN 'fixed' ELSE 'broke' END AS flipped,
               coalesce(a.errors, 0) + (l.error IS NOT NULL)::INT AS errors,
               coalesce(a.fallbacks, 0) AS fallbacks,
               coalesce(l.error, a.first_error) AS error,
               coalesce(g.gradients, 0) AS gradients, b.blame, b.leaked, b.in_sample,
               coalesce(b.probes, 0) AS probes,
               ex.position
        FROM losses l
        LEFT JOIN prev p USING (split, example_id)
        LEFT JOIN acts a USING (split, example_id)
        LEFT JOIN grads g USING (example_id)
        LEFT JOIN blame b USING (example_id)
        LEFT JOIN ex USING (split, example_id)
        WHERE l.run_id = $run AND l.step = $step)
"""


def example_rows(db: str | Path, run_id: str, step: int, *, split: str | None = None,
                 failing: bool = False, flipped: bool = False, errored: bool = False,
                 search: str = "", limit: int = 50, offset: int = 0) -> pd.DataFrame:
    """One row per example evaluated at `step` (split, input fields as JSON, prediction, target,
    score, failing, flipped 'fixed'/'broke' since step-1, errors and parse fallbacks,
    gradients received, blame from probes), filtered and paged in the database.

    Blame, as `engine blame` counts it: `blame` lists the nodes whose probe raised the
    score (the best change per node), leaving out interventions that carried the target
    (`leaked` names those nodes) and edits probed on an example the update call saw
    (`in_sample`); `probes` counts the error-free probes.

    `search` matches (case-insensitively) the example's input fields, any node's output
    and any gradient for it at this step. Column `total` is the number of matching rows."""
    where = ["TRUE"]
    params: dict = {"run": run_id, "step": int(step), "limit": int(limit),
                    "offset": int(offset), "sampled": sampled_examples(db, run_id, int(step))}
    if split:
        where.append("split = $split")
        params["split"] = split
    if failing:
        where.append("failing")
    if flipped:
        where.append("flipped IS NOT NULL")
    if errored:
        where.append("(errors > 0 OR fallbacks > 0)")
    if search.strip():
        params["q"] = search.strip().lower()
        where.append("""(contains(lower(input), $q) OR contains(lower(prediction), $q)
            OR example_id IN (SELECT example_id FROM node_outputs WHERE run_id = $run
                              AND step = $step AND contains(lower(output_text), $q))
            OR example_id IN (SELECT example_id FROM gradients WHERE run_id = $run
                              AND step = $step AND contains(lower(content), $q)))""")
    sql = (_EXAMPLE_ROWS + f"SELECT *, count(*) OVER () AS total FROM rows WHERE "
           f"{' AND '.join(where)} ORDER BY (split <> 'train'), position, example_id "
           "LIMIT $limit OFFSET $offset")
    with connect(db, read_only=True) as con:
        return con.execute(sql, params).df()


def example_calls(db: str | Path, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    """Every call made for one example at one step, in time order: forward, loss,
    backward and probe calls, then the step's update calls of the nodes this example
    sent gradients to. parse_fallback: the parse note of the record the call produced."""
    return query(db, """
        WITH mine AS (
            SELECT * FROM llm_calls WHERE run_id = $run AND step = $step
                   AND example_id = $ex
            UNION ALL
            SELECT * FROM llm_calls WHERE run_id = $run AND step = $step
                   AND purpose = 'update' AND node_id IN (
                       SELECT node_id FROM gradients WHERE run_id = $run AND step = $step
                       AND example_id = $ex AND kind IN ('gradient', 'target'))),
        notes AS (
            SELECT call_id, parse_error FROM node_outputs
            WHERE run_id = $run AND step = $step AND parse_error IS NOT NULL
            UNION ALL SELECT call_id, parse_error FROM gradients
            WHERE run_id = $run AND step = $step AND parse_error IS NOT NULL
            UNION ALL SELECT call_id, parse_error FROM updates
            WHERE run_id = $run AND step = $step AND parse_error IS NOT NULL)
        SELECT m.call_id, m.purpose, m.node_id, m.model, m.messages, m.response,
               m.latency_ms, m.queued_ms, m.prompt_tokens, m.completion_tokens, m.cost_usd,
               m.cache_hit, m.retries, m.error, m.started_at, m.constrained,
               (SELECT string_agg(DISTINCT n.parse_error, '; ') FROM notes n
                WHERE n.call_id = m.call_id) AS parse_fallback
        FROM mine m ORDER BY m.started_at, m.call_id""",
                 {"run": run_id, "step": int(step), "ex": example_id})


def node_history(db: str | Path, run_id: str, node_id: str) -> dict[str, pd.DataFrame]:
    """A node's prompt history: `edits`, one row per step that proposed an update (and
    per candidate under --proposals: `candidate`, from 0) (old and new prompt, accepted,
    validation before/after, the edit's score alone, the reason for a rejection), and
    `flips`, the examples whose pass/fail state each accepted edit changed: validation in
    the step's gate pass against the validation before it, training from the step to the
    next (the first trained with the edit)."""
    params = {"run": run_id, "node": node_id}
    with connect(db, read_only=True) as con:
        edits = con.execute("""
            SELECT u.step, u.accepted, u.old_prompt, u.new_prompt, u.val_before, u.val_after,
                   u.val_alone, u.reject_reason, u.reasoning, u.parse_error,
                   p.version, coalesce(u.candidate, 0) AS candidate
            FROM updates u
            LEFT JOIN prompt_versions p ON p.run_id = u.run_id AND p.node_id = u.node_id
                 AND p.step = u.step AND p.prompt = u.new_prompt
            WHERE u.run_id = $run AND u.node_id = $node
            ORDER BY u.step, coalesce(u.candidate, 0)""", params).df()
        # Validation is scored in the step's own gate pass (the kept candidate's, with the
        # edit): it flips against the validation in force before (the last accepted step's,
        # or the baseline's). Training is scored before each step's update: it flips at the
        # next step, the first run with the edit (none when the run ended there).
        flips = con.execute(f"""
            WITH states AS (
                SELECT step, split, example_id, score, {_FAILING} AS failing
                FROM losses l WHERE run_id = $run),
            accepted AS (
                SELECT DISTINCT u.step, (SELECT max(s.step) FROM steps s WHERE s.run_id = $run
                                         AND s.step < u.step AND (s.accepted OR s.step = 0))
                                        AS before
                FROM updates u WHERE u.run_id = $run AND u.node_id = $node AND u.accepted)
            SELECT u.step, a.split, a.example_id, a.score AS score_before,
                   b.score AS score_after, CASE WHEN a.failing THEN 'fixed' ELSE 'broke' END
                   AS flipped
            FROM accepted u
            JOIN states a ON CASE WHEN a.split = 'val' THEN a.step = u.before
                                  ELSE a.step = u.step END
            JOIN states b ON b.split = a.split AND b.example_id = a.example_id
                 AND b.failing <> a.failing
                 AND b.step = CASE WHEN a.split = 'val' THEN u.step ELSE u.step + 1 END
            ORDER BY u.step, a.split, a.example_id""", params).df()
    return {"edits": edits, "flips": flips}


def compare_rows(db: str | Path, run_a: str, run_b: str, step_a: int, step_b: int
                 ) -> pd.DataFrame:
    """The examples both runs scored with the prompts in effect after the compared step
    (run A after step_a, B after step_b): each run's prediction and score, whether each
    back-propagated it at that step, and whether they disagree (different pass/fail state
    or different prediction).

    A step scores training at its start, before its update, and validation in its gate
    pass: so each example's row is the latest logged pass in which every node ran with the
    versions accepted up to the step (`step_a` and `step_b` say which step's pass that
    was). A step that kept an edit is scored on train at the next step; the last step's
    edits never are, and those training examples are left out rather than compared under
    the prompts before the edit. A loss with no logged node outputs counts at its own step."""
    return query(db, """
        WITH sides AS (
            SELECT * FROM (VALUES ('a', $a, $sa), ('b', $b, $sb)) t(side, run_id, step)),
        kept AS (  -- per side and node, the prompt version in effect after the step
            SELECT s.side, v.run_id, v.node_id, v.version
            FROM sides s JOIN prompt_versions v ON v.run_id = s.run_id AND v.step <= s.step
            WHERE v.accepted
            QUALIFY row_number() OVER (PARTITION BY s.side, v.node_id
                                       ORDER BY v.step DESC, v.version DESC) = 1),
        passes AS (  -- per side, each logged pass over an example: all nodes on those versions
            SELECT s.side, o.step, o.split, o.example_id,
                   bool_and(coalesce(o.prompt_version = k.version, true)) AS matches
            FROM sides s JOIN node_outputs o ON o.run_id = s.run_id
            LEFT JOIN kept k ON k.side = s.side AND k.node_id = o.node_id
            GROUP BY ALL),
        side AS (
            SELECT s.side, l.split, l.example_id, l.step, l.target, l.prediction, l.score,
                   (l.error IS NOT NULL OR coalesce(l.score, 0) < 1) AS failing,
                   EXISTS (SELECT 1 FROM gradients g WHERE g.run_id = l.run_id
                           AND g.step = s.step AND g.example_id = l.example_id
                           AND g.kind IN ('gradient', 'target')) AS backpropagated
            FROM sides s JOIN losses l ON l.run_id = s.run_id
            LEFT JOIN passes p ON p.side = s.side AND p.step = l.step AND p.split = l.split
                 AND p.example_id = l.example_id
            WHERE coalesce(p.matches, l.step = s.step)
            QUALIFY row_number() OVER (PARTITION BY s.side, l.split, l.example_id
                                       ORDER BY l.step DESC) = 1)
        SELECT a.split, a.example_id, a.target, a.prediction AS prediction_a,
               a.score AS score_a,
               b.prediction AS prediction_b, b.score AS score_b,
               a.backpropagated AS backprop_a, b.backpropagated AS backprop_b,
               (a.failing <> b.failing OR coalesce(a.prediction, '') <>
                coalesce(b.prediction, '')) AS disagree,
               a.step AS step_a, b.step AS step_b
        FROM side a JOIN side b ON a.split = b.split AND a.example_id = b.example_id
        WHERE a.side = 'a' AND b.side = 'b'
        ORDER BY CASE a.split WHEN 'train' THEN 0 WHEN 'val' THEN 1 ELSE 2 END,
                 a.example_id""",
                 {"a": run_a, "b": run_b, "sa": int(step_a), "sb": int(step_b)})


def steps_with_gradients(db: str | Path, run_id: str) -> list[int]:
    """The steps at which the run sent gradients (gtbp: targets) back through the graph."""
    frame = query(db, """
        SELECT DISTINCT step FROM gradients WHERE run_id = ? AND kind IN ('gradient', 'target')
        ORDER BY step""", [run_id])
    return [int(s) for s in frame["step"]]


def backward_calls(db: str | Path, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    """The gradients (gtbp: targets) one example produced at one step, each with the
    backward call that wrote it: the exact prompt (messages) and reply."""
    return query(db, """
        SELECT g.node_id, g.from_node_id, g.kind, g.method, g.content, g.call_id,
               c.messages, c.response
        FROM gradients g LEFT JOIN llm_calls c ON c.call_id = g.call_id
        WHERE g.run_id = ? AND g.step = ? AND g.example_id = ?
          AND g.kind IN ('gradient', 'target')
        ORDER BY g.node_id, g.from_node_id""", [run_id, int(step), example_id])


def test_scores(db: str | Path) -> pd.DataFrame:
    """The test-split score of each run that evaluated one (metrics key `test_score`)."""
    return query(db, """
        SELECT run_id, arg_max(value, coalesce(step, -1)) AS test_score FROM metrics
        WHERE key = 'test_score' GROUP BY run_id""")


def forks(db: str | Path, run_id: str) -> list[str]:
    """The runs forked from `run_id` (runs.parent_run_id), newest first."""
    frame = query(db, "SELECT run_id FROM runs WHERE parent_run_id = ? "
                      "ORDER BY started_at DESC", [run_id])
    return list(frame["run_id"])
