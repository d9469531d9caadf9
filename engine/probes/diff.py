"""Why do two runs differ? Activation patching between two logged runs (docs/probes.md).

A and B are two runs (or one run at two steps) of graphs that share nodes. For every
example both evaluated:

1. the two traces are compared node by node: a node is *unchanged* (same output), a
   *source change* (its own behaviour differs: another prompt or model, or the same inputs
   gave another output) or a *downstream change* (same prompt and model, other inputs).
   Two runs on different models (backend or model name, as the runs rows record them)
   differ at every LLM node: each whose output differs is a source change, and nothing
   is patched, since B's client would re-run A's outputs on B's model as if the two were
   one; the report says so (`model_change`) and leaves those examples unexplained;
2. where the scores differ, source changes are patched from A into B, one at a time and
   then in the smallest combinations up to a bound; only their descendants are re-run, in
   B's configuration (backend, model, prompt set) through B's client and reply cache, and
   the smallest set that gives B A's score is the explanation. A node that is merely
   downstream (the output node included) is never patched: copying it would reproduce A's
   answer without saying why it changed.

Calls are logged in `llm_calls` with purpose `diff`; patches in `diff_patches` and the
per-example verdicts in `diffs` (engine/runlog/diffs.py), never in the runs' activations.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from itertools import combinations
from typing import Any

from engine.core.forward import ExampleTrace, Prompts, RunContext, forward_example
from engine.core.graph import GraphSpec, parse_graph
from engine.core.loss import example_loss
from engine.data.examples import Example
from engine.events import CallRecord
from engine.llm.base import Backend
from engine.probes.probe import descendants
from engine.prompts.sets import prompt_set
from engine.runlog.diffs import (
    LoggedExample,
    RunSide,
    load_side,
    logged_traces,
    run_costs,
    save_diff,
)
from engine.runlog.state import load_cache

DEFAULT_BOUND = 3  # the largest set of source changes tried together
MAX_PATCHES = 64  # patches tried per example at most (the bound's combinations grow fast)


class DiffError(ValueError):
    """A diff asked of something the two runs do not have (bad input: one line, exit 2)."""


@dataclass
class NodeChange:
    node: str
    kind: str  # unchanged | source | downstream
    why: str = ""
    patchable: bool = True


@dataclass
class ExampleDiff:
    example: str
    split: str
    score_a: float | None
    score_b: float | None
    prediction_a: str
    prediction_b: str
    changes: list[NodeChange]
    explained_by: list[str] | None = None
    patched_score: float | None = None
    patched_prediction: str | None = None
    alternatives: list[list[str]] = field(default_factory=list)  # other sets as small
    tried: int = 0

    @property
    def differs(self) -> bool:
        return not same_score(self.score_a, self.score_b)

    @property
    def sources(self) -> list[str]:
        return [c.node for c in self.changes if c.kind == "source"]

    def to_json(self) -> dict[str, Any]:
        return {"example": self.example, "split": self.split, "score_a": self.score_a,
                "score_b": self.score_b, "differs": self.differs,
                "prediction_a": self.prediction_a, "prediction_b": self.prediction_b,
                "sources": self.sources,
                "downstream": [c.node for c in self.changes if c.kind == "downstream"],
                "changes": [asdict(c) for c in self.changes],
                "explained_by": self.explained_by, "patched_score": self.patched_score,
                "patched_prediction": self.patched_prediction,
                "alternatives": self.alternatives, "patches_tried": self.tried}


@dataclass
class DiffReport:
    diff_id: str
    run_a: str
    step_a: int
    run_b: str
    step_b: int
    split: str
    bound: int
    examples: list[ExampleDiff]
    not_compared: list[str]  # nodes only one graph has
    calls: int = 0
    model_calls: int = 0
    tokens: int = 0
    seconds: float = 0.0
    run_costs: dict[str, dict[str, float]] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)  # the shared nodes, in B's order
    model_change: str = ""  # the runs' models differ: why nothing was patched

    @property
    def differing(self) -> list[ExampleDiff]:
        return [e for e in self.examples if e.differs]

    def nodes(self) -> list[dict[str, Any]]:
        """Per shared node: differing examples it explains (is in the explaining set of),
        of those where it is a source change."""
        rows = []
        for node in self.order:
            of = sum(node in e.sources for e in self.differing)
            explains = sum(node in (e.explained_by or []) for e in self.differing)
            rows.append({"node": node, "explains": explains, "of": of,
                         "downstream": sum(any(c.node == node and c.kind == "downstream"
                                               for c in e.changes) for e in self.differing)})
        return rows

    def to_json(self) -> dict[str, Any]:
        return {"diff_id": self.diff_id, "run_a": self.run_a, "step_a": self.step_a,
                "run_b": self.run_b, "step_b": self.step_b, "split": self.split,
                "bound": self.bound, "compared": len(self.examples),
                "differing": len(self.differing),
                "examples": [e.to_json() for e in self.examples],
                "nodes": self.nodes(), "not_compared": self.not_compared,
                "model_change": self.model_change or None,
                "cost": {"calls": self.calls, "model_calls": self.model_calls,
                         "tokens": self.tokens, "seconds": round(self.seconds, 3)},
                "run_costs": self.run_costs}


def same_score(a: float | None, b: float | None) -> bool:
    return abs((a or 0.0) - (b or 0.0)) < 1e-9


class Side:
    """One run at one step: its graph, prompts and examples, and (made when first needed)
    a client with that run's backend, models, settings and reply cache."""

    def __init__(self, db: str, side: RunSide, backends: dict[str, Backend | None],
                 calls: list[CallRecord], caches: dict[str, Any]) -> None:
        self.db, self.side, self.backends, self.calls = db, side, backends, calls
        self.caches = caches  # one reply cache per mode, shared by both sides
        self.graph: GraphSpec = parse_graph(side.graph_yaml, side.config.get("graph", "<graph>"))
        initial = Prompts.initial(self.graph)
        text, version = dict(initial.text), dict(initial.version)
        for node_id, (v, t) in side.prompts.items():
            if node_id in text:
                text[node_id], version[node_id] = t, v
        self.prompts = Prompts(text, version)
        self.examples = {ex_id: Example(ex_id, fields, target)
                         for _, ex_id, fields, target in side.examples}
        self.split_of = {ex_id: split for split, ex_id, _, _ in side.examples}
        self.logged: dict[str, LoggedExample] = {}
        self._ctx: RunContext | None = None

    @property
    def model(self) -> tuple[str, str]:
        """The backend and model of the run's forward calls, as its runs row records them
        (a log without them: the run's config)."""
        return (self.side.backend or str(self.side.config.get("backend")),
                self.side.model or str(self.side.config.get("model")))

    def read_log(self, example_ids: list[str]) -> None:
        self.logged = logged_traces(self.db, self.side.run_id, self.prompts.version,
                                    example_ids)

    def ctx(self) -> RunContext:
        """The run's configuration: backend, models, prompt set, structured mode, limits."""
        if self._ctx is None:
            from engine.runs.execute import RunConfig, default_max_tokens, make_client

            config = RunConfig.from_json(self.side.config)
            if config.cache not in self.caches:
                self.caches[config.cache] = load_cache(self.db, config.cache)
            client = make_client(config, self.caches[config.cache], self.backends.get("forward"),
                                 self.backends.get("optimizer"))
            client.run_id = self.side.run_id

            def on_call(record: CallRecord) -> None:
                record.purpose = "diff"  # routed as forward or loss calls; logged as a diff
                self.calls.append(record)

            client.on_call = on_call
            max_tokens, optimizer_max_tokens = default_max_tokens(config)
            self._ctx = RunContext(self.graph, client, lambda event: None, self.side.run_id,
                                   self.side.step, max_tokens, optimizer_max_tokens,
                                   prompt_set=prompt_set(config.prompts))
        return self._ctx

    async def baseline(self, example_id: str) -> tuple[ExampleTrace, float | None, str]:
        """The logged trace with these prompts when there is one, else a forward pass with
        them through the run's cache."""
        example = self.examples[example_id]
        logged = self.logged.get(example_id)
        if logged is not None:
            return ExampleTrace(example, dict(logged.activations)), logged.score, \
                logged.prediction
        ctx = self.ctx()
        trace = await forward_example(ctx, self.prompts, example, self.split_of[example_id])
        loss = await example_loss(ctx, trace, self.split_of[example_id])
        return trace, loss.score, loss.prediction


def model_change(a: Side, b: Side) -> str:
    """One sentence when the two runs' forward calls ran on another backend or model, else
    "". A model change changes every LLM node's own behaviour at once: no patch can carry
    one node's share of it from A into B, so none is tried."""
    if a.model == b.model:
        return ""
    return (f"the runs use different models (A: {a.model[0]} '{a.model[1]}', B: "
            f"{b.model[0]} '{b.model[1]}'): every LLM node's behaviour differs, so no output "
            "is patched from one model's run into the other's")


def classify(a: Side, b: Side, ta: ExampleTrace, tb: ExampleTrace, order: list[str]
             ) -> list[NodeChange]:
    changes = []
    for node_id in order:
        act_a, act_b = ta.activations.get(node_id), tb.activations.get(node_id)
        if act_a is None or act_b is None:
            changes.append(NodeChange(node_id, "unchanged", "not run on one side"))
            continue
        llm = b.graph.node(node_id).kind == "llm"
        prompt = llm and a.prompts.text.get(node_id) != b.prompts.text.get(node_id)
        inputs = act_a.input_text != act_b.input_text
        if (act_a.output_text, act_a.error) == (act_b.output_text, act_b.error):
            why = "same output" + (" (prompt differs)" if prompt else "")
            changes.append(NodeChange(node_id, "unchanged", why))
        elif llm and a.model != b.model:  # its own behaviour changed, whatever its inputs
            changes.append(NodeChange(node_id, "source", "model differs"
                                      + (", and prompt" if prompt else "")
                                      + ("; its inputs differ too" if inputs else "")
                                      + ": not patched across models", False))
        elif node_id == b.graph.output_node.id and not prompt:
            # only a prompt is patched into the output node (see Differ.patch)
            if inputs:
                changes.append(NodeChange(node_id, "downstream", "its inputs differ"))
            else:
                changes.append(NodeChange(node_id, "source", "same inputs, different output"
                                          ": not patched (the output node)", False))
        elif prompt:
            changes.append(NodeChange(node_id, "source", "prompt differs"))
        elif inputs:
            changes.append(NodeChange(node_id, "downstream", "its inputs differ"))
        else:
            changes.append(NodeChange(node_id, "source", "same inputs, different output"))
    return changes


class Differ:
    def __init__(self, db: str, a: Side, b: Side, bound: int, diff_id: str) -> None:
        self.db, self.a, self.b, self.bound, self.diff_id = db, a, b, bound, diff_id
        self.patches: list[dict[str, Any]] = []
        self.order = [n for n in b.graph.topological_order() if n in a.graph.node_ids]

    async def compare(self, example_id: str) -> ExampleDiff:
        same_side = (self.a.side.run_id, self.a.prompts.version) == \
            (self.b.side.run_id, self.b.prompts.version)
        tb, score_b, pred_b = await self.b.baseline(example_id)
        ta, score_a, pred_a = (tb, score_b, pred_b) if same_side else \
            await self.a.baseline(example_id)
        result = ExampleDiff(example_id, self.b.split_of[example_id], score_a, score_b, pred_a,
                             pred_b, classify(self.a, self.b, ta, tb, self.order))
        if result.differs:
            await self.explain(result, ta, tb)
        return result

    async def explain(self, result: ExampleDiff, ta: ExampleTrace, tb: ExampleTrace) -> None:
        sources = [c.node for c in result.changes if c.kind == "source" and c.patchable]
        budget = MAX_PATCHES
        for size in range(1, min(self.bound, len(sources)) + 1):
            sets = list(combinations(sources, size))[:budget]
            budget -= len(sets)
            scores = await asyncio.gather(*(self.patch(result.example, ta, tb, list(s))
                                            for s in sets))
            result.tried += len(sets)
            hits = [(list(s), sc, pr) for s, (sc, pr) in zip(sets, scores)
                    if same_score(sc, result.score_a)]
            if hits:
                result.explained_by, result.patched_score, result.patched_prediction = hits[0]
                result.alternatives = [h[0] for h in hits[1:]]
                return
            if budget <= 0:
                return

    async def patch(self, example_id: str, ta: ExampleTrace, tb: ExampleTrace,
                    nodes: list[str]) -> tuple[float | None, str]:
        """B's example with `nodes` taking A's outputs; their descendants re-run in B."""
        graph = self.b.graph
        out = graph.output_node.id
        # The output node is re-run with A's prompt: copying its output would hand B A's
        # answer whatever the cause.
        rerun_own = [n for n in nodes if n == out]
        later = set().union(*(descendants(graph, n) for n in nodes)) - set(nodes)
        later |= set(rerun_own)
        fixed = {n: act for n, act in tb.activations.items() if n not in later}
        fixed.update({n: ta.activations[n] for n in nodes if n not in rerun_own})
        prompts = self.b.prompts.updated({n: (self.a.prompts.version[n], self.a.prompts.text[n])
                                          for n in rerun_own})
        ctx, split = self.b.ctx(), self.b.split_of[example_id]
        trace = await forward_example(ctx, prompts, self.b.examples[example_id], split,
                                      fixed=fixed)
        loss = await example_loss(ctx, trace, split)
        rerun = [n for n in graph.topological_order() if n in later]
        self.patches.append({
            "diff_id": self.diff_id, "example_id": example_id, "nodes": json.dumps(nodes),
            "score": loss.score, "prediction": loss.prediction,
            "outputs": json.dumps({n: trace.activations[n].output_text for n in rerun},
                                  ensure_ascii=False),
            "call_ids": json.dumps([trace.activations[n].call_id for n in rerun
                                    if trace.activations[n].call_id]
                                   + ([loss.call_id] if loss.call_id else [])),
            "error": loss.error})
        return loss.score, loss.prediction


def choose_examples(a: Side, b: Side, split: str, examples: str) -> list[str]:
    shared = [ex for ex in b.examples if ex in a.examples]
    if examples in ("differing", ""):
        chosen = [ex for ex in shared if b.split_of[ex] == split]
        if not chosen:
            raise DiffError(f"runs '{a.side.run_id}' and '{b.side.run_id}' share no {split} "
                            f"example{_why_none_shared(a, b, shared, split)}")
        return chosen
    wanted = [e.strip() for e in examples.split(",") if e.strip()]
    missing = [e for e in wanted if e not in shared]
    if missing:
        raise DiffError(f"example '{missing[0]}' is not evaluated by both runs "
                        f"('{a.side.run_id}' and '{b.side.run_id}')")
    return wanted


def _why_none_shared(a: Side, b: Side, shared: list[str], split: str) -> str:
    """What to do instead, when two runs share no example of `split`."""
    other = "train" if split == "val" else "val"
    if any(b.split_of[ex] == other for ex in shared):
        return f" (they share {other} examples: --split {other})"
    if any(n.recorded for side in (a, b) for n in side.graph.nodes):
        return (": an imported run's examples are its traces, and two imports share none; "
                "fork the imported run with the other's prompt (run --fork RUN --from-step 0 "
                "--set-prompt NODE=@FILE) and diff the fork against it")
    return ""


async def diff(db: str, run_a: str, run_b: str | None = None, *, step_a: int | None = None,
               step_b: int | None = None, split: str = "val", examples: str = "differing",
               bound: int = DEFAULT_BOUND, forward_backend: Backend | None = None,
               optimizer_backend: Backend | None = None, save: bool = True) -> DiffReport:
    """Diff run A (at step_a, default its last step) against run B (default A itself; at
    step_b, default its last step, or step_a - 1 when B is A): which source changes
    explain each example whose score differs. Writes the diff's rows unless save=False."""
    if split not in ("train", "val"):
        raise DiffError(f"--split must be train or val, not {split!r}")
    if bound < 1:
        raise DiffError("--bound must be at least 1")
    run_b = run_b or run_a
    side_a = load_side(db, run_a, step_a)
    if step_b is None and run_b == run_a and step_a is not None:
        step_b = step_a - 1
    side_b = load_side(db, run_b, step_b)
    started = time.perf_counter()
    calls: list[CallRecord] = []
    backends = {"forward": forward_backend, "optimizer": optimizer_backend}
    caches: dict[str, Any] = {}
    a, b = Side(db, side_a, backends, calls, caches), Side(db, side_b, backends, calls, caches)
    ids = choose_examples(a, b, split, examples)
    for side in (a, b):
        side.read_log(ids)
    diff_id = uuid.uuid4().hex[:16]
    differ = Differ(db, a, b, bound, diff_id)
    results = list(await asyncio.gather(*(differ.compare(ex) for ex in ids)))
    not_compared = sorted(set(a.graph.node_ids) ^ set(b.graph.node_ids))
    model = [c for c in calls if not c.cache_hit]
    report = DiffReport(diff_id, run_a, side_a.step, run_b, side_b.step, split, bound, results,
                        not_compared, len(calls), len(model),
                        sum(c.prompt_tokens + c.completion_tokens for c in model),
                        time.perf_counter() - started, run_costs(db, [run_a, run_b]),
                        differ.order, model_change(a, b))
    if save:
        now = time.time()
        rows = [{"diff_id": diff_id, "run_a": run_a, "step_a": side_a.step, "run_b": run_b,
                 "step_b": side_b.step, "split": e.split, "example_id": e.example,
                 "score_a": e.score_a, "score_b": e.score_b, "sources": json.dumps(e.sources),
                 "explained_by": json.dumps(e.explained_by), "patched_score": e.patched_score,
                 "tried": e.tried, "created_at": now} for e in results]
        cache_rows = [row for cache in caches.values() for row in cache.drain()]
        save_diff(db, [asdict(c) for c in calls], rows, differ.patches, cache_rows)
    return report


@dataclass
class LoggedComparison:
    """One example's two logged traces, node by node, and how each node changed."""

    diff: ExampleDiff
    outputs_a: dict[str, str]
    outputs_b: dict[str, str]
    order: list[str]
    not_compared: list[str]


def compare_logged(db: str, run_a: str, step_a: int | None, run_b: str, step_b: int | None,
                   example_id: str) -> LoggedComparison | None:
    """The classification of one example from the run log alone (no model call): None
    when either side has no logged trace with its prompts (a diff computes it)."""
    calls: list[CallRecord] = []
    a = Side(db, load_side(db, run_a, step_a), {}, calls, {})
    b = Side(db, load_side(db, run_b, step_b), {}, calls, {})
    if example_id not in a.examples or example_id not in b.examples:
        return None
    a.read_log([example_id])
    b.read_log([example_id])
    if example_id not in a.logged or example_id not in b.logged:
        return None
    la, lb = a.logged[example_id], b.logged[example_id]
    order = [n for n in b.graph.topological_order() if n in a.graph.node_ids]
    ta, tb = ExampleTrace(a.examples[example_id], la.activations), \
        ExampleTrace(b.examples[example_id], lb.activations)
    result = ExampleDiff(example_id, b.split_of[example_id], la.score, lb.score,
                         la.prediction, lb.prediction, classify(a, b, ta, tb, order))
    return LoggedComparison(result, {n: act.output_text for n, act in la.activations.items()},
                            {n: act.output_text for n, act in lb.activations.items()}, order,
                            sorted(set(a.graph.node_ids) ^ set(b.graph.node_ids)))
