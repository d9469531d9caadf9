"""What `run` and `resume` print when a run ends: the table of steps (scores, edits,
calls, tokens, cost, cache hits), validation before and after with its intervals, the
cost by phase, and what the per-node gates and pruning did."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from rich.table import Table

from engine.console import out
from engine.data.stats import bracketed, score_interval
from engine.events import CallRecord, Proposal, StepFinished


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def hand_set(step: StepFinished) -> int:
    """Prompts a fork set by hand at the step it starts from (0 for any other step)."""
    return int(step.metrics.get("forked_prompts_edited", 0))


def changes(accepted: int, step: StepFinished) -> str:
    """', 2 edits accepted' (the step's accepted proposals, as the summary counts them)
    and ', 1 prompt set by hand' (a fork's starting step); '' when neither."""
    parts = [f"{plural(accepted, 'edit')} accepted"] if accepted else []
    if hand_set(step):
        parts.append(f"{plural(hand_set(step), 'prompt')} set by hand")
    return "".join(f", {part}" for part in parts)


def print_summary(result: Any, db: str = "runs.duckdb",
                  phase_of: dict[str, str] | None = None) -> None:
    """Per step: score, accepted edits, model calls (cache misses) and their tokens and
    cost, cache hits apart (free); each edit an accepted step dropped (its gain did not
    need it) and why; then the same per phase (the progress line's phases, from
    `phase_of`: call id -> phase; else the call's purpose), and the totals. A run that did
    not finish (stopped, out of budget, failed) ends with the command that resumes it."""
    per_step: dict[int, list] = defaultdict(lambda: [0, 0, 0, 0.0, False])
    per_phase: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0.0, False])
    for call in result.events.of(CallRecord):
        phase = (phase_of or {}).get(call.call_id, call.purpose)
        for row in (per_step[call.step], per_phase[phase]):
            if call.cache_hit:
                row[2] += 1
                continue
            row[0] += 1
            row[1] += call.prompt_tokens + call.completion_tokens
            row[3] += call.cost_usd or 0.0
            row[4] = row[4] or call.cost_usd is None  # an unpriced model: cost unknown
    edits: dict[int, int] = defaultdict(int)
    for p in result.events.of(Proposal):
        edits[p.step] += int(p.accepted)
    n_val = split_sizes(db, result.run_id).get("val", 0)
    table = Table("step", "train", "val", "val 95%", "accepted edits", "model calls", "tokens",
                  "cost $", "cache hits", title=f"run {result.run_id}: {result.status}")
    for s in result.events.of(StepFinished):
        calls, tokens, hits, cost, unknown = per_step[s.step]
        bounds = score_interval(s.val_score, n_val)
        table.add_row(str(s.step), fmt(s.train_score), fmt(s.val_score),
                      bracketed(bounds) if bounds else "", str(edits[s.step]),
                      str(calls), str(tokens), money(cost, unknown), str(hits))
    if table.row_count:
        out.print(table)
        said = validation_change(list(result.events.of(StepFinished)), n_val)
        if said:
            out.print(said, markup=False, highlight=False)
    else:  # stopped during its first step: nothing of it was written
        out.print(f"run {result.run_id}: {result.status}; no step finished in this session",
                  markup=False, highlight=False)
    for s in result.events.of(StepFinished):
        if hand_set(s):
            out.print(f"step {s.step}: the fork's starting state, "
                      f"{plural(hand_set(s), 'prompt')} set by hand (not counted as "
                      "accepted edits)", markup=False, highlight=False)
    from engine.core.optimizer import PRUNED_REASON

    for p in result.events.of(Proposal):  # edits an accepted step's gain did not need
        if (p.reject_reason or "").startswith(f"{PRUNED_REASON}: "):
            why = p.reject_reason[len(PRUNED_REASON) + 2:].replace("this edit", "it", 1)
            out.print(f"step {p.step}: dropped the edit of {p.node_id}: {why}", markup=False,
                      highlight=False)
    phases = ", ".join(f"{phase} {calls} calls {tokens} tokens {money(cost, unknown)}"
                       + (f" ({plural(hits, 'cache hit')})" if hits else "")
                       for phase, (calls, tokens, hits, cost, unknown) in per_phase.items())
    if phases:
        out.print(f"per phase: {phases}", markup=False, highlight=False)
    stats = result.stats
    line = (f"calls {stats.calls} (cache hits {stats.cache_hits}, retries {stats.retries}, "
            f"failed {stats.failures}); tokens {stats.prompt_tokens + stats.completion_tokens}")
    if result.test_score is not None:
        line += f"; test score {fmt(result.test_score)}"
    out.print(line)
    if getattr(result, "reason", None):
        out.print(f"stopped: {result.reason}", markup=False, highlight=False)
    if result.status != "finished":
        out.print(f"to continue it: python -m engine resume {result.run_id} --db {db}",
                  markup=False, highlight=False)
    gates = steps_with(result, "node_gate_calls")
    if gates:
        out.print(f"per-node gates: {plural(len(gates), 'step')} scored edits alone, "
                  f"{sum(m['node_gate_calls'] for m in gates):.0f} calls "
                  f"({sum(m['node_gate_model_calls'] for m in gates):.0f} to the model), "
                  f"{sum(m['node_gate_seconds'] for m in gates):.1f} s")
    pruned = steps_with(result, "prune_calls")
    if pruned:
        out.print(f"pruning: {plural(len(pruned), 'accepted step')}, each edit left out "
                  f"in turn: {sum(m['edits_pruned'] for m in pruned):.0f} dropped, "
                  f"{sum(m['prune_calls'] for m in pruned):.0f} calls "
                  f"({sum(m.get('prune_model_calls', 0) for m in pruned):.0f} to the model), "
                  f"{sum(m.get('prune_seconds', 0) for m in pruned):.1f} s")


def steps_with(result: Any, metric: str) -> list[dict[str, float]]:
    """The metrics and timings of each step that logged `metric`."""
    return [{**s.metrics, **s.timings} for s in result.events.of(StepFinished)
            if metric in s.metrics]


def money(cost: float, unknown: bool) -> str:
    return "unknown" if unknown else f"${cost:.4f}"


def split_sizes(db: str, run_id: str) -> dict[str, int]:
    from engine.runlog.reader import split_sizes
    from engine.runlog.schema import RunLogError

    try:
        return split_sizes(db, run_id)
    except RunLogError:  # no run log to read (a run that wrote nothing): no interval
        return {}


def validation_change(steps: list[StepFinished], n: int) -> str | None:
    """Validation at the first and the last step this session finished, on `n` examples,
    each with its 95% interval, and whether the two overlap: the gate keeps any rise, and
    on a few examples a small one can be chance. None for fewer than two steps."""
    scored = [(s, bounds) for s in steps if (bounds := score_interval(s.val_score, n))]
    if len(scored) < 2:
        return None
    (first, a), (last, b) = scored[0], scored[-1]
    head = (f"validation {first.val_score:.3f} at step {first.step} -> {last.val_score:.3f} at "
            f"step {last.step}, on {n} examples; 95% intervals {bracketed(a)} and "
            f"{bracketed(b)}")
    if last.val_score <= first.val_score:
        return f"{head}: no rise"
    if b[0] > a[1]:
        return f"{head}: they do not overlap"
    return f"{head}: they overlap, so the rise may be chance"


def fmt(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"

