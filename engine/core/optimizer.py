"""Semantic gradient descent.

Step 0 evaluates the initial prompts on train and validation. Each later step:
forward on train -> sample up to k failing examples (seeded by seed and step) -> backward
on them -> one update call per trainable node that a gradient asked to change (every
trainable node under --update-when always) -> apply the updates together (or one node
per step) -> evaluate the candidate on validation -> keep it only if validation strictly
improves (unless the gate is off). Rejected proposals are shown to the next update call,
so a rejected step does not repeat itself.

With `proposals` N > 1 (not the paper's: it makes one), the update calls are made N times
from the same gradients, the first as the run asks (greedy by default) and the others
sampled (CANDIDATE_TEMPERATURE, a sample index each), giving N candidate prompt sets; each
is scored on validation and the best (the first among equals) is kept if it strictly
improves. A small model's edit from the same gradients is right some times and not others
(docs/probes.md), so the better of two is right more often; each extra candidate costs
its update calls and one validation pass of the nodes its edits reach.

A kept candidate that changes several prompts keeps only the edits its gain needs (with the
gate on): the kept set is scored on validation without each of its edits in turn, the
output end of the graph first (one pass each, its node calls shared with the gate's where
identical), and an edit whose absence scores at least as well is dropped; the last edit
left is kept. A dropped edit is recorded as a rejected proposal with its reason
(PRUNED_REASON), and the step's validation record, score and prompts are those of the set
kept. Accepted steps are the rare ones, so the passes are paid rarely: each costs the
validation calls of the nodes the left-out edit reaches.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.backward import Method, UpdateSample, contrast_gradients
from engine.core.copies import COPY_REASON, find_copies
from engine.core.forward import ExampleTrace, Prompts, RunContext, SharedCalls, forward_pass
from engine.core.loss import compute_losses, mean_score
from engine.data.examples import Example, Splits
from engine.events import (
    CandidatesScored,
    Gradient,
    LossRecord,
    PromptVersion,
    Proposal,
    PruningStarted,
    StepFinished,
    same_prompt,
)
from engine.prompts.recorded import DROPPED_REASON, dropped_variables

REJECTED_SHOWN = 3
# the sampling temperature of candidates after the first (--proposals)
CANDIDATE_TEMPERATURE = 0.8
# --node-gates auto scores edits alone after a rejected step that made at most this many
NODE_GATES_AUTO_MAX = 4
# the reason of an edit dropped from an accepted candidate (its gain did not need it)
PRUNED_REASON = "dropped from the kept candidate"


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
    proposals: int = 1  # candidate prompt sets per step, each scored on validation
    # a sibling-blind Method (one of CONTRAST_METHODS) whose gradients are written beside a
    # sibling-aware method's on the same back-propagated examples, for comparison only
    contrast: Method | None = None


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
    return pass_score(ctx, losses), traces, losses


def pass_score(ctx: RunContext, losses: list[LossRecord]) -> float | None:
    """A pass's score: the mean of its examples' scores. A run that re-runs the user's own
    pipeline (ctx.rerun) leaves out the examples whose re-run failed (the pipeline raised
    or timed out, its model was down): an example error says nothing of the prompts, so it
    is never a failing score; None when every example failed."""
    if ctx.rerun is not None:
        losses = [loss for loss in losses if not loss.error]
    return mean_score(losses)


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
    if config.contrast is not None and method.contrastable:
        await asyncio.gather(*(contrast_gradients(ctx, config.contrast, prompts, traces[i], fb)
                               for i, fb in zip(chosen, feedback)))
    trainable, mode = ctx.graph.trainable_nodes, config.update_mode
    every = nodes_to_update(trainable, mode, step) if chosen else []
    nodes = nodes_to_update(trainable, mode, step, None if config.update_when == "always"
                            else claims) if chosen else []

    def samples(node_id: str) -> list[UpdateSample]:
        return [UpdateSample(traces[i].example.id, traces[i].activations[node_id].input_text,
                             traces[i].output(node_id), fb.get(node_id, ""))
                for i, fb in zip(chosen, feedback)]

    candidates = [Candidate(j, list(c)) for j, c in enumerate(await asyncio.gather(*(
        asyncio.gather(*(method.propose_update(candidate_context(ctx, j), prompts, n, samples(n),
                                               state.rejected[n][-REJECTED_SHOWN:])
                         for n in nodes))
        for j in range(max(1, config.proposals)))))]
    versions = dict(state.next_version)
    examples = [(traces[i].example.fields, traces[i].example.target) for i in chosen]
    for c in candidates:
        # a proposal that pastes the sampled examples in is recorded as rejected, never tried
        c.copies = {} if config.allow_copies else find_copies(
            {n: (p.new_prompt, prompts.text[n]) for n, p in zip(nodes, c.proposals)}, examples)
        # an imported call's prompt template keeps its variables, or each trace's own text
        # (its customer, its shop) would no longer be sent: such a proposal is refused
        c.dropped = {n: lost for n, p in zip(nodes, c.proposals) if ctx.graph.node(n).recorded
                     and (lost := dropped_variables(prompts.text[n], p.new_prompt))}
        edits = {n: p.new_prompt for n, p in zip(nodes, c.proposals)
                 if n not in c.copies and n not in c.dropped
                 and not same_prompt(prompts.text[n], p.new_prompt)}
        # a candidate that repeats an earlier one's edits is that candidate: not scored again
        c.same_as = next((e for e in candidates[:c.index] if e.same_as is None and edits
                          and {n: v[1] for n, v in e.changes.items()} == edits), None)
        if c.same_as is None:
            for n, prompt in edits.items():
                c.changes[n] = (versions[n], prompt)
                versions[n] += 1
    scored = [c for c in candidates if c.changes]
    if scored:  # the gate starts now (its first call may take a while to come back)
        ctx.emit(CandidatesScored(ctx.run_id, step, len(scored)))
    best = scored[0] if scored else candidates[0]
    val_before, accepted = state.val_score, False
    val_alone, gate_calls, gate_timing = {}, {}, {}
    kept, pruning = Pruned(dict(best.changes), best.score), False
    if scored:
        started_gate = time.perf_counter()
        # The joint candidate is scored first; identical node calls of the passes below are
        # made once. The alone scores are informative only: the joint decision stays the
        # paper's. `on` scores each edit alone (the others as they were) beside the joint
        # pass; `auto` only once the joint candidate is rejected, where "which edit helped?"
        # tells the next step something, at the price of the passes' rounds after it.
        # The step's validation record is the pass of the prompts kept: held until the
        # pruning below says which they are.
        gate_ctx = replace(ctx, shared=SharedCalls())
        alone_ran = config.node_gates == "on" and node_gates_apply("on", len(best.changes))
        if len(scored) == 1:
            joint_events: list = []
            joint = evaluate(replace(gate_ctx, emit=joint_events.append, pass_label="joint"),
                             prompts.updated(best.changes), splits.val, "val")
            if config.node_gates == "on":
                (best.score, _, _), val_alone = await asyncio.gather(
                    joint, score_edits_alone(gate_ctx, prompts, best.changes, splits, "on"))
            else:
                best.score, _, _ = await joint
        else:
            best, joint_events = await score_candidates(gate_ctx, prompts, scored, splits)
            alone_ran = config.node_gates == "on" and node_gates_apply("on", len(best.changes))
            if config.node_gates == "on":
                val_alone = await score_edits_alone(gate_ctx, prompts, best.changes, splits,
                                                    "on")
        accepted = (not config.gate) or (
            best.score is not None and (val_before is None or best.score > val_before))
        if config.node_gates == "auto" and not accepted:
            val_alone = await score_edits_alone(gate_ctx, prompts, best.changes, splits, "auto")
        gate_calls, gate_timing = node_gate_cost(gate_ctx.shared, val_alone, started_gate)
        if len(best.changes) == 1:  # the joint candidate is that edit alone
            val_alone = {n: best.score for n in best.changes}
        kept = Pruned(dict(best.changes), best.score, joint_events)
        pruning = accepted and config.gate and len(best.changes) > 1
        if pruning:
            started_prune = time.perf_counter()
            seen = [c.changes for c in scored] + (
                [{n: change} for n, change in best.changes.items()] if alone_ran else [])
            kept = await prune_edits(gate_ctx, prompts, kept, splits, seen)
            val_alone = {**kept.alone, **val_alone}
            prune_calls, prune_timing = prune_cost(gate_ctx.shared, started_prune)
            gate_calls, gate_timing = {**gate_calls, **prune_calls}, {**gate_timing,
                                                                      **prune_timing}
        for event in kept.events:
            ctx.emit(event)
    for c in candidates:
        won = accepted and c is best
        same = c.same_as
        for n, p in zip(nodes, c.proposals):
            changed = n in c.changes
            repeated = same is not None and n in same.changes
            pruned = c is best and n in kept.dropped
            problem = p.error or p.parse_error or (
                None if changed or repeated or n in c.copies or n in c.dropped
                else "proposal left the prompt unchanged")
            ctx.emit(Proposal(ctx.run_id, step, n, prompts.text[n], p.new_prompt,
                              won and changed and not pruned, val_before,
                              kept.dropped[n][1] if pruned else kept.score if won
                              else (same or c).score, p.call_id,
                              problem, p.reasoning, val_alone.get(n) if c is best else None,
                              COPY_REASON if n in c.copies else
                              DROPPED_REASON.format(", ".join(
                                  "{" + v + "}" for v in c.dropped[n])) if n in c.dropped else
                              f"the same edits as candidate {same.index + 1}" if repeated else
                              pruned_reason(*kept.dropped[n]) if pruned else
                              candidate_reason(c, best, accepted, val_before,
                                               val_alone.get(n)) if changed else None,
                              candidate=c.index))
            if changed:
                ctx.emit(PromptVersion(ctx.run_id, n, *c.changes[n], step,
                                       won and not pruned))
    rejected = {n: list(r) for n, r in state.rejected.items()}
    if accepted:
        prompts, val_score = prompts.updated(kept.changes), kept.score
        for n in kept.changes:  # a new prompt: proposals rejected for the old one no longer apply
            rejected[n] = []
    else:
        val_score = state.val_score
    for c in candidates:  # in candidate order, as the run log's versions are
        for n in c.changes:
            if not (accepted and n in kept.changes):
                rejected[n].append(c.changes[n][1])
    ctx.emit(StepFinished(ctx.run_id, step, train_score, val_score, accepted, started,
                          time.time(), timings=gate_timing, metrics={
                              "failing_train": float(sum(1 for x in losses if x.score < 1)),
                              "sampled": float(len(chosen)),
                              "proposals_changed": float(len(best.changes)),
                              # trainable nodes left without an update call: no gradient asked
                              "updates_skipped": float(len(every) - len(nodes)),
                              **({"val_candidate": best.score}
                                 if best.score is not None else {}),
                              **({"candidates_scored": float(len(scored))}
                                 if config.proposals > 1 else {}),
                              # edits of the kept candidate its gain did not need
                              **({"edits_pruned": float(len(kept.dropped))}
                                 if pruning else {}),
                              **gate_calls,
                          }))
    return OptimizerState(step, prompts, val_score, train_score, versions, rejected)


@dataclass
class Candidate:
    """One candidate prompt set of a step: its update proposals (one per node updated),
    the edits among them that change a prompt (node -> (version, prompt); none when it
    repeats an earlier candidate's edits, `same_as`), those refused as copies of the
    sampled examples, and its validation score once scored."""

    index: int
    proposals: list
    changes: dict[str, tuple[int, str]] = field(default_factory=dict)
    copies: dict = field(default_factory=dict)
    dropped: dict = field(default_factory=dict)  # node -> template variables it lost
    score: float | None = None
    same_as: Candidate | None = None  # an earlier candidate with the same edits


class CandidateClient:
    """The model client as candidate `index` > 0 of a step sees it: its requests sampled at
    CANDIDATE_TEMPERATURE (or the run's, if higher) with a sample index and seed of their
    own, so each candidate is a draw of its own and the cache keeps the draws apart."""

    def __init__(self, client: Any, index: int) -> None:
        self._client, self.index = client, index

    def request(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("temperature", max(self._client.temperature, CANDIDATE_TEMPERATURE))
        kwargs["sample_index"] = self.index
        request = self._client.request(*args, **kwargs)
        return replace(request, seed=None if request.seed is None else request.seed + self.index)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def candidate_context(ctx: RunContext, index: int) -> RunContext:
    """The context candidate `index`'s update calls run in (the first: the run's own)."""
    return ctx if index == 0 else replace(ctx, client=CandidateClient(ctx.client, index))


async def score_candidates(ctx: RunContext, prompts: Prompts, scored: list[Candidate],
                           splits: Splits) -> tuple[Candidate, list]:
    """Score every candidate on validation at once (identical node calls made once through
    `ctx.shared`) and return the best, the first among equals, with the events of its pass
    (the step's validation record unless pruning keeps fewer of its edits). In
    `ctx.shared` its pass is the joint pass, so the per-node gates that may follow count
    only their own calls."""
    buffers: list[list] = [[] for _ in scored]
    results = await asyncio.gather(*(
        evaluate(replace(ctx, emit=buffer.append, pass_label=f"candidate {c.index}"),
                 prompts.updated(c.changes), splits.val, "val")
        for c, buffer in zip(scored, buffers)))
    for c, (score, _, _) in zip(scored, results):
        c.score = score
    order = max(range(len(scored)), key=lambda i: (
        scored[i].score if scored[i].score is not None else float("-inf"), -i))
    best = scored[order]
    used = ctx.shared.used
    joint = used.pop(f"candidate {best.index}", set())
    for c in scored:
        used.pop(f"candidate {c.index}", None)
    used["joint"] = joint
    return best, buffers[order]


@dataclass
class Pruned:
    """What an accepted candidate keeps: its edits (node -> (version, prompt)), their
    validation score and the events of the pass that scored them; after pruning, the edits
    dropped (node -> (the score without it, the score with it) when it was left out) and
    the scores of single edits a pass measured (node -> score)."""

    changes: dict[str, tuple[int, str]]
    score: float | None
    events: list = field(default_factory=list)
    dropped: dict[str, tuple[float, float]] = field(default_factory=dict)
    alone: dict[str, float | None] = field(default_factory=dict)


async def prune_edits(ctx: RunContext, prompts: Prompts, kept: Pruned, splits: Splits,
                      seen: list[dict[str, tuple[int, str]]]) -> Pruned:
    """Keep only the edits of an accepted candidate that its gain needs: each edit in turn,
    the output end of the graph first (leaving out a later node's edit re-runs fewer
    nodes), the kept set is scored on validation without it (its identical node calls made
    once through `ctx.shared`, with the gate's passes too; `seen`: the edit sets those
    scored), and the edit is dropped if that scores at least as well as the kept set: the
    gain does not need it. The next edit is tried against the smaller set; the last edit
    left is kept (it is the accepted step's gain). Deterministic given the passes' calls,
    so a resumed run prunes as the first did."""
    kept = replace(kept, changes=dict(kept.changes), dropped={}, alone={})
    seen = list(seen)
    for index, node in enumerate(reversed(list(kept.changes))):
        if len(kept.changes) < 2 or kept.score is None:
            break
        trial = {n: change for n, change in kept.changes.items() if n != node}
        ctx.emit(PruningStarted(ctx.run_id, ctx.step, 1,
                                len(splits.val) * new_node_calls(ctx.graph, [trial], seen)))
        seen.append(trial)
        events: list = []
        score, _, _ = await evaluate(replace(ctx, emit=events.append,
                                             pass_label=f"prune {index}: without {node}"),
                                     prompts.updated(trial), splits.val, "val")
        if len(trial) == 1:
            kept.alone[next(iter(trial))] = score
        if score is not None and score >= kept.score:
            kept.dropped[node] = (score, kept.score)
            kept.changes, kept.score, kept.events = trial, score, events
    return kept


def pruned_reason(without: float, with_it: float) -> str:
    """Why an edit was dropped from the kept candidate (PRUNED_REASON, then why)."""
    same = "as" if without == with_it else "more than"
    return (f"{PRUNED_REASON}: without this edit validation scored {without:.4g}, {same} "
            f"with it ({with_it:.4g}): the gain does not need it")


def graph_reach(graph: Any) -> dict[str, set[str]]:
    """Each node with its ancestors: the nodes whose prompts shape its calls."""
    reach: dict[str, set[str]] = {}
    for node in graph.topological_order():
        reach[node] = {node}.union(*(reach[p] for p in graph.predecessors(node)))
    return reach


def new_node_calls(graph: Any, passes: list[dict[str, tuple[int, str]]],
                   seen: list[dict[str, tuple[int, str]]]) -> int:
    """LLM node calls per example that forward passes with the edit sets `passes` make
    beyond those of passes with the edit sets `seen` (identical calls made once): a node's
    call differs only by which edits (node and version) reach it, its own and its
    ancestors'."""
    reach = graph_reach(graph)
    count = 0
    for node in (n.id for n in graph.nodes if n.kind != "function" and n.id in reach):
        made = {_reaching(edits, reach[node]) for edits in seen}
        for edits in passes:
            if _reaching(edits, reach[node]) not in made:
                made.add(_reaching(edits, reach[node]))
                count += 1
    return count


def _reaching(edits: dict[str, tuple[int, str]], reach: set[str]) -> frozenset:
    return frozenset((n, change[0]) for n, change in edits.items() if n in reach)


def prune_cost(shared: SharedCalls, started: float) -> tuple[dict[str, float], dict[str, float]]:
    """What pruning added to the gate: the metric `prune_calls` (node calls no other pass
    of the gate needed; logged), `prune_model_calls` (those the cache did not answer) and
    `prune_seconds` (summary only)."""
    mine = set().union(*(keys for name, keys in shared.used.items()
                         if name.startswith("prune ")))
    others = set().union(*(keys for name, keys in shared.used.items()
                           if not name.startswith("prune ")))
    extra = mine - others
    model = sum(1 for key in extra if not shared.cache_hit.get(key, False))
    return ({"prune_calls": float(len(extra))},
            {"prune_model_calls": float(model),
             "prune_seconds": time.perf_counter() - started})


def candidate_reason(candidate: Candidate, best: Candidate, accepted: bool,
                     val_before: float | None, val_alone: float | None) -> str | None:
    """Why a changed prompt of `candidate` was not kept (None: it was)."""
    if candidate is best:
        return reject_reason(not accepted, val_before, candidate.score, val_alone)
    mine, theirs = f"candidate {candidate.index + 1}", f"candidate {best.index + 1}"
    if candidate.score is None:
        return (f"{mine} could not be scored on validation; {theirs} was "
                f"{'kept' if accepted else 'the best'}")
    return (f"{mine} scored {candidate.score:.4g} on validation, {theirs} scored "
            f"{_score(best.score)}"
            + (" and was kept" if accepted else f"; neither above {_score(val_before)}"))


def _score(value: float | None) -> str:
    return "nothing" if value is None else f"{value:.4g}"


def reject_reason(rejected: bool, val_before: float | None, val_after: float | None,
                  val_alone: float | None) -> str | None:
    """One node's own outcome in a rejected step: the joint score, and its edit alone when
    a per-node gate scored it."""
    if not rejected:
        return None
    if val_after is None:
        return "rejected: the candidate could not be scored on validation"
    before = _score(val_before)
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
