"""What blame probes at one step (`plan_step`): the chosen failing examples and the
passing validation ones, the gradients to follow (logged, or re-computed with a method
through the probe client) and the probe jobs; `ready` gives a pending job its gradient
when a round of adaptive blame first probes its example."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.events import Gradient
from engine.probes.probe import (
    LoggedRun,
    ProbeError,
    Prober,
)
from engine.probes.selection import (
    CopiedProposal,
    NothingToProbe,
    backpropagated,
    proposed_prompt,
    received_gradients,
    select_examples,
)
from engine.runlog.probing import (
    recorded_claims,
)

# one probe: Prober.intervene's arguments (kind, example_id, node_id, and the kind's own)
Job = dict[str, Any]


@dataclass
class BlamePlan:
    """What blame probes at one step, and what the report needs of it."""

    run: LoggedRun
    failing: list[str]  # the chosen examples that fail at the step
    nodes: list[str]  # its LLM nodes, in order
    jobs: list[Job]  # every planned probe
    # (example, node) -> the gradient the node acted on (logged, or re-computed)
    gradients: dict[tuple[str, str], str]
    edits: dict[str, str] = field(default_factory=dict)  # node -> its proposed prompt
    copied: set[str] = field(default_factory=set)  # proposals refused as copies
    unchanged: set[str] = field(default_factory=set)  # updates that left the prompt as it was
    # the claims recorded at backward time, (example, node) -> (asks change, reading)
    recorded: dict[tuple[str, str], Any] = field(default_factory=dict)
    # with `methods`: per method, its gradients, its per-edge (text, claim), its claims
    by_method: dict[str, dict[tuple[str, str], str]] = field(default_factory=dict)
    by_edge: dict[str, dict[tuple[str, str, str], tuple[str, bool]]] = field(
        default_factory=dict)
    method_claims: dict[str, dict[tuple[str, str], bool]] = field(default_factory=dict)
    # adaptive: examples whose own gradients are still to compute, and what computes them
    pending: set[str] = field(default_factory=set)
    backprop: Callable[[list[str]], Awaitable[None]] | None = None


async def plan_step(run: LoggedRun, prober: Prober, which: str, methods: list[str],
                    lazy: bool = False) -> BlamePlan:
    """The step's failing and passing examples, the gradients to follow (logged, or
    re-computed with the run's method through the probe client) and the probe jobs.
    `lazy` (adaptive blame): the gradients the log lacks are not computed here; their
    jobs are *pending* (`feedback` None) until `ready` computes them for the examples a
    round probes, so examples adaptive blame never reaches cost no backward calls."""
    from engine.core.loss import example_loss
    from engine.methods import make_method

    sampled = set(backpropagated(run))
    train = [e for e, split in run.split_of.items() if split == "train"]
    val = [e for e, split in run.split_of.items() if split == "val"]
    if which == "sampled":
        if not sampled:
            raise NothingToProbe(f"no example was back-propagated at step {run.step}; try "
                                 "--examples failing or val")
        ids = [e for e in train if e in sampled]
    elif which == "failing":
        ids = train
    elif which == "val":
        ids = val
    elif which == "all":
        ids = train + val
    else:
        ids = select_examples(run, which)
    bases = dict(zip(ids, await asyncio.gather(*(prober.baseline(e) for e in ids))))
    failing = [e for e in ids if bases[e].score is not None and bases[e].score < 1.0]
    if not failing:
        raise NothingToProbe(f"no chosen example fails at step {run.step}")
    # passing validation examples: where an edit's regressions show
    val_bases = await asyncio.gather(*(prober.baseline(e) for e in val))
    passing_val = [e for e, b in zip(val, val_bases) if (b.score or 0.0) >= 1.0]

    logged = received_gradients(run)
    run_method = run.config.get("method", "semantic")

    graph = run.graph

    async def backprop(name: str, ids: list[str]) -> tuple[dict, dict, dict]:
        """(aggregated gradient per (example, node); per (example, node, successor) the
        gradient that successor sent, before aggregation, and its claim; per (example,
        node) whether any gradient it received asks it to change)."""
        options = run.config.get("method_options", {}) if name == run_method else {}
        method = make_method(name, **options)
        if not method.uses_gradients or not ids:
            return {}, {}, {}
        sent: list[Gradient] = []  # the backward pass's gradient events, one per edge
        ctx = replace(prober.ctx, emit=lambda event: sent.append(event)
                      if isinstance(event, Gradient) and event.kind == "gradient" else None)
        losses = await asyncio.gather(*(example_loss(prober.ctx, bases[e].trace,
                                                     bases[e].split) for e in ids))
        feedback = await asyncio.gather(*(method.backward(ctx, run.prompts, bases[e].trace,
                                                          loss)
                                          for e, loss in zip(ids, losses)))
        edges = {(g.example_id, g.node_id, g.from_node_id): (g.content or "",
                                                              bool(g.asks_change))
                 for g in sent if g.from_node_id in graph.successors(g.node_id)}
        claims: dict[tuple[str, str], bool] = {}
        for g in sent:
            key = (g.example_id, g.node_id)
            claims[key] = claims.get(key, False) or bool(g.asks_change)
        return ({(e, n): text for e, fb in zip(ids, feedback) for n, text in fb.items()},
                edges, claims)

    missing = [e for e in failing if e not in sampled or not any(k[0] == e for k in logged)]
    gradients = {k: v for k, v in logged.items() if k[0] in failing and k[0] in sampled}
    if not lazy:
        gradients.update((await backprop(run_method, missing))[0])
    by_method, by_edge, method_claims = {}, {}, {}
    for name in methods:
        by_method[name], by_edge[name], method_claims[name] = await backprop(name, failing)
    nodes = [n for n in run.graph.topological_order() if run.graph.node(n).kind == "llm"]
    edits, copied, unchanged = {}, set(), set()
    for n in nodes:
        try:
            edits[n] = proposed_prompt(run, n)
        except CopiedProposal:
            copied.add(n)
        except ProbeError:  # no proposal: the update left the prompt as it was
            unchanged.add(n)
    # method "" marks the run's own gradients; a name, the comparison's re-computed ones
    pending = set(missing) if lazy else set()
    jobs = [dict(kind="gradient", example_id=e, node_id=n,
                 feedback=None if e in pending else gradients[(e, n)])
            for e in failing for n in nodes if e in pending or (e, n) in gradients]
    jobs += [dict(kind="edit", example_id=e, node_id=n, prompt=edits[n], in_sample=e in sampled)
             for n in edits for e in [*failing, *passing_val]]
    jobs += [dict(kind="gradient", example_id=e, node_id=n, feedback=grads[(e, n)], method=name)
             for name, grads in by_method.items()
             for e in failing for n in nodes if (e, n) in grads]
    # a node with several successors: each one's gradient alone (with one, the edge's
    # gradient is the node's, already followed above)
    jobs += [dict(kind="gradient", example_id=e, node_id=n, feedback=edges[(e, n, t)][0],
                  method=name, edge=t)
             for name, edges in by_edge.items() for e in failing for n in nodes
             if len(graph.successors(n)) > 1 for t in graph.successors(n)
             if edges.get((e, n, t), ("",))[0].strip()]

    async def backprop_own(ids: list[str]) -> None:  # a pending job's gradients, into the plan
        pending.difference_update(ids)
        gradients.update((await backprop(run_method, ids))[0])

    recorded = {k: v for k, v in recorded_claims(run.db, run.run_id, run.step).items()
                if k in logged and k in gradients and gradients[k] == logged[k]}
    return BlamePlan(run, failing, nodes, jobs, gradients, edits, copied, unchanged, recorded,
                     by_method, by_edge, method_claims, pending, backprop_own)


async def ready(plan: BlamePlan, jobs: list[Job]) -> list[Job]:
    """`jobs` with every pending gradient job (see `plan_step`'s `lazy`) given its
    gradient, computed now for the examples that lack one; a node that received no gradient
    on an example has no job there."""
    wanted = sorted({j["example_id"] for j in jobs if j.get("feedback", "") is None
                     and j["example_id"] in plan.pending})
    if wanted and plan.backprop is not None:
        await plan.backprop(wanted)
    gradients = plan.gradients
    out = []
    for job in jobs:
        if job["kind"] == "gradient" and job.get("feedback", "") is None:
            key = (job["example_id"], job["node_id"])
            if key not in gradients:
                continue
            job = {**job, "feedback": gradients[key]}
        out.append(job)
    return out

