"""What a run will cost, before its first call: model calls per phase, tokens and cost,
from the graph, the split sizes, the steps and the method. `run` prints `line()` before it
starts and `run --dry-run` prints `breakdown()`; the experiment estimate sums the same.

Two figures per phase. `expected`: the calls that reach the model with the cache on, with
the share of steps accepted that earlier runs of the graph saw (else a quarter). A step
after a rejected one repeats its train pass (cache hits), after an accepted one it re-runs the nodes an edit
reached; a candidate re-runs on validation only the nodes an edit reaches (after a run of
the graph: the share of its later validation passes' calls that were new requests to the
run, which also counts a candidate repeating another's edit);
`--node-gates auto` scores each edit alone after a rejection only; an accepted step (with
the gate on) scores its candidate without each of its edits in turn (pruning: one pass per
edit, each counted against the whole candidate; fewer once a drop leaves one edit), at the
share of steps accepted; nodes that start with the
same prompt and inputs share their calls until an accepted edit tells them apart; a step
that samples a failure an earlier step back-propagated under the same prompts repeats its
backward calls (cache hits). Which steps are accepted, and whether the steps find failing
examples at all, are the outcomes that move a run's cost most and that no estimate can
know, so `by_outcome` gives the calls and tokens from the cheapest (no failing example to
learn from) to the dearest (every step accepted), and the line prints them. `upper`:
no cache hit at all, the per-node gates wherever the mode allows them, and one repair call
per backward call. A fork's re-measure of its starting step re-runs only the nodes its
edited prompts reach (the others are answered from the parent's cache).

Tokens: each phase's calls times the size of one call of its kind, from the prompts the run
will send (engine/runs/call_sizes.py: templates rendered on the run's own examples, replies
sized from earlier runs of the graph in the run log, else from the model's runs of other
graphs, else from a prior by backend capped by max_tokens; the line names each prior it
used). On a local model with earlier calls in the run log, a time estimate from its
measured speed; before any, on the embedded pair, from its speed on a two-core machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from engine.core.graph import GraphSpec
from engine.core.optimizer import node_gates_apply
from engine.runs.call_sizes import CallSize, CallSizes

# Average (prompt, completion) tokens per call where no prompt was rendered (the experiment
# harness's upper bound): a forward call shows the question, the node's inputs and its
# prompt; a backward or update call shows a node's neighbourhood and the feedback.
FORWARD_TOKENS = (600, 200)
OPTIMIZER_TOKENS = (1500, 400)


@dataclass
class Phase:
    name: str
    purpose: str  # forward | optimizer: which model pays
    expected: int
    upper: int
    kind: str = ""  # forward | backward | update: the call whose size it pays (CallSizes)
    split: str | None = None  # a forward phase's examples
    # a validation pass after step 0 (candidates, per-node gates): its calls as the run
    # logs them, every node's, repeats included; with history, `expected` is the share of
    # these that were new requests in earlier runs (CallSizes.later_val_share)
    logged: float | None = None

    def size(self, sizes: CallSizes) -> CallSize:
        return sizes.for_phase(self.kind or self.purpose, self.split)


@dataclass
class RunEstimate:
    phases: list[Phase] = field(default_factory=list)
    models: tuple[str, str] = ("", "")
    prices: dict = field(default_factory=dict)
    sizes: CallSizes = field(default_factory=CallSizes)
    # ((calls, calls), (tokens, tokens)) from the cheapest outcome (no failing example to
    # learn from, or no step accepted) to the dearest (every step accepted)
    by_outcome: tuple[tuple[int, int], tuple[int, int]] | None = None

    def calls(self, purpose: str | None = None, upper: bool = False) -> int:
        return sum(p.upper if upper else p.expected for p in self.phases
                   if purpose in (None, p.purpose))

    def _tokens(self, purpose: str, upper: bool) -> tuple[float, float]:
        """(prompt, completion) tokens of one model's calls."""
        counted = [((p.upper if upper else p.expected), p.size(self.sizes))
                   for p in self.phases if p.purpose == purpose]
        return (sum(n * s.prompt for n, s in counted),
                sum(n * s.completion for n, s in counted))

    def tokens(self, upper: bool = False) -> int:
        return round(sum(sum(self._tokens(purpose, upper))
                         for purpose in ("forward", "optimizer")))

    def seconds(self) -> float | None:
        """Expected wall seconds on a local model whose speed the run log measured (else
        the embedded pair's reference speed), with its calls at once; None when neither."""
        if self.sizes.speed is None:
            return None
        total = sum(p.expected * (self.sizes.seconds(p.size(self.sizes)) or 0.0)
                    for p in self.phases)
        return total / self.sizes.speed[2]

    def cost(self, upper: bool = False) -> float | None:
        """US dollars, or None when a model has no known price."""
        from engine.llm.pricing import cost_usd

        parts = [cost_usd(self.prices, model, *(round(t) for t in self._tokens(purpose, upper)))
                 for model, purpose in ((self.models[0], "forward"),
                                        (self.models[1], "optimizer"))]
        return None if None in parts else sum(parts)

    def line(self) -> str:
        """One line: expected model calls, tokens, cost (and time on a local model whose
        speed is measured), and the upper bound. `run` prints it, and the dashboard's
        Estimate shows it (from `run --dry-run`)."""
        cost, most = self.cost(), self.cost(upper=True)
        money = (f"${cost:.2f} (at most ${most:.2f})" if cost is not None
                 else f"cost unknown (no price for {self._unpriced()})")
        seconds = self.seconds()
        time = "" if seconds is None else f", {duration(seconds, '~')} " + (
            "at this model's measured speed" if self.sizes.speed_measured else
            "at the speed of a two-core machine (no run of these models here yet)")
        assumed = "; assumed: " + ", ".join(self.sizes.assumptions) \
            if self.sizes.assumptions else ""
        if self.by_outcome and self.by_outcome[0][0] != self.by_outcome[0][1]:
            (low, high), (few, many) = self.by_outcome
            assumed += (f"; {low:,} to {high:,} calls, {compact(few)} to {compact(many)} "
                        "tokens from no failing example to every step accepted")
        return (f"estimate: ~{self.calls():,} model calls ({self.calls('forward'):,} forward, "
                f"{self.calls('optimizer'):,} optimizer; at most {self.calls(upper=True):,} "
                f"with no cache hits), ~{compact(self.tokens())} tokens, {money}{time}"
                f"{assumed}")

    def breakdown(self) -> list[str]:
        """The estimate by phase, as aligned plain lines."""
        rows = [("phase", "model", "calls", "at most")]
        rows += [(p.name, p.purpose, f"{p.expected:,}", f"{p.upper:,}") for p in self.phases]
        rows.append(("total", "", f"{self.calls():,}", f"{self.calls(upper=True):,}"))
        width = [max(len(r[i]) for r in rows) for i in range(4)]
        return [f"{r[0]:<{width[0]}}  {r[1]:<{width[1]}}  {r[2]:>{width[2]}}  "
                f"{r[3]:>{width[3]}}" for r in rows]

    def printed(self, dry_run: bool) -> list[str]:
        """What `run` prints before its first call: the one line; with --dry-run, the
        breakdown first and a last line saying nothing ran."""
        if not dry_run:
            return [self.line()]
        return [*self.breakdown(), self.line(), "dry run: no model call made, no run log "
                "written"]

    def _unpriced(self) -> str:
        return ", ".join(dict.fromkeys(m for m in self.models if m not in self.prices))


def duration(seconds: float, about: str = "") -> str:
    """A time as people say it, with one cut-off everywhere (run and blame estimates):
    "under a second", "{about}40 s", "{about}3 min"; `about`: "~" or "about "."""
    if seconds < 1:
        return "under a second"
    return f"{about}{seconds:.0f} s" if seconds < 90 else f"{about}{seconds / 60:.0f} min"


def compact(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def backward_calls_per_example(graph: GraphSpec, method: str, contrast: str | None = None
                               ) -> int:
    """Backward calls for one back-propagated example, as the method counts them, and the
    sibling-blind ones `contrast` adds beside a method that has one."""
    from engine.core.backward import contrast_calls
    from engine.methods import METHODS

    kind = METHODS[method]
    return kind.backward_calls(graph) + (contrast_calls(graph, contrast)
                                         if kind.contrastable else 0)


def repeated_sample_share(steps: int, k: int, failing: int, accepted: float) -> float:
    """Of the examples a run's steps back-propagate, the expected share that an earlier
    step back-propagated under the same prompts: their backward calls repeat requests
    already made, which the cache answers. Step j samples k of `failing` examples afresh
    (seeded by the step), so an example it samples was sampled at step t < j with
    probability k / failing, and the prompts are unchanged since t when none of the
    steps after it was accepted. How many training examples fail is not known before
    the run: `failing` is the prior that every one does (starting prompts are poor)."""
    if steps < 2 or failing <= 0:
        return 0.0
    chance = min(1.0, k / failing)
    total = 0.0
    for j in range(2, steps + 1):
        fresh = 1.0
        for t in range(1, j):
            fresh *= 1 - chance * (1 - accepted) ** (j - t)
        total += 1 - fresh
    return total / steps


def _reach(graph: GraphSpec) -> dict[str, set[str]]:
    """Each node with its ancestors: the nodes whose prompts shape its calls."""
    reach: dict[str, set[str]] = {}
    for node in graph.topological_order():
        reach[node] = {node}.union(*(reach[p] for p in graph.predecessors(node)))
    return reach


def distinct_calls(graph: GraphSpec) -> int:
    """LLM node calls per example under the initial prompts once identical requests are
    made once: two nodes with the same prompt and the same inputs (the paper's GSM8K hints
    start so) send the same request, which the cache and in-flight sharing answer once."""
    ids, sig = set(graph.node_ids), {}
    for node_id in graph.topological_order():
        n = graph.node(node_id)
        sig[node_id] = (n.kind, n.prompt, n.function, n.output, n.max_tokens,
                        tuple((name, sig.get(name) if name in ids else None)
                              for name in n.inputs))
    return len({sig[n.id] for n in graph.nodes if n.kind == "llm" and n.id in sig})


def node_gate_calls(graph: GraphSpec, changed: list[str], cached: bool) -> int:
    """Node calls per validation example that scoring each edit alone adds to the joint
    pass: a node's call differs only by which changed prompts reach it, so per node the
    distinct reaching sets of the edits alone, less the joint one (and, with the cache, less
    the empty set: the old prompts' calls, seen before)."""
    reach = _reach(graph)
    extra = 0
    for node in (n.id for n in graph.nodes if n.kind == "llm"):
        joint = frozenset(changed) & reach[node]
        alone = {frozenset({n}) & reach[node] for n in changed}
        alone.discard(joint)
        if cached:
            alone.discard(frozenset())
        extra += len(alone)
    return extra


def prune_calls(graph: GraphSpec, changed: list[str], cached: bool, alone: bool = False) -> int:
    """Node calls per validation example that pruning (an accepted candidate scored without
    each of its edits in turn) adds to the joint pass, and to the passes of each edit alone
    that `--node-gates on` runs beside it (`alone`): per node, the distinct sets of edits
    reaching it once one edit is left out, less those the gate's passes made (and, with the
    cache, less the empty set: the old prompts' calls, seen before). Each pass is counted
    against the whole candidate: after a dropped edit the sets are smaller, and once one
    edit is left no pass is made, so a run makes at most about this many."""
    if len(changed) < 2:
        return 0
    reach = _reach(graph)
    extra = 0
    for node in (n.id for n in graph.nodes if n.kind == "llm"):
        edits = frozenset(changed) & reach[node]
        seen = {edits} | ({frozenset({n}) & reach[node] for n in changed} if alone else set())
        if cached:
            seen.add(frozenset())
        extra += len({edits - {n} for n in changed} - seen)
    return extra


def estimate_calls(graph: GraphSpec, config: Any, n_train: int, n_val: int, n_test: int,
                   models: tuple[str, str] = ("", ""), prices: dict | None = None,
                   start: int = 0, baseline: bool = True, edited: list[str] | None = None,
                   sizes: CallSizes | None = None, test_differs: list[str] | None = None
                   ) -> RunEstimate:
    """The run's model calls by phase (see the module docstring); `config` is a RunConfig.
    A fork starts at step `start` (its optimization steps are start+1..config.steps) and
    scores train and validation there only when `baseline` (it re-measures edited
    prompts; with `edited`, the nodes whose prompts a fork edited, only the nodes they
    reach re-run there: the others' calls are the parent's, answered by the cache).
    `test_differs`: a fork's nodes whose prompts differ from those of its parent's test
    pass (whose calls the cache answers for the others); None: no test pass to reuse.
    `sizes`: tokens per call (engine/runs/call_sizes.py; default: fixed averages).
    Its `by_outcome`: the calls and tokens from the cheapest outcome (no training example
    fails, or no candidate passes the gate) to the dearest (every candidate passes), the
    outcomes no estimate can know before the run."""
    sizes = sizes or CallSizes()
    args = (graph, config, n_train, n_val, n_test, start, baseline, edited, test_differs)
    estimate = RunEstimate(_phases(*args, sizes), models, dict(prices or {}), sizes)
    if config.steps > start:
        ends = [RunEstimate(_phases(*args, replace(sizes, accepted_share=share), failing),
                            sizes=sizes) for share, failing in ((0.0, False), (0.0, True),
                                                                (1.0, True))]
        estimate.by_outcome = ((min(e.calls() for e in ends), max(e.calls() for e in ends)),
                               (min(e.tokens() for e in ends), max(e.tokens() for e in ends)))
    return estimate


def _phases(graph: GraphSpec, config: Any, n_train: int, n_val: int, n_test: int, start: int,
            baseline: bool, edited: list[str] | None, test_differs: list[str] | None,
            sizes: CallSizes, failing: bool = True) -> list[Phase]:
    """The phases of `estimate_calls`, at `sizes.accepted_share`; `failing`: the steps find
    failing training examples to learn from (the prior: starting prompts are poor), else
    a step has nothing to back-propagate, propose or score."""
    llm = [n.id for n in graph.nodes if n.kind == "llm"]
    nodes, steps = len(llm), config.steps - start
    first, last = start + 1, config.steps
    span = f"step {first}" if first == last else f"steps {first}-{last}"
    cached = config.cache != "off"
    judge = graph.metric == "judge"
    trainable = graph.trainable_nodes
    changed = trainable[:1] if config.update_mode == "one" else trainable
    reach = _reach(graph)
    reached = sum(1 for n in llm if reach[n] & set(changed))  # nodes an edit reaches
    # identical requests in flight together are made once whatever the cache setting
    initial = distinct_calls(graph)
    sampled = min(config.failures_per_step, n_train)
    backward = sampled * backward_calls_per_example(graph, config.method,
                                                    getattr(config, "contrast", None))
    mode, k = config.node_gates, len(changed)
    candidates = getattr(config, "proposals", 1)  # each: its update calls, a validation pass
    gates_expected = node_gates_apply(mode, k)
    gate_nodes = node_gate_calls(graph, changed, cached), node_gate_calls(graph, changed, False)

    phases = []
    rerun = initial
    if baseline:
        rerun = sum(1 for n in llm if reach[n] & set(edited)) if edited and cached else initial
        phases.append(Phase(f"step {start}: train", "forward", n_train * rerun,
                            n_train * nodes, "forward", "train"))
        phases.append(Phase(f"step {start}: validation", "forward", n_val * rerun,
                            n_val * nodes, "forward", "val"))
        if judge:
            phases.append(Phase(f"step {start}: judge", "optimizer", n_train + n_val,
                                n_train + n_val))
    if steps:
        # step 1 repeats step 0's train pass; a later one, only after a rejection
        after_accept = (steps - 1) * sizes.accepted_share
        train = round(after_accept * n_train * reached) if cached else round(
            n_train * initial + after_accept * n_train * nodes
            + (steps - 1 - after_accept) * n_train * initial)
        phases.append(Phase(f"{span}: forward on train", "forward", train,
                            steps * n_train * nodes, "forward", "train"))
        if judge:
            phases.append(Phase(f"{span}: judge on train", "optimizer",
                                round(after_accept * n_train) if cached else steps * n_train,
                                steps * n_train))
        repeated = repeated_sample_share(steps, sampled, n_train, sizes.accepted_share) \
            if cached else 0.0
        proposing = steps if failing else 0  # steps that back-propagate and propose
        phases += [Phase(f"{span}: backward", "optimizer",
                         round(proposing * backward * (1 - repeated)), steps * backward,
                         "backward"),
                   Phase(f"{span}: repairs", "optimizer", 0, steps * backward, "backward"),
                   Phase(f"{span}: update", "optimizer", proposing * k * candidates,
                         steps * k * candidates, "update"),
                   Phase(f"{span}: validation candidate" + ("s" if candidates > 1 else ""),
                         "forward", proposing * n_val * (reached if cached else nodes)
                         * candidates, steps * n_val * nodes * candidates, "forward", "val",
                         logged=proposing * n_val * nodes * candidates)]
        if judge:
            phases.append(Phase(f"{span}: judge on validation", "optimizer",
                                proposing * n_val, steps * n_val))
        if mode != "off" and k >= 2:
            # auto: after rejections only
            gated = proposing * (1.0 if mode == "on" else 1 - sizes.accepted_share)
            phases.append(Phase(f"{span}: per-node gates ({mode})", "forward",
                                round(gated * n_val * gate_nodes[0]) if gates_expected else 0,
                                steps * n_val * gate_nodes[1] if gates_expected else 0,
                                "forward", "val", logged=gated * n_val * gate_nodes[1]
                                if gates_expected else 0))
            if judge and gates_expected:
                phases.append(Phase(f"{span}: judge per-node gates", "optimizer",
                                    round(gated * n_val * k), steps * n_val * k))
        if config.gate and k >= 2:
            # an accepted candidate scored without each of its edits: after acceptances only
            pruned = proposing * sizes.accepted_share
            on = gates_expected and mode == "on"
            per = prune_calls(graph, changed, cached, alone=on), prune_calls(graph, changed,
                                                                              False, alone=on)
            # under auto a step scores its edits alone (rejected) or prunes them (accepted),
            # never both: the two phases' at-most add up to the dearer of the two a step
            most = max(0, per[1] - gate_nodes[1]) if gates_expected and mode == "auto" \
                else per[1]
            phases.append(Phase(f"{span}: pruning the kept edits", "forward",
                                round(pruned * n_val * per[0]), steps * n_val * most,
                                "forward", "val", logged=pruned * n_val * per[1]))
            if judge:
                phases.append(Phase(f"{span}: judge pruning", "optimizer",
                                    round(pruned * n_val * k), steps * n_val * k))
    if n_test:
        # identical initial prompts stay shared unless some step was accepted
        some_accepted = 1 - (1 - sizes.accepted_share) ** steps
        # a fork's test pass repeats its parent's for the nodes whose prompts are the ones
        # the parent tested with, and that no differing prompt reaches
        base = initial if test_differs is None or not cached else sum(
            1 for n in llm if reach[n] & set(test_differs))
        phases.append(Phase("test", "forward",
                            round(n_test * (base + (nodes - base) * some_accepted)),
                            n_test * nodes, "forward", "test"))
        if judge:
            phases.append(Phase("test: judge", "optimizer", n_test, n_test))
    later = sizes.later_val_share if cached else None
    for phase in phases:  # requests repeated within a pass are made once
        if phase.logged is not None and later is not None:
            # what earlier runs' passes asked anew: nodes an edit left alone, a candidate
            # repeating another's edit, requests repeated within the pass
            phase.expected = round(phase.logged * later)
        elif phase.purpose == "forward":
            phase.expected = round(phase.expected * sizes.distinct_share)
    return phases


def estimate_for(config: Any, graph: GraphSpec, splits: Any, start: int = 0,
                 baseline: bool = True, edited: list[str] | None = None,
                 test_differs: list[str] | None = None) -> RunEstimate:
    """The estimate of a run with `config` (a RunConfig) over `splits`, priced with the
    models it will use (as engine.runs.execute.make_client resolves them), its tokens from
    the prompts it will send (engine/runs/call_sizes.py); `start`, `baseline` and `edited`
    and `test_differs` as in `estimate_calls` (a fork: engine.runs.fork.ForkPlan)."""
    from engine.llm.factory import default_model
    from engine.llm.pricing import load_prices
    from engine.runs.call_sizes import measure_sizes

    model = config.model or default_model(config.backend)
    opt_kind = config.optimizer_backend or config.backend
    optimizer = config.optimizer_model or (
        model if opt_kind == config.backend else default_model(opt_kind))
    if config.optimizer_model is None and opt_kind == config.backend == "local":
        from engine.llm.models import paired_optimizer

        optimizer = paired_optimizer(model)[0] or optimizer  # as the run will pair them
    return estimate_calls(graph, config, len(splits.train), len(splits.val), len(splits.test),
                          (model, optimizer), load_prices(), start=start, baseline=baseline,
                          edited=edited,
                          sizes=measure_sizes(graph, config, splits, model, optimizer),
                          test_differs=test_differs)


def estimate_fork(plan: Any) -> RunEstimate:
    """The estimate of a planned fork (engine.runs.fork.ForkPlan): its own steps, and its
    starting step's re-measure when it has one, of the nodes its edited prompts reach (all
    of them on new examples); its test pass re-runs what the parent's test pass did not
    ask (the nodes reached by prompts that differ from the parent's last ones)."""
    return estimate_for(plan.config, plan.graph, plan.splits, start=plan.from_step,
                        baseline=plan.rescore,
                        edited=None if plan.resplit else list(plan.edited),
                        test_differs=None if plan.resplit else parent_test_differs(plan))


def parent_test_differs(plan: Any) -> list[str] | None:
    """The nodes whose prompts at the fork's start differ from those the parent's test pass
    used (its last prompts: a parent that accepted edits after the fork step tested other
    prompts than the fork starts with); None when the parent ran no test pass, or stored
    none of its replies (`--cache` other than readwrite)."""
    from engine.runlog.state import load_resume_state

    parent = load_resume_state(plan.config.db, plan.parent_id)
    stored = parent.config.get("cache", "readwrite") == "readwrite"
    if parent.state is None or not parent.test_done or not stored:
        return None
    last, start = parent.state.prompts.text, plan.state.prompts.text
    return [n for n in plan.graph.node_ids if last.get(n) != start.get(n)]
