"""Semantic gradient descent.

Step 0 evaluates the initial prompts on train and validation. Each later step:
forward on train -> sample up to k failing examples (seeded by seed and step) -> backward
on them -> one update call per trainable node that a gradient asked to change (every
trainable node under --update-when always) -> apply the updates together (or one node
per step) -> evaluate the candidate on validation -> keep it only if validation strictly
improves (unless the gate is off). Rejected proposals are shown to the next update call,
so a rejected step does not repeat itself.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.backward import Method, UpdateSample
from engine.core.copies import COPY_REASON, find_copies
from engine.core.forward import ExampleTrace, Prompts, RunContext, SharedCalls, forward_pass
from engine.core.loss import compute_losses, mean_score
from engine.data.examples import Example, Splits
from engine.events import Gradient, LossRecord, PromptVersion, Proposal, StepFinished

REJECTED_SHOWN = 3
# --node-gates auto scores edits alone after a rejected step that made at most this many
NODE_GATES_AUTO_MAX = 4


@dataclass
class OptimizerConfig:
    steps: int = 4
    failures_per_step: int = 2
    gate: bool = True
    update_mode: str = "all"  # all | one
    seed: int = 0
    # off | auto (after a rejected joint candidate that changed 2 to 4 prompts) | on: off by
    # default, since on most steps (rejected ones) `auto` doubles the step's validation calls
    node_gates: str = "off"
    allow_copies: bool = False  # apply proposals that paste training examples (engine/core/copies.py)
    # asked: no update call for a node whose every gradient this step claimed "no change"
    # (the claim the run log records with the gradient); always: one per trainable node
    update_when: str = "asked"


@dataclass
class OptimizerState:
    """Everything the next step depends on; rebuilt from the run log on resume."""

    step: int
    prompts: Prompts
    val_score: float | None
    train_score: float | None = None
    next_version: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, list[str]] = field(default_factory=dict)


async def evaluate(ctx: RunContext, prompts: Prompts, examples: list[Example], split: str
                   ) -> tuple[float | None, list[ExampleTrace], list[LossRecord]]:
    traces = await forward_pass(ctx, prompts, examples, split)
    losses = await compute_losses(ctx, traces, split)
    return mean_score(losses), traces, losses


async def initial_step(ctx: RunContext, prompts: Prompts, splits: Splits) -> OptimizerState:
    ctx = replace(ctx, step=0)
    started = time.time()
    for node in ctx.graph.nodes:
        ctx.emit(PromptVersion(ctx.run_id, node.id, 0, prompts.text[node.id], 0, True))
    (train, _, _), (val, _, _) = await asyncio.gather(
        evaluate(ctx, prompts, splits.train, "train"), evaluate(ctx, prompts, splits.val, "val"))
    ctx.emit(StepFinished(ctx.run_id, 0, train, val, False, started, time.time()))
    return OptimizerState(0, prompts, val, train, {n.id: 1 for n in ctx.graph.nodes},
                          {n: [] for n in ctx.graph.node_ids})


def sample_failures(losses: list[LossRecord], k: int, seed: int, step: int) -> list[int]:
    """Indices of up to k failing examples (score < 1, forward succeeded), seeded by
    (seed, step) so that a resumed run samples exactly what the original would have."""
    failing = [i for i, loss in enumerate(losses) if loss.score < 1.0 and not loss.error]
    rng = random.Random(f"{seed}:{step}")
    return sorted(rng.sample(failing, min(k, len(failing))))


class ChangeClaims:
    """Listener over one step's gradient records (forwarding each to `emit`): the nodes that
    received a gradient, and those some gradient asked to change. A claim that could not be
    read (None) counts as asking; an empty gradient (a reply that left the input's block
    out, even after the repair request) is no claim at all."""

    def __init__(self, emit: Callable[[Any], None] | None = None) -> None:
        self.emit, self.step = emit, None
        self.received: set[str] = set()
        self.asked: set[str] = set()

    def __call__(self, event: Any) -> None:
        if isinstance(event, Gradient) and event.kind == "gradient" and event.content.strip():
            if event.step != self.step:
                self.step, self.received, self.asked = event.step, set(), set()
            self.received.add(event.node_id)
            if event.asks_change is not False:
                self.asked.add(event.node_id)
        if self.emit is not None:
            self.emit(event)

    def wants_update(self, node_id: str) -> bool:
        """False only for a node that received gradients and none of them asked a change
        (a method without gradients, such as `none` or `gtbp`, records none: always True)."""
        return node_id not in self.received or node_id in self.asked


def nodes_to_update(trainable: list[str], mode: str, step: int,
                    claims: ChangeClaims | None = None) -> list[str]:
    """The nodes that get an update call at `step`: every trainable node, or one in turn
    (mode 'one'); with `claims` (--update-when asked), less those no gradient asked to change."""
    nodes = [trainable[(step - 1) % len(trainable)]] if mode == "one" and trainable \
        else list(trainable)
    return [n for n in nodes if claims is None or claims.wants_update(n)]


async def optimization_step(ctx: RunContext, method: Method, splits: Splits,
                            state: OptimizerState, config: OptimizerConfig) -> OptimizerState:
    step = state.step + 1
    ctx = replace(ctx, step=step)
    started = time.time()
    prompts = state.prompts
    train_score, traces, losses = await evaluate(ctx, prompts, splits.train, "train")
    chosen = sample_failures(losses, config.failures_per_step, config.seed, step)
    claims = ChangeClaims(ctx.emit)
    feedback = await asyncio.gather(*(method.backward(replace(ctx, emit=claims), prompts,
                                                      traces[i], losses[i]) for i in chosen))
    trainable, mode = ctx.graph.trainable_nodes, config.update_mode
    every = nodes_to_update(trainable, mode, step) if chosen else []
    nodes = nodes_to_update(trainable, mode, step, None if config.update_when == "always"
                            else claims) if chosen else []

    def samples(node_id: str) -> list[UpdateSample]:
        return [UpdateSample(traces[i].example.id, traces[i].activations[node_id].input_text,
                             traces[i].output(node_id), fb.get(node_id, ""))
                for i, fb in zip(chosen, feedback)]

    proposals = await asyncio.gather(*(
        method.propose_update(ctx, prompts, n, samples(n), state.rejected[n][-REJECTED_SHOWN:])
        for n in nodes))
    # a proposal that pastes the sampled examples in is recorded as rejected, never tried
    copies = {} if config.allow_copies else find_copies(
        {n: (p.new_prompt, prompts.text[n]) for n, p in zip(nodes, proposals)},
        [(traces[i].example.fields, traces[i].example.target) for i in chosen])
    changes = {n: (state.next_version[n], p.new_prompt) for n, p in zip(nodes, proposals)
               if n not in copies and p.new_prompt.strip()
               and p.new_prompt.strip() != prompts.text[n].strip()}
    val_before, val_after, accepted = state.val_score, None, False
    val_alone, gate_calls, gate_timing = {}, {}, {}
    if changes:
        started_gate = time.perf_counter()
        # The joint candidate is scored first; identical node calls of the passes below are
        # made once. The alone scores are informative only: the joint decision stays the
        # paper's. `on` scores each edit alone (the others as they were) beside the joint
        # pass; `auto` only once the joint candidate is rejected, where "which edit helped?"
        # tells the next step something, at the price of the passes' rounds after it.
        gate_ctx = replace(ctx, shared=SharedCalls())
        joint = evaluate(replace(gate_ctx, pass_label="joint"), prompts.updated(changes),
                         splits.val, "val")
        if config.node_gates == "on":
            (val_after, _, _), val_alone = await asyncio.gather(
                joint, score_edits_alone(gate_ctx, prompts, changes, splits, "on"))
        else:
            val_after, _, _ = await joint
        accepted = (not config.gate) or (
            val_after is not None and (val_before is None or val_after > val_before))
        if config.node_gates == "auto" and not accepted:
            val_alone = await score_edits_alone(gate_ctx, prompts, changes, splits, "auto")
        gate_calls, gate_timing = node_gate_cost(gate_ctx.shared, val_alone, started_gate)
        if len(changes) == 1:  # the joint candidate is that edit alone
            val_alone = {n: val_after for n in changes}
    for n, p in zip(nodes, proposals):
        changed = n in changes
        problem = p.error or p.parse_error or (
            None if changed or n in copies else "proposal left the prompt unchanged")
        ctx.emit(Proposal(ctx.run_id, step, n, prompts.text[n], p.new_prompt,
                          accepted and changed, val_before, val_after, p.call_id, problem,
                          p.reasoning, val_alone.get(n),
                          COPY_REASON if n in copies else
                          reject_reason(changed and not accepted, val_before, val_after,
                                        val_alone.get(n))))
        if changed:
            ctx.emit(PromptVersion(ctx.run_id, n, changes[n][0], changes[n][1], step, accepted))
    next_version = {n: v + (1 if n in changes else 0) for n, v in state.next_version.items()}
    rejected = {n: list(r) for n, r in state.rejected.items()}
    if accepted:
        prompts, val_score = prompts.updated(changes), val_after
        for n in changes:  # a new prompt: proposals rejected for the old one no longer apply
            rejected[n] = []
    else:
        val_score = state.val_score
        for n in changes:
            rejected[n].append(changes[n][1])
    ctx.emit(StepFinished(ctx.run_id, step, train_score, val_score, accepted, started,
                          time.time(), timings=gate_timing, metrics={
                              "failing_train": float(sum(1 for x in losses if x.score < 1)),
                              "sampled": float(len(chosen)),
                              "proposals_changed": float(len(changes)),
                              # trainable nodes left without an update call: no gradient asked
                              "updates_skipped": float(len(every) - len(nodes)),
                              **({"val_candidate": val_after} if val_after is not None else {}),
                              **gate_calls,
                          }))
    return OptimizerState(step, prompts, val_score, train_score, next_version, rejected)


def reject_reason(rejected: bool, val_before: float | None, val_after: float | None,
                  val_alone: float | None) -> str | None:
    """One node's own outcome in a rejected step: the joint score, and its edit alone when
    a per-node gate scored it."""
    if not rejected:
        return None
    if val_after is None:
        return "rejected: the candidate could not be scored on validation"
    before = "nothing" if val_before is None else f"{val_before:.4g}"
    reason = f"rejected jointly: the candidate scored {val_after:.4g}, not above {before}"
    if val_alone is None:
        return reason
    better = val_before is None or val_alone > val_before
    return (f"{reason}; this edit alone scored {val_alone:.4g} "
            f"({'an improvement' if better else 'no improvement'} on its own)")


def node_gates_apply(mode: str, changed: int) -> bool:
    """Whether a step that changes `changed` prompts scores each edit alone (under `auto`,
    once its joint candidate is rejected)."""
    if changed < 2 or mode == "off":
        return False
    return mode == "on" or changed <= NODE_GATES_AUTO_MAX


async def score_edits_alone(ctx: RunContext, prompts: Prompts,
                            changes: dict[str, tuple[int, str]], splits: Splits, mode: str
                            ) -> dict[str, float | None]:
    """Validation score of each changed prompt applied alone, the others as they were.
    Runs beside the joint pass, sharing its identical node calls through `ctx.shared`."""
    if not node_gates_apply(mode, len(changes)):
        return {}
    # Only the scores are kept: these forward passes are not the run's activations.
    quiet = replace(ctx, emit=lambda event: None)
    scores = await asyncio.gather(*(
        evaluate(replace(quiet, pass_label=n), prompts.updated({n: change}), splits.val, "val")
        for n, change in changes.items()))
    return {n: score for n, (score, _, _) in zip(changes, scores)}


def node_gate_cost(shared: SharedCalls, val_alone: dict[str, float | None], started: float
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """What the per-node gates added to the joint pass: the metric `node_gate_calls` (node
    calls the joint pass did not need; logged), `node_gate_model_calls` (those the cache did
    not answer) and `node_gate_seconds` (the gate phase; summary only)."""
    if len(val_alone) < 2 or len(shared.used) < 2:  # no per-node pass ran
        return {}, {}
    extra = shared.extra(besides="joint")
    model = sum(1 for key in extra if not shared.cache_hit.get(key, False))
    return ({"node_gate_calls": float(len(extra))},
            {"node_gate_model_calls": float(model),
             "node_gate_seconds": time.perf_counter() - started})


async def run_steps(ctx: RunContext, method: Method, splits: Splits, config: OptimizerConfig,
                   state: OptimizerState | None = None) -> OptimizerState:
    """Run (or continue) the optimization until `config.steps` steps are complete."""
    if state is None:
        state = await initial_step(ctx, Prompts.initial(ctx.graph), splits)
    while state.step < config.steps:
        state = await optimization_step(ctx, method, splits, state, config)
    return state
