"""Queries of probes and blame (engine/probes/): the logged run a probe starts from, its
results written back, which steps to pool, which examples were back-propagated, and what
became of each proposal."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.events import same_prompt
from engine.runlog.schema import connect, dict_rows, write
from engine.runlog.snapshot import run_snapshot
from engine.runlog.writer import insert_rows


def optimization_steps(db: str | Path, run_id: str) -> list[int]:
    """Complete steps that ran a backward pass (step 0 is the initial evaluation)."""
    with connect(db, read_only=True) as con:
        return [r[0] for r in con.execute(
            "SELECT step FROM steps WHERE run_id = ? AND step > 0 ORDER BY step",
            [run_id]).fetchall()]


def chosen_updates(updates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Of a step's update rows (several per node under --proposals), the one per node whose
    edit blame probes: the kept candidate's, else the best-scored one that changed the
    prompt (`same_prompt`: whitespace aside, an empty proposal changes nothing), else the
    first. The one rule: step_proposal, the verdict and the Prompt history page use it."""
    def known(value: Any) -> bool:  # not NULL (None, or a frame's NaN)
        return value is not None and value == value

    def order(u: dict[str, Any]) -> tuple:
        kept = known(u.get("accepted")) and bool(u.get("accepted"))
        changed = not same_prompt(u.get("old_prompt"), u.get("new_prompt"))
        score = u.get("val_after")
        candidate = u.get("candidate")
        return (not kept, not changed, not known(score),
                -float(score) if known(score) else 0.0,
                int(candidate) if known(candidate) else 0)

    chosen: dict[str, dict[str, Any]] = {}
    for u in sorted(updates, key=order):
        chosen.setdefault(u["node_id"], u)
    return list(chosen.values())


def _chosen_update(db: str | Path, run_id: str, step: int, node_id: str
                   ) -> tuple[dict[str, Any] | None, int]:
    """The node's chosen update at the step (`chosen_updates`) and the step's count of
    candidate prompt sets."""
    with connect(db, read_only=True) as con:
        rows = dict_rows(con, "SELECT node_id, old_prompt, new_prompt, reject_reason, "
                              "coalesce(candidate, 0) AS candidate, accepted, val_after "
                              "FROM updates WHERE run_id = ? AND step = ? AND node_id = ?",
                         [run_id, step, node_id])
        candidates = con.execute("SELECT count(DISTINCT coalesce(candidate, 0)) FROM updates "
                                 "WHERE run_id = ? AND step = ?", [run_id, step]).fetchone()[0]
    chosen = chosen_updates(rows)
    return (chosen[0] if chosen else None), int(candidates or 0)


def step_proposal(db: str | Path, run_id: str, step: int, node_id: str
                  ) -> tuple[str, str, str] | None:
    """(old prompt, new prompt, reject reason) of the node's chosen update at the step."""
    row, _ = _chosen_update(db, run_id, step, node_id)
    return None if row is None else (row["old_prompt"] or "", row["new_prompt"] or "",
                                     row["reject_reason"] or "")


def proposal_origin(db: str | Path, run_id: str, step: int, node_id: str) -> str | None:
    """Where `step_proposal`'s edit comes from when a step wrote several candidate prompt
    sets and that edit is not in the kept one: 'candidate 2 of 2, not kept (its prompt
    set scored 0.208 on validation)'. None for the kept candidate's edit, and for a step
    with one candidate."""
    row, candidates = _chosen_update(db, run_id, step, node_id)
    if row is None or candidates < 2 or row["accepted"]:
        return None
    score = row["val_after"]
    scored = "" if score is None else f" (its prompt set scored {score:.3f} on validation)"
    return f"candidate {row['candidate'] + 1} of {candidates}, not kept{scored}"


def running_runs(db: str | Path) -> list[str]:
    """Runs whose status is still `running` (a process may be writing them)."""
    with connect(db, read_only=True) as con:
        return [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE status = 'running'").fetchall()]


def logged_run_rows(db: str | Path, run_id: str, step: int) -> dict[str, Any] | None:
    """What a probe needs of a run: its config (parsed) and graph text, its complete steps,
    its examples (split, id, fields parsed, target) in dataset order, the prompt versions
    accepted before `step` in the order written, and the runs still running. None when the
    run does not exist."""
    with connect(db, read_only=True) as con:
        snap = run_snapshot(con, run_id)
        running = [r[0] for r in con.execute(
            "SELECT run_id FROM runs WHERE status = 'running'").fetchall()]
    if snap is None:
        return None
    through = max(step - 1, 0)
    versions = [(n, v, p) for n, v, p, s in snap.versions if s <= through]
    return {"config": snap.config, "graph_yaml": snap.graph_yaml, "steps": snap.steps,
            "examples": snap.examples, "versions": versions, "running": running}


def save_probe_rows(db: str | Path, calls: list[dict], probes: list[dict],
                    outputs: list[dict], cache_rows: list[dict]) -> None:
    """A probe's calls, probe rows, re-computed outputs and new cache entries, in one
    transaction (retried while a running run holds the file)."""
    def body(con: Any) -> None:
        insert_rows(con, "llm_calls", calls)
        insert_rows(con, "probes", probes)
        insert_rows(con, "probe_outputs", outputs)
        insert_rows(con, "llm_cache", cache_rows)

    write(db, body)


def example_outputs(db: str | Path, run_id: str, example_id: str, step: int
                    ) -> tuple[list[tuple], dict[tuple[int, str], tuple[float, str]]]:
    """One example's logged node outputs, its own step first then the latest (step, split,
    node, prompt version, input, output, error, raw text, parse error, call id), and its
    losses by (step, split): (score, prediction)."""
    with connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT step, split, node_id, prompt_version, input_text, output_text, error, "
            "raw_text, parse_error, call_id FROM node_outputs WHERE run_id = ? AND "
            "example_id = ? ORDER BY step = ? DESC, step DESC",
            [run_id, example_id, step]).fetchall()
        losses = {(r[0], r[1]): (r[2], r[3]) for r in con.execute(
            "SELECT step, split, score, prediction FROM losses WHERE run_id = ? AND "
            "example_id = ?", [run_id, example_id]).fetchall()}
    return rows, losses


def aggregate_gradients(db: str | Path, run_id: str, step: int) -> dict[tuple[str, str], str]:
    """(example, node) -> the aggregated gradient the node acted on at the step."""
    with connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT example_id, node_id, content FROM gradients WHERE run_id = ? AND step = ? "
            "AND kind = 'aggregate'", [run_id, step]).fetchall()
    return {(e, n): c or "" for e, n, c in rows}


def recorded_claims(db: str | Path, run_id: str, step: int
                    ) -> dict[tuple[str, str], tuple[bool, str]]:
    """(example, node) -> (the node's received gradients ask it to change, where that was
    read), from the claims recorded at backward time; logs older than the claim columns
    (and rows without a claim) are left out. A node is asked to change when any one of its
    successors' gradients asks."""
    with connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT example_id, node_id, bool_or(asks_change), "
            "string_agg(DISTINCT claim_source, '; ' ORDER BY claim_source) FROM gradients "
            "WHERE run_id = ? AND step = ? AND kind = 'gradient' AND asks_change IS NOT NULL "
            "GROUP BY example_id, node_id", [run_id, step]).fetchall()
    return {(e, n): (bool(a), f"recorded ({s})") for e, n, a, s in rows}


def backpropagated_rows(db: str | Path, run_id: str, step: int
                        ) -> tuple[list[str], list[tuple[str, float, str | None]]]:
    """(examples that received gradients at the step, in dataset order; when there are none,
    the step's training losses in dataset order as (example, score, error))."""
    with connect(db, read_only=True) as con:
        rows = con.execute(
            "SELECT DISTINCT g.example_id, e.position FROM gradients g JOIN examples e ON "
            "e.run_id = g.run_id AND e.example_id = g.example_id WHERE g.run_id = ? AND "
            "g.step = ? ORDER BY e.position", [run_id, step]).fetchall()
        losses = [] if rows or step == 0 else con.execute(
            "SELECT l.example_id, l.score, l.error FROM losses l JOIN examples e ON "
            "e.run_id = l.run_id AND e.example_id = l.example_id AND e.split = 'train' "
            "WHERE l.run_id = ? AND l.step = ? AND l.split = 'train' ORDER BY e.position",
            [run_id, step]).fetchall()
    return [r[0] for r in rows], [tuple(r) for r in losses]


def sampled_examples(db: str | Path, run_id: str, step: int,
                     config: dict[str, Any] | None = None) -> list[str]:
    """Examples whose loss was back-propagated at the step (the update call saw them), in
    dataset order. A method that writes no gradients (`none`) leaves no trace of them: the
    optimizer's seeded sample is drawn again from the step's logged training losses, with
    the run's `failures_per_step` and `seed` (`config`, read from the log when not given).
    `blame` marks edit probes on these examples in-sample, and the pages leave them out of
    the edit counts the same way."""
    from engine.core.optimizer import sample_failures
    from engine.events import LossRecord

    rows, losses = backpropagated_rows(db, run_id, step)
    if rows or not losses:
        return rows
    if config is None:
        with connect(db, read_only=True) as con:
            found = con.execute("SELECT config FROM runs WHERE run_id = ?", [run_id]).fetchone()
        config = json.loads(found[0]) if found and found[0] else {}
    records = [LossRecord(run_id, step, "train", e, "", "", s, "", err) for e, s, err in losses]
    chosen = sample_failures(records, int(config.get("failures_per_step", 2)),
                             int(config.get("seed", 0)), step)
    return [losses[i][0] for i in chosen]


def run_paces(db: str | Path, run_id: str) -> tuple[float, float] | None:
    """(forward, optimizer): seconds of wall time per model call of each kind (cache hits
    left out) over the run's timed steps, concurrency included. The steps' wall time is
    shared between the two kinds by the time their calls spent at the model (latency less
    the wait for a turn): on the embedded pair an optimizer call takes many times a forward
    call, so one pace for both misjudges work made mostly of one kind. A kind the run never
    called takes the other's pace. Probes' calls (logged at the step they probe, made after
    it) are left out. None when the run made no model call in a timed step."""
    with connect(db, read_only=True) as con:
        wall = con.execute("SELECT sum(ended_at - started_at) FROM steps WHERE run_id = ? "
                           "AND ended_at > started_at", [run_id]).fetchone()[0]
        rows = con.execute(
            "SELECT purpose = 'forward', count(*), "
            "sum(greatest(coalesce(latency_ms, 0) - coalesce(queued_ms, 0), 0)) "
            "FROM llm_calls c WHERE run_id = $run AND NOT coalesce(cache_hit, false) "
            "AND purpose <> 'probe' AND step "
            "IN (SELECT step FROM steps WHERE run_id = $run AND ended_at > started_at) "
            "GROUP BY 1", {"run": run_id}).fetchall()
    if not wall or not rows:
        return None
    busy = sum(float(b or 0) for _, _, b in rows)
    calls = sum(int(n) for _, n, _ in rows)
    paces = {bool(kind): (wall * float(b or 0) / busy / n if busy else wall / calls)
             for kind, n, b in rows if n}
    forward = paces.get(True, paces.get(False))
    optimizer = paces.get(False, forward)
    return (forward, optimizer) if forward is not None else None


def step_failing(db: str | Path, run_id: str, step: int) -> dict[str, tuple[int, int]]:
    """Per split, (failing, scored) examples in the step's logged losses."""
    with connect(db, read_only=True) as con:
        rows = con.execute("SELECT split, count(*) FILTER (WHERE score < 1), count(*) FROM "
                           "losses WHERE run_id = ? AND step = ? GROUP BY split",
                           [run_id, step]).fetchall()
    return {split: (int(failing), int(total)) for split, failing, total in rows}
