"""What a blame will cost before it starts: the probes planned and their model calls,
from a plan (`blame_estimate`) or from the run log alone (`estimate_from_log`, the
dashboard's button), and the time at the run's own paces."""

from __future__ import annotations

from typing import Any

from engine.probes.plan import BlamePlan
from engine.probes.probe import (
    descendants,
    load_run,
)
from engine.probes.selection import backpropagated
from engine.runlog.probing import (
    run_paces,
    step_failing,
)
from engine.runs.estimate import duration


def blame_estimate(plans: list[BlamePlan], draws: int, adaptive: bool) -> str:
    """One line before the first probe: the probes planned, their model calls (a gradient
    probe: its rewrite, an optimizer call, and the nodes below; an edit probe: the node and
    those below; an example whose gradients are still to compute: about an optimizer call
    per node; cached calls count too) and the time at the run's own paces (`run_paces`)."""
    forward = optimizer = probes = 0
    for plan in plans:
        below = _llm_below(plan.run.graph, plan.nodes)
        for job in plan.jobs:
            probes += draws
            forward += draws * below[job["node_id"]]
            if job["kind"] == "gradient":
                optimizer += draws
            else:
                forward += draws
        optimizer += len(plan.pending) * len(plan.nodes)
    run = plans[0].run
    return _estimate_line(probes, forward, optimizer, run_paces(run.db, run.run_id), adaptive)


def estimate_from_log(db: str, run_id: str, step: int, examples: str = "failing",
                      adaptive: bool = True) -> str:
    """The line `blame_estimate` prints, before any model call, from the run log alone (the
    dashboard's button shows it): the step's logged failing examples of the chosen split,
    one gradient and one edit probe each per LLM node, and each edit on the passing
    validation examples; an upper bound, as blame's own plan is. Blame probes the prompts
    in force when the step began: its training losses are logged at the step, but its
    validation losses at the step before (the step's own are the kept candidate's)."""
    run = load_run(db, run_id, step)
    nodes = [n for n in run.graph.topological_order() if run.graph.node(n).kind == "llm"]
    counts = {**step_failing(db, run_id, step - 1), "train": step_failing(db, run_id, step)
              .get("train", (0, 0))}
    split = "val" if examples == "val" else "train"
    failing = counts.get(split, (0, 0))[0] + (counts.get("val", (0, 0))[0]
                                               if examples == "all" else 0)
    passing = counts.get("val", (0, 0))[1] - counts.get("val", (0, 0))[0]
    below = _llm_below(run.graph, nodes)
    probes = sum(2 * failing + passing for _ in nodes)
    # per node: a gradient probe (a rewrite, then the nodes below) on each failing example
    # and an edit probe (the node and those below) on each failing and passing one
    forward = sum(failing * below[n] + (failing + passing) * (below[n] + 1) for n in nodes)
    optimizer = failing * len(nodes)
    # examples the step did not back-propagate need a backward pass first: about a
    # gradient call per node each
    fresh = failing - (len(set(backpropagated(run))) if split == "train" else 0)
    optimizer += max(fresh, 0) * len(nodes)
    return _estimate_line(probes, forward, optimizer, run_paces(db, run_id), adaptive)


def _llm_below(graph: Any, nodes: list[str]) -> dict[str, int]:
    return {n: sum(1 for d in descendants(graph, n) if graph.node(d).kind == "llm")
            for n in nodes}


def _estimate_line(probes: int, forward: int, optimizer: int,
                   paces: tuple[float, float] | None, adaptive: bool) -> str:
    calls = forward + optimizer
    when = ""
    if paces:
        seconds = forward * paces[0] + optimizer * paces[1]
        when = (f" ({forward} forward, {optimizer} optimizer), {duration(seconds, 'about ')} at "
                f"this run's pace ({_pace(paces[0])} a forward call, {_pace(paces[1])} an "
                "optimizer call; cached calls are faster)")
    how = ("adaptive: probed in rounds of a few examples, it stops where the probes no "
           "longer decide anything, so it usually makes far fewer; --exhaustive makes all"
           if adaptive else "every planned probe is made")
    return f"blame: up to {probes} probes, about {calls} model calls{when}; {how}"


def _pace(seconds: float) -> str:
    """A call's pace as people read it: 0.3 s, 12 s, under 10 ms (never 5e-05 s)."""
    if seconds < 0.01:
        return "under 10 ms"
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"

