"""What a run needs back from the log: the reply cache, and the state to resume from."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.core.forward import Prompts
from engine.core.optimizer import OptimizerState
from engine.llm.base import LLMReply
from engine.llm.cache import Cache
from engine.runlog.schema import RunLogError, check_readable, connect, dict_rows, log_exists


def run_exists(path: str, run_id: str) -> bool:
    with connect(path, read_only=True) as con:
        return con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] > 0


def lake_cache_since(db: str, cache: Cache, snapshot: int) -> int:
    """Over a lake, the replies other writers committed after `snapshot` join `cache` (a
    call another machine paid for while this run went on is a hit from the next step on);
    returns the snapshot read up to."""
    from engine.runlog.lake import ALIAS

    with connect(db, read_only=True) as con:
        now = con.execute(f"SELECT id FROM {ALIAS}.current_snapshot()").fetchone()[0]
        if now <= snapshot or cache.mode == "off":
            return now
        rows = con.execute(
            "SELECT key, response, prompt_tokens, completion_tokens, model FROM "
            f"ducklake_table_insertions('{ALIAS}', 'main', 'llm_cache', ?, ?)",
            [snapshot + 1, now]).fetchall()
    for k, r, p, c, m in rows:
        cache.entries.setdefault(k, LLMReply(r, p or 0, c or 0, m or ""))
    return now


def load_cache(path: str, mode: str) -> Cache:
    cache = Cache(mode)
    if mode == "off" or not log_exists(path):
        return cache
    with connect(path, read_only=True) as con:
        rows = con.execute("SELECT key, response, prompt_tokens, completion_tokens, model "
                           "FROM llm_cache").fetchall()
    cache.entries = {k: LLMReply(r, p or 0, c or 0, m or "") for k, r, p, c, m in rows}
    return cache


@dataclass
class ResumePoint:
    """A logged run as `engine resume` needs it."""

    config: dict[str, Any]
    status: str
    graph_yaml: str
    examples: list[dict]
    state: OptimizerState | None  # after the last complete step; None before step 0
    test_done: bool  # the final test evaluation is already logged


def load_resume_state(path: str, run_id: str, at_step: int | None = None) -> ResumePoint:
    """The state after the run's last complete step, or after `at_step` (forks)."""
    check_readable(path)
    with connect(path, read_only=True) as con:
        run = con.execute("SELECT config, status, graph_yaml FROM runs WHERE run_id = ?",
                          [run_id]).fetchone()
        if run is None:
            raise RunLogError(f"{path}: no run '{run_id}' (see: python -m engine runs --db {path})")
        config, status, graph_yaml = json.loads(run[0]), run[1], run[2]
        examples = dict_rows(con, "SELECT split, example_id, position, fields, target "
                                  "FROM examples WHERE run_id = ?", [run_id])
        last = con.execute("SELECT step, val_score, train_score FROM steps WHERE run_id = ? "
                           "AND step <= ? ORDER BY step DESC LIMIT 1",
                           [run_id, 2**31 - 1 if at_step is None else at_step]).fetchone()
        if last is None:
            return ResumePoint(config, status, graph_yaml, examples, None, False)
        versions = dict_rows(con, "SELECT node_id, version, prompt, accepted "
                                  "FROM prompt_versions WHERE run_id = ? AND step <= ? "
                                  "ORDER BY version", [run_id, last[0]])
        # only proposals rejected since the node's prompt last changed are still relevant
        rejected_rows = con.execute(
            "SELECT r.node_id, r.prompt FROM prompt_versions r WHERE r.run_id = ? AND r.step "
            "BETWEEN 1 AND ? AND NOT r.accepted AND r.step > (SELECT coalesce(max(a.step), 0) "
            "FROM prompt_versions a WHERE a.run_id = r.run_id AND a.node_id = r.node_id AND "
            "a.accepted AND a.step <= ?) ORDER BY r.step, r.version",
            [run_id, last[0], last[0]]).fetchall()
        has_test = con.execute("SELECT count(*) FROM metrics WHERE run_id = ? AND key = "
                               "'test_score'", [run_id]).fetchone()[0] > 0
    text: dict[str, str] = {}
    version: dict[str, int] = {}
    next_version: dict[str, int] = {}
    for row in versions:
        node = row["node_id"]
        next_version[node] = max(next_version.get(node, 0), row["version"] + 1)
        if row["accepted"]:
            text[node], version[node] = row["prompt"], row["version"]
    rejected: dict[str, list[str]] = {n: [] for n in text}
    for node, prompt in rejected_rows:
        rejected.setdefault(node, []).append(prompt)
    state = OptimizerState(int(last[0]), Prompts(text, version), last[1], last[2], next_version,
                           rejected)
    return ResumePoint(config, status, graph_yaml, examples, state, has_test)


