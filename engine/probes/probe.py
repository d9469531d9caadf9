"""Counterfactual probes: change one thing in a logged run, re-run only what depends on it.

A semantic gradient is a claim: "had this node's output been like this, the answer would
have been right". A probe tests such a claim by intervention, as activation patching does
in a network (docs/probes.md):

- `output`: replace node N's output on example E with a given text;
- `gradient`: ask the optimizer model to rewrite N's output as the gradient N received
  says, and use that;
- `edit`: run N with another prompt (that step's proposal, or the user's), every other
  prompt as it was.

Then N's descendants are re-run and the example is scored again. Upstream activations come
from the run log; new calls go through the run's client and reply cache, so a repeated
probe makes no model call. Calls are logged in `llm_calls` with purpose `probe`, results in
`probes`, re-computed outputs in `probe_outputs`: never in the run's own activations.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from engine.core.forward import (
    ExampleTrace,
    Prompts,
    RunContext,
    call_function,
    call_node,
    node_inputs,
)
from engine.core.graph import GraphSpec
from engine.core.loss import example_loss
from engine.data.examples import Example
from engine.events import Activation, CallRecord
from engine.llm.base import Backend
from engine.probes.leaks import leaks_answer
from engine.prompts import templates as P
from engine.prompts.recorded import RECORDED_FIELD, recorded_output
from engine.runlog.probing import example_outputs, logged_run_rows, save_probe_rows
from engine.runlog.schema import RunLogError, check_readable
from engine.runlog.state import load_cache
from engine.runs.code import bind_logged_graph

KINDS = ("output", "gradient", "edit")


def probe_rewrite_messages(read: str, output: str, feedback: str) -> list[tuple[str, str]]:
    """The gradient probe's rewrite call: what the node read (its inputs as blocks, or an
    imported call's messages with its inputs tagged: the activation's `input_text`), its
    output and gradient, not its prompt (engine/prompts/templates.py says why)."""
    return [("system", P.PROBE_REWRITE_SYSTEM),
            ("user", P.PROBE_REWRITE.format(inputs=read, output=output, feedback=feedback))]


class ProbeError(ValueError):
    """A probe asked of something the run log does not have (bad input: one line, exit 2)."""


@dataclass
class ProbeOutput:
    """A node output a probe re-computed (or replaced): a `probe_outputs` row."""

    node_id: str
    output_text: str
    error: str | None = None
    call_id: str | None = None


@dataclass
class ProbeResult:
    """One intervention on one example: a `probes` row. before/after_output are the graph's
    final output (the prediction); the intervened node's new text is `intervention` for
    output and gradient probes, and its row in `outputs` for every kind."""

    run_id: str
    step: int
    example_id: str
    node_id: str
    kind: str
    intervention: str
    before_output: str
    after_output: str
    before_score: float | None
    after_score: float | None
    call_ids: list[str] = field(default_factory=list)
    leaks_target: bool = False
    error: str | None = None
    outputs: list[ProbeOutput] = field(default_factory=list)
    probe_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    created_at: float = field(default_factory=time.time)
    # known to the report, not stored: the update call saw this example (an edit flip on
    # it is in-sample), which re-sample this was, and whose gradient was followed
    in_sample: bool = False
    sample_index: int = 0
    method: str = ""
    edge: str = ""  # the successor whose gradient alone was followed ("" for the node's)

    @property
    def flipped(self) -> bool:
        """The intervention turned a wrong answer right."""
        return (self.error is None and self.before_score is not None
                and self.before_score < 1.0 and (self.after_score or 0.0) >= 1.0)

    @property
    def regressed(self) -> bool:
        """The intervention broke an example that passed."""
        return (self.error is None and self.before_score is not None
                and self.before_score >= 1.0 and (self.after_score or 0.0) < self.before_score)

    @property
    def score_change(self) -> float | None:
        if self.error is not None or self.before_score is None or self.after_score is None:
            return None
        return self.after_score - self.before_score

    def row(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items()
                if k not in ("outputs", "in_sample", "sample_index", "method", "edge")}
        data["call_ids"] = json.dumps(self.call_ids)
        return data


@dataclass
class LoggedRun:
    """What a probe reads from the run log: the run as it was at one step."""

    db: str
    run_id: str
    step: int
    config: dict[str, Any]
    graph: GraphSpec
    examples: dict[str, Example]
    split_of: dict[str, str]
    prompts: Prompts  # in effect when the step started (its training forward pass)
    running: list[str]  # runs of this log still being written by another process

    def example(self, example_id: str) -> Example:
        if example_id not in self.examples:
            raise ProbeError(f"run '{self.run_id}' has no example '{example_id}'")
        return self.examples[example_id]

    def node(self, node_id: str, need_prompt: bool = False):
        if node_id not in self.graph.node_ids:
            raise ProbeError(f"graph '{self.graph.name}' has no node '{node_id}' (nodes: "
                             f"{', '.join(self.graph.node_ids)})")
        node = self.graph.node(node_id)
        if need_prompt and node.kind != "llm":
            raise ProbeError(f"node '{node_id}' is a function node: it has no prompt to edit")
        return node


def load_run(db: str, run_id: str, step: int) -> LoggedRun:
    check_readable(db)
    logged = logged_run_rows(db, run_id, step)
    if logged is None:
        raise RunLogError(f"{db}: no run '{run_id}' (see: python -m engine runs --db {db})")
    steps = logged["steps"]
    if step not in steps:
        done = f"steps {steps[0]}..{steps[-1]}" if steps else "no complete step"
        raise ProbeError(f"run '{run_id}' has no complete step {step} ({done})")
    rows, versions, running = logged["examples"], logged["versions"], logged["running"]
    config = logged["config"]
    # a run built in Python: its tools and metric imported again from where it recorded them
    graph = bind_logged_graph(logged["graph_yaml"], config.get("graph", "<graph>"),
                              config.get("code"))
    prompts = Prompts.initial(graph)
    text, version = dict(prompts.text), dict(prompts.version)
    for node_id, v, prompt in versions:
        text[node_id], version[node_id] = prompt, v
    examples = {r[1]: Example(r[1], r[2], r[3]) for r in rows}
    return LoggedRun(db, run_id, step, config, graph, examples, {r[1]: r[0] for r in rows},
                     Prompts(text, version), running)


def descendants(graph: GraphSpec, node_id: str) -> set[str]:
    found, stack = set(), list(graph.successors(node_id))
    while stack:
        node = stack.pop()
        if node not in found:
            found.add(node)
            stack.extend(graph.successors(node))
    return found


def leaks_target(text: str, target: str, metric: str = "auto") -> bool:
    """The intervention carries the target in a form the metric reads as the answer
    (engine/probes/leaks.py): a flip it causes may be the answer copied through, not
    credit."""
    return leaks_answer(text, target, metric)


class _Resampled:
    """The run's client with every request drawn as sample `index` (a `--repeats` probe at
    temperature > 0): another draw, and another cache entry, of the same calls."""

    def __init__(self, client, index: int) -> None:
        self._client, self._index = client, index

    def request(self, *args, **kwargs):
        kwargs.setdefault("sample_index", self._index)
        return self._client.request(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._client, name)


@dataclass
class Baseline:
    """One example's trace and score with the step's prompts."""

    trace: ExampleTrace
    score: float | None
    prediction: str
    split: str


class Prober:
    """Runs probes on one logged step with the run's client and cache; collects the rows
    and calls to write, then `save()` writes them in one short transaction."""

    def __init__(self, run: LoggedRun, ctx: RunContext, cache) -> None:
        self.run, self.ctx, self.cache = run, ctx, cache
        self.calls: list[CallRecord] = []
        self.results: list[ProbeResult] = []
        self._baselines: dict[str, asyncio.Future] = {}

    def on_call(self, record: CallRecord) -> None:
        record.purpose = "probe"  # routed as forward or optimizer calls; logged as probes
        self.calls.append(record)

    async def baseline(self, example_id: str) -> Baseline:
        """The step's own trace of the example when the log has one with the step's prompts
        (the training forward pass); else a forward pass with those prompts, through the
        cache."""
        if example_id not in self._baselines:
            self._baselines[example_id] = asyncio.ensure_future(self._baseline(example_id))
        return await self._baselines[example_id]

    async def _baseline(self, example_id: str) -> Baseline:
        example, split = self.run.example(example_id), self.run.split_of[example_id]
        logged = logged_trace(self.run, example)
        if logged is not None:
            return logged
        trace = ExampleTrace(example)
        await self._rerun(trace, self.run.prompts, self.run.graph.topological_order(), {})
        loss = await example_loss(self.ctx, trace, split)
        return Baseline(trace, loss.score, loss.prediction, split)

    async def _rerun(self, trace: ExampleTrace, prompts: Prompts, nodes: list[str],
                     replaced: dict[str, ProbeOutput], ctx: RunContext | None = None
                     ) -> list[ProbeOutput]:
        """Run `nodes` (in topological order) on the trace, in place; return their outputs.
        On a run that re-runs its pipeline, the pipeline runs whole on the example, with
        the replaced nodes' replies patched, and the nodes' activations are read back."""
        ctx = ctx or self.ctx
        if ctx.rerun is not None:
            fixed = {n: replace(trace.activations[n], output_text=r.output_text, error=None,
                                call_id=r.call_id) for n, r in replaced.items()}
            fresh = await ctx.rerun.forward_example(ctx, prompts, trace.example,
                                                    self.run.split_of[trace.example.id],
                                                    fixed)
            trace.activations.update(fresh.activations)
            trace.inputs.update(fresh.inputs)
            return [replaced[n] if n in replaced else ProbeOutput(
                n, trace.activations[n].output_text, trace.activations[n].error,
                trace.activations[n].call_id) for n in nodes]
        outputs = []
        for node_id in nodes:
            node = self.run.graph.node(node_id)
            if node_id in replaced:
                new = replaced[node_id]
                trace.activations[node_id] = replace(
                    trace.activations[node_id], output_text=new.output_text, error=None,
                    call_id=new.call_id)
                outputs.append(new)
                continue
            activation = await self._activation(trace, prompts, node, ctx)
            trace.activations[node_id] = activation
            outputs.append(ProbeOutput(node_id, activation.output_text, activation.error,
                                       activation.call_id))
        return outputs

    async def _activation(self, trace: ExampleTrace, prompts: Prompts, node,
                          ctx: RunContext) -> Activation:
        split = self.run.split_of[trace.example.id]
        values, failed = node_inputs(node, trace.example, trace.activations)
        if failed:
            return _failed(ctx, trace.example, node.id, split, f"upstream node '{failed}' failed")
        trace.inputs[node.id] = values
        if node.kind == "function":
            output, error = await call_function(node, values)
            return replace(_failed(ctx, trace.example, node.id, split, error),
                           output_text=output)
        return await call_node(ctx, prompts, trace.example, node, values, split)

    async def intervene(self, kind: str, example_id: str, node_id: str, *,
                        text: str | None = None, feedback: str | None = None,
                        prompt: str | None = None, sample_index: int = 0,
                        in_sample: bool = False, method: str = "", edge: str = ""
                        ) -> ProbeResult:
        """One probe. output: `text` replaces the node's output; gradient: the optimizer
        model rewrites the output following `feedback`; edit: the node runs with `prompt`.
        `sample_index` > 0 draws its calls again (repeats at temperature > 0); `in_sample`,
        `method` and `edge` (the successor whose gradient alone `feedback` is) are carried
        to the result for the report."""
        ctx = self.ctx if not sample_index else replace(
            self.ctx, client=_Resampled(self.ctx.client, sample_index))
        base = await self.baseline(example_id)
        example, graph = base.trace.example, self.run.graph
        trace = ExampleTrace(example, dict(base.trace.activations), dict(base.trace.inputs))
        later = [n for n in graph.topological_order() if n in descendants(graph, node_id)]
        prompts, replaced, error = self.run.prompts, {}, None
        if kind == "edit":
            prompts = prompts.updated({node_id: (-1, prompt or "")})
            intervention = prompt or ""
        else:
            intervention, call_id, error = (text or "", None, None) if kind == "output" else \
                await self.follow_gradient(base.trace, node_id, feedback or "", ctx)
            replaced[node_id] = ProbeOutput(node_id, intervention, error, call_id)
        if error:  # the rewrite call failed: nothing to re-run
            result = ProbeResult(self.run.run_id, self.run.step, example_id, node_id, kind, "",
                                 base.prediction, "", base.score, None,
                                 [replaced[node_id].call_id or ""], False, error,
                                 in_sample=in_sample, sample_index=sample_index, method=method,
            edge=edge)
            self.results.append(result)
            return result
        outputs = await self._rerun(trace, prompts, [node_id, *later], replaced, ctx)
        loss = await example_loss(ctx, trace, base.split)
        call_ids = [o.call_id for o in outputs if o.call_id] + \
            ([loss.call_id] if loss.call_id else [])
        result = ProbeResult(
            self.run.run_id, self.run.step, example_id, node_id, kind, intervention,
            base.prediction, loss.prediction, base.score, loss.score, call_ids,
            leaks_target(intervention, example.target, graph.metric), loss.error, outputs,
            in_sample=in_sample, sample_index=sample_index, method=method,
            edge=edge)
        self.results.append(result)
        return result

    async def follow_gradient(self, trace: ExampleTrace, node_id: str, feedback: str,
                              ctx: RunContext | None = None
                              ) -> tuple[str, str | None, str | None]:
        """(rewritten output, call id, error): the optimizer model applies the gradient."""
        ctx = ctx or self.ctx
        node = self.run.graph.node(node_id)
        activation = trace.activations.get(node_id)
        read = activation.input_text if activation else P.render_inputs(
            trace.inputs.get(node_id, {}))
        messages = probe_rewrite_messages(read, trace.output(node_id), feedback)
        request = ctx.client.request(
            "probe", messages, max_tokens=ctx.optimizer_max_tokens,
            meta={"role": "probe_rewrite", "node": node.id, "output": trace.output(node_id),
                  "feedback": feedback})
        record = await ctx.client.call(request, step=self.run.step, node_id=node_id,
                                            example_id=trace.example.id)
        if record.error:
            return "", record.call_id, f"rewrite call failed: {record.error}"
        rewritten, _ = P.parse_output(record.response)
        if node.recorded:  # written in the framework's format (DSPy's `[[ ## note ## ]]`, as
            # the messages it was shown ask): the value is what the framework would read
            value, problem = recorded_output(
                trace.example.fields.get(RECORDED_FIELD, ""), node_id, rewritten)
            rewritten = rewritten if problem else value
        return rewritten, record.call_id, None

    def save(self) -> None:
        """Write calls, probes, re-computed outputs and new cache entries in one transaction
        (retried while a running run holds the file: that run is never blocked for long)."""
        outputs = [{"probe_id": r.probe_id, "run_id": r.run_id, "step": r.step,
                    "example_id": r.example_id, **asdict(o)}
                   for r in self.results for o in r.outputs]
        save_probe_rows(self.run.db, [asdict(c) for c in self.calls],
                        [r.row() for r in self.results], outputs, self.cache.drain())
        self.calls, self.results = [], []


def _failed(ctx: RunContext, example: Example, node_id: str, split: str,
            error: str | None) -> Activation:
    return Activation(ctx.run_id, ctx.step, split, example.id, node_id, 0, "", "", error)


def logged_trace(run: LoggedRun, example: Example) -> Baseline | None:
    """The example's logged trace whose every node ran with the step's prompt versions;
    the probe's own step first, then the latest such."""
    rows, losses = example_outputs(run.db, run.run_id, example.id, run.step)
    groups: dict[tuple[int, str], dict[str, Activation]] = {}
    for r in rows:
        groups.setdefault((r[0], r[1]), {})[r[2]] = Activation(
            run.run_id, r[0], r[1], example.id, r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9])
    wanted = run.prompts.version
    for key, acts in groups.items():
        if set(acts) == set(wanted) and key in losses and all(
                acts[n].prompt_version == v for n, v in wanted.items()):
            trace = ExampleTrace(example, acts, _inputs(run.graph, example, acts))
            return Baseline(trace, losses[key][0], losses[key][1], key[1])
    return None


def _inputs(graph: GraphSpec, example: Example, acts: dict[str, Activation]
            ) -> dict[str, dict[str, str]]:
    """What each node read in a logged trace (a failed upstream node's logged output too)."""
    return {node.id: {name: acts[name].output_text if name in acts
                      else example.fields.get(name, "") for name in node.inputs}
            for node in graph.nodes}


def open_prober(run: LoggedRun, forward_backend: Backend | None = None,
                optimizer_backend: Backend | None = None, rerun: Any = None) -> Prober:
    """A prober in exactly the run's configuration: its backends and models, prompt set,
    structured mode, temperature and seed, token limits, and its reply cache; `rerun`
    (engine.gateway.rerun.PipelineRerun) re-runs a gateway-recorded run's pipeline."""
    from engine.prompts.sets import prompt_set
    from engine.runs.execute import RunConfig, default_max_tokens, make_client

    config = RunConfig.from_json(run.config)
    cache = load_cache(run.db, config.cache)
    client = make_client(config, cache, forward_backend, optimizer_backend)
    client.run_id = run.run_id
    max_tokens, optimizer_max_tokens = default_max_tokens(config)
    # the run's own prompt set: descendants re-run as the run ran them, else an identity
    # patch (a node's output replaced by itself) could change the answer
    ctx = RunContext(run.graph, client, lambda event: None, run.run_id, run.step, max_tokens,
                     optimizer_max_tokens, prompt_set(config.prompts), rerun=rerun)
    prober = Prober(run, ctx, cache)
    client.on_call = prober.on_call
    return prober
