"""What earlier runs of a graph recorded, for the estimate before a new run
(engine/runs/call_sizes.py): reply and prompt sizes, gradient lengths, the share of steps
accepted, how often a pass repeats its own requests, and a local model's speed."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from engine.runlog.reader import query


def call_size_history(db: str | Path, graph_name: str, limit: int = 5000) -> pd.DataFrame:
    """What the model calls of earlier runs of a graph (by name) sent and received, newest
    runs first, at most `limit` calls that reached the model and succeeded: per call its
    purpose, node, backend, model, the characters of its messages' contents, its prompt
    and completion tokens, its latency and (forward calls) the output it passed on."""
    return query(db, """
        SELECT c.purpose, c.node_id, c.backend, c.model, c.prompt_tokens,
               c.completion_tokens, c.latency_ms,
               length(array_to_string(CAST(json_extract_string(c.messages, '$[*].content')
                   AS VARCHAR[]), '')) AS prompt_chars,
               (SELECT any_value(length(o.output_text)) FROM node_outputs o
                WHERE o.run_id = c.run_id AND o.call_id = c.call_id) AS output_chars
        FROM llm_calls c JOIN runs r ON r.run_id = c.run_id
        WHERE r.graph_name = ? AND NOT c.cache_hit AND c.error IS NULL
              AND c.completion_tokens > 0
        ORDER BY r.started_at DESC LIMIT ?""", [graph_name, limit])


def model_call_history(db: str | Path, models: list[str], limit: int = 5000) -> pd.DataFrame:
    """What the model calls of earlier runs on one of `models`, of any graph, sent and
    received (newest runs first, at most `limit` calls that reached the model and
    succeeded): per call its purpose, prompt and completion tokens and the characters of
    its messages. How long this model's replies of each kind run, and how many characters
    its tokenizer puts in a token: properties of the model, not of one graph."""
    return query(db, """
        SELECT c.purpose, c.prompt_tokens, c.completion_tokens,
               length(array_to_string(CAST(json_extract_string(c.messages, '$[*].content')
                   AS VARCHAR[]), '')) AS prompt_chars
        FROM llm_calls c JOIN runs r ON r.run_id = c.run_id
        WHERE list_contains(?, c.model) AND NOT c.cache_hit AND c.error IS NULL
              AND c.completion_tokens > 0
        ORDER BY r.started_at DESC LIMIT ?""", [models, limit])


def gradient_size_history(db: str | Path, graph_name: str) -> dict[str, float]:
    """The mean length in characters of the gradients each node received in earlier runs
    of a graph (by name)."""
    frame = query(db, """
        SELECT g.node_id, avg(length(g.content)) AS chars FROM gradients g
        JOIN runs r ON r.run_id = g.run_id WHERE r.graph_name = ? GROUP BY g.node_id""",
                  [graph_name])
    return {row.node_id: float(row.chars) for row in frame.itertuples(index=False)}


def accepted_share(db: str | Path, graph_name: str) -> tuple[int, int]:
    """(optimization steps accepted, optimization steps) over earlier runs of a graph (by
    name): which share of steps passes the gate."""
    row = query(db, """
        SELECT count(*) FILTER (WHERE s.accepted) AS accepted, count(*) AS steps FROM steps s
        JOIN runs r ON r.run_id = s.run_id WHERE r.graph_name = ? AND s.step > 0""",
                [graph_name]).iloc[0]
    return int(row["accepted"]), int(row["steps"])


def forward_distinct_share(db: str | Path, graph_name: str) -> tuple[int, int]:
    """(distinct requests, forward calls) over the evaluation passes of earlier runs of a
    graph (by name), per run, step, split and node: how often a node's calls within one
    pass repeat each other (a node that reads only another node's short output often
    sends the same request for several examples, answered once)."""
    row = query(db, """
        WITH passes AS (
            SELECT count(DISTINCT c.cache_key) AS distinct_keys, count(*) AS calls
            FROM node_outputs o JOIN llm_calls c ON c.call_id = o.call_id
            JOIN runs r ON r.run_id = o.run_id
            WHERE r.graph_name = ? AND c.purpose = 'forward'
            GROUP BY o.run_id, o.step, o.split, o.node_id)
        SELECT coalesce(sum(distinct_keys), 0), coalesce(sum(calls), 0) FROM passes""",
                [graph_name]).iloc[0]
    return int(row.iloc[0]), int(row.iloc[1])


def later_validation_share(db: str | Path, graph_name: str) -> tuple[int, int]:
    """(new requests, forward calls) over the validation passes of earlier runs of a graph
    (by name) after step 0: its candidates' and per-node gates' passes. A request is new
    unless the run sent it earlier in the same step (a second candidate repeating the
    first's edit) or in step 0 (a node no edit reaches asks what the starting prompts
    asked). A request repeating one of an earlier step's proposals counts as new: whether
    the optimizer proposes again what it tried depends on the run's rejections, and a fork's
    steps propose from other prompts. Hits on other runs' replies count as new, so a run on
    a log that already holds its replies does not make the next estimate cheaper than its
    own calls were."""
    row = query(db, """
        WITH calls AS (
            SELECT c.run_id, c.step, c.cache_key, e.split
            FROM llm_calls c JOIN runs r ON r.run_id = c.run_id
            LEFT JOIN examples e ON e.run_id = c.run_id AND e.example_id = c.example_id
            WHERE r.graph_name = ? AND c.purpose = 'forward' AND c.cache_key IS NOT NULL),
        firsts AS (SELECT run_id, cache_key, min(step) AS first_step FROM calls GROUP BY ALL),
        passes AS (
            SELECT count(DISTINCT c.cache_key) FILTER (WHERE f.first_step > 0) AS new,
                   count(*) AS calls
            FROM calls c JOIN firsts f USING (run_id, cache_key)
            WHERE c.step > 0 AND c.split = 'val' GROUP BY c.run_id, c.step)
        SELECT coalesce(sum(new), 0), coalesce(sum(calls), 0) FROM passes""",
                [graph_name]).iloc[0]
    return int(row.iloc[0]), int(row.iloc[1])


def local_step_throughput(db: str | Path, models: list[str]) -> tuple[float, int, int]:
    """(seconds, prompt tokens, completion tokens) summed over the finished steps of earlier
    runs, of any graph, whose model calls ran on the local backend with one of `models`:
    the model's speed on this machine as a run sees it (calls waiting for a context
    included)."""
    row = query(db, """
        WITH per_step AS (
            SELECT c.run_id, c.step, sum(c.prompt_tokens) AS prompt,
                   sum(c.completion_tokens) AS completion
            FROM llm_calls c
            WHERE c.backend = 'local' AND NOT c.cache_hit AND list_contains(?, c.model)
            GROUP BY c.run_id, c.step)
        SELECT coalesce(sum(s.ended_at - s.started_at), 0), coalesce(sum(p.prompt), 0),
               coalesce(sum(p.completion), 0)
        FROM per_step p JOIN steps s ON s.run_id = p.run_id AND s.step = p.step
        WHERE s.ended_at IS NOT NULL""", [models]).iloc[0]
    return float(row.iloc[0]), int(row.iloc[1]), int(row.iloc[2])
