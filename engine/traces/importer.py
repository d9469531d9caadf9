"""`import-traces`: a pipeline's traces become a run in the run log.

The run is an ordinary one at step 0: its graph has one `recorded` LLM node per call site
(engine/prompts/recorded.py), its training examples are the scored traces (unscored ones
are kept in the split `unscored`; with `val`, the last `val` scored traces are held out as
its validation split), and its forward pass is the recorded calls, replayed:
a backend that answers each request with the reply the trace recorded runs the graph
through the run's client, so the node outputs, losses, calls and reply cache are written
exactly as a run writes them. Later forward passes with the same prompts are cache hits;
any change (a probe, a proposal) calls the user's model through the OpenAI-compatible
backend.
"""

from __future__ import annotations

import asyncio
import gc
import json
import secrets
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from engine.core.forward import Prompts, RunContext, forward_pass
from engine.core.graph import METRICS, GraphError, GraphSpec, parse_graph
from engine.core.loss import compute_losses
from engine.data.examples import Example
from engine.events import EventBus, PromptVersion, StepFinished
from engine.llm.base import LLMError, LLMReply, LLMRequest, estimate_tokens
from engine.llm.cache import Cache
from engine.prompts.recorded import RECORDED_FIELD, recorded_messages, recorded_tools
from engine.prompts.sets import prompt_set
from engine.runlog.schema import RunLogError, log_exists
from engine.runlog.state import run_exists
from engine.runlog.writer import RunLogWriter, open_for_writing, run_row
from engine.runs.execute import default_max_tokens, make_client
from engine.runs.settings import RunConfig
from engine.traces import TraceError
from engine.traces.flows import Trace
from engine.traces.infer import INPUT, Pipeline, infer_pipeline, plain_input
from engine.traces.otlp import Span, iter_spans

TARGET = "target"
UNSCORED = "unscored"  # the split of traces with no target: kept, never graded
# traces replayed at a time: the step's records are spilled after each chunk (and written
# with the step, in its one transaction), so memory holds a chunk's calls and rows, never
# the whole import's
CHUNK = 2000


@dataclass
class ImportResult:
    run_id: str
    pipeline: Pipeline
    scored: int
    failing: int  # scored traces that fail, training and validation
    val: int = 0  # of the scored traces, held out as the validation split

    def as_json(self) -> dict[str, Any]:
        p = self.pipeline
        return {"run_id": self.run_id,
                "nodes": [{"id": n.id, "calls": n.calls, "prompt": n.prompt}
                          for n in p.nodes.values()],
                "edges": [list(e) for e in p.edges],
                "traces": len(p.traces), "scored": self.scored, "failing": self.failing,
                "val": self.val, "ambiguous": p.ambiguous,
                "edge_sources": edge_sources(p)}


def edge_sources(pipeline: Pipeline) -> dict[str, str]:
    """"FROM->TO" -> how the importer found that edge (structure, content, intervention):
    what `--json` prints and the run's config keeps for the Graph page."""
    return {f"{a}->{b}": how for (a, b), how in sorted(pipeline.found_by.items())
            if (a, b) in pipeline.edges}


def import_traces(path: str | Path, db: str | Path, *, node_key: str | None = None,
                  targets: str | Path | None = None, metric: str = "exact_match",
                  base_url: str | None = None, model: str | None = None,
                  run_id: str | None = None, concurrency: int | None = None,
                  timeout: float | None = None, optimizer_max_tokens: int | None = None,
                  val: int = 0, spans: Iterable[Span] | None = None,
                  rerun: dict[str, Any] | None = None,
                  extra_fields: dict[str, dict[str, str]] | None = None,
                  trace_order: dict[str, int] | None = None,
                  flows: Collection[tuple[str, str]] = (),
                  edges: Collection[tuple[str, str]] = ()) -> ImportResult:
    """Read the spans, infer the pipeline, and write it as a run. Every check comes before
    the first write: bad input raises TraceError (or RunLogError) and writes nothing.

    The run's forward calls ask for the token limit the pipeline's calls asked for (the
    largest recorded, else the run default); `concurrency`, `timeout` and
    `optimizer_max_tokens` are the run's settings for the later calls to the user's model
    (a local server with a few slots wants `concurrency` at its slot count).

    `val`: the last `val` scored traces (in the file's order) become the validation split:
    graded and replayed like the rest, never back-propagated. `backprop` then gates its
    proposals on them (re-running them through the user's model), and `blame --examples val`
    probes them with edits whose update call never saw them, which is the only way an
    edit probe counts on an import (every training trace feeds the proposal).

    `spans`: the spans to import, in place of reading `path` (spans `collect` received);
    `path` then only names the run's graph. Either is read once, as a stream: the file a
    line at a time (engine.traces.otlp.iter_spans), and the replay spills its records a
    chunk of traces at a time (CHUNK), all written with the step in one transaction.

    `rerun`: how the run re-runs its pipeline (RunConfig.rerun; a run recorded through the
    gateway), and `extra_fields`: example id -> fields added to that example (the
    pipeline's own input fields, which a re-run calls it with). `trace_order`: trace id ->
    its place, for traces whose start times do not give their order (examples that ran
    concurrently). `flows`: flows found by intervention, and `edges`: flows the user
    declared (--edge FROM:TO), both as engine.traces.infer takes them."""
    # The spans become hundreds of thousands of long-lived objects (calls, traces, their
    # templates) with no cycles among them, which the cyclic collector would scan again
    # and again (a third of a large import's time): it is off while they are built, and
    # they are frozen out of its sight while the replay, whose tasks do make cycles, runs.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _import(path, db, node_key=node_key, targets=targets, metric=metric,
                       base_url=base_url, model=model, run_id=run_id,
                       concurrency=concurrency, timeout=timeout,
                       optimizer_max_tokens=optimizer_max_tokens, val=val, spans=spans,
                       collecting=collecting, rerun=rerun, extra_fields=extra_fields,
                       trace_order=trace_order, flows=flows, edges=edges)
    finally:
        gc.unfreeze()
        if collecting:
            gc.enable()


def _import(path: str | Path, db: str | Path, *, node_key: str | None,
            targets: str | Path | None, metric: str, base_url: str | None,
            model: str | None, run_id: str | None, concurrency: int | None,
            timeout: float | None, optimizer_max_tokens: int | None, val: int,
            spans: Iterable[Span] | None, collecting: bool,
            rerun: dict[str, Any] | None = None,
            extra_fields: dict[str, dict[str, str]] | None = None,
            trace_order: dict[str, int] | None = None,
            flows: Collection[tuple[str, str]] = (),
            edges: Collection[tuple[str, str]] = ()) -> ImportResult:
    pipeline = infer_pipeline(iter_spans(path) if spans is None else spans, node_key, flows,
                              edges)
    if trace_order:
        pipeline.traces.sort(key=lambda t: trace_order.get(t.trace_id, len(trace_order)))
    check_distinct_examples(pipeline.traces)
    target_of = read_targets(targets, pipeline.traces) if targets else {}
    graph = pipeline_graph(pipeline, metric, Path(path).stem)
    examples = [example_of(t, target_of.get(t.example_id)) for t in pipeline.traces]
    for e in examples:
        e.fields.update((extra_fields or {}).get(e.id, {}))
    scored = [e for e in examples if e.target is not None]
    unscored = [replace(e, target="") for e in examples if e.target is None]
    if val < 0:
        raise TraceError(f"--val {val}: expected a count of traces, 0 or more")
    if val and not scored:
        raise TraceError(f"--val {val}: no trace is scored, so none can be held out for "
                         "validation (give --targets)")
    if val >= len(scored) > 0:
        raise TraceError(f"--val {val}: hold out fewer traces than the {len(scored)} scored "
                         "ones (at least one must stay for training)")
    train, held = (scored[:-val], scored[-val:]) if val else (scored, [])
    open_for_writing(db)
    config = RunConfig(graph=str(path), backend="openai", model=model or pipeline.model
                       or "recorded", db=str(db), steps=0, base_url=base_url, gate=True,
                       temperature=pipeline.temperature or 0.0,
                       max_tokens=pipeline.max_tokens, concurrency=concurrency,
                       optimizer_max_tokens=optimizer_max_tokens, rerun=dict(rerun or {}),
                       run_id=run_id or f"{graph.name}-{time.strftime('%Y%m%d-%H%M%S')}-"
                                        f"{secrets.token_hex(4)}")
    if timeout is not None:
        config.timeout = timeout
    config.edge_sources = edge_sources(pipeline)
    if run_exists(str(db), config.run_id) if log_exists(db) else False:
        raise RunLogError(f"{db}: a run '{config.run_id}' already exists")
    if graph.metric_fn is not None:
        from engine.runs.code import code_origins

        config.code = code_origins(graph)
    gc.freeze()
    if collecting:
        gc.enable()
    scores = asyncio.run(_write_run(config, graph, train, held, unscored,
                                    Replay(graph, pipeline.traces)))
    return ImportResult(config.run_id, pipeline, len(scored),
                        sum(1 for x in scores if x < 1.0), len(held))


def _replay_key(messages, tools) -> tuple:
    """A request as the replay looks it up: its messages (a chunk's, held only while the
    chunk is replayed) and its tools."""
    return (tuple(map(tuple, messages)),
            json.dumps(tools, sort_keys=True, ensure_ascii=False) if tools else None)


class Replay:
    """A backend named `openai` that answers each request with the reply its trace
    recorded, so that the run's cache keys are those a later call to the user's
    OpenAI-compatible server makes. `load(examples)` readies the replies of the examples
    about to be replayed (a chunk of them: the replies of the others are not held)."""

    name = "openai"
    supports_schema = False
    # a reply is at hand, never waited for: no timeout to set (LLMClient then awaits the
    # call itself instead of a task per call)
    times_own_calls = True

    def __init__(self, graph: GraphSpec, traces: list[Trace]) -> None:
        self._graph = graph
        self._traces = {t.example_id: t for t in traces}
        self._replies: dict[tuple, Any] = {}

    def load(self, examples: list[Example]) -> None:
        self._replies = {}
        for example in examples:
            trace = self._traces[example.id]
            recorded = example.fields[RECORDED_FIELD]
            for n in self._graph.nodes:
                values = {name: trace.values[name] if name in trace.values
                          else example.fields.get(name, "") for name in n.inputs}
                messages = recorded_messages(n.prompt, recorded, n.id, values)
                tools = recorded_tools(recorded, n.id)
                self._replies.setdefault(_replay_key(messages, tools), trace.calls[n.id])

    async def complete(self, request: LLMRequest) -> LLMReply:
        call = self._replies.get(_replay_key(request.messages, request.tools))
        if call is None:
            raise LLMError("import-traces: a replayed call differs from every recorded one")
        prompt_tokens, completion_tokens = call.tokens
        return LLMReply(call.output, prompt_tokens or estimate_tokens(request.user_text),
                        completion_tokens or estimate_tokens(call.output), call.model,
                        finish_reason="stop")

    async def aclose(self) -> None:
        return None


async def _write_run(config: RunConfig, graph: GraphSpec, scored: list[Example],
                     held: list[Example], unscored: list[Example], backend: Replay
                     ) -> list[float]:
    """Step 0 of the run: the training, validation (`held`) and unscored traces replayed,
    CHUNK traces at a time, each chunk's records spilled (RunLogWriter.spill) before the
    next is replayed and all written with the step; the scores of the scored ones."""
    cache = Cache("readwrite")
    client = make_client(config, cache, backend, backend)
    writer = RunLogWriter(config.db, config.run_id, cache)
    bus = EventBus([writer])
    client.on_call, client.on_event, client.run_id = bus.emit, bus.emit, config.run_id
    rows = ({"run_id": config.run_id, "split": split, "example_id": e.id, "position": i,
             "fields": json.dumps(e.fields, ensure_ascii=False), "target": e.target}
            for split, part in (("train", scored), ("val", held), (UNSCORED, unscored))
            for i, e in enumerate(part))
    writer.start_run(run_row(config.run_id, graph, config.to_json(), "openai",
                             client.forward_model, client.optimizer_model), rows)
    max_tokens, optimizer_max_tokens = default_max_tokens(config)
    ctx = RunContext(graph, client, bus.emit, config.run_id, 0, max_tokens,
                     optimizer_max_tokens, prompt_set(config.prompts))
    started, prompts = time.time(), Prompts.initial(graph)
    scores: dict[str, list[float]] = {"train": [], "val": []}
    try:
        for node in graph.nodes:
            bus.emit(PromptVersion(config.run_id, node.id, 0, prompts.text[node.id], 0, True))
        for n, (split, chunk) in enumerate(
                (split, part[at:at + CHUNK])
                for split, part in (("train", scored), ("val", held), (UNSCORED, unscored))
                for at in range(0, len(part), CHUNK)):
            if n:
                writer.spill()  # the chunks before: out of memory, written with the step
            backend.load(chunk)
            traces = await forward_pass(ctx, prompts, chunk, split)
            if split in scores:
                scores[split] += [x.score for x in await compute_losses(ctx, traces, split)]
            del traces
        backend.load([])
        train, val = scores["train"], scores["val"]
        bus.emit(StepFinished(config.run_id, 0, sum(train) / len(train) if train else None,
                              sum(val) / len(val) if held else None, False, started,
                              time.time(), metrics={"traces": float(
                                  len(scored) + len(held) + len(unscored))}))
    except BaseException as exc:
        writer.discard()  # the step's records spilled so far: a failed import has none
        writer.finish("failed", f"{exc.__class__.__name__}: {exc}")
        raise
    writer.finish("finished")
    return scores["train"] + scores["val"]


def check_distinct_examples(traces: list[Trace]) -> None:
    """One example per trace, under its whole id (this project's own export: per example id
    its forward calls name): two traces that would make one example are refused, never
    merged into one graded against one target."""
    seen: dict[str, Trace] = {}
    for t in traces:
        other = seen.setdefault(t.example_id, t)
        if other is not t:
            where = (f"trace {t.trace_id}" if other.trace_id == t.trace_id else
                     f"traces {other.trace_id} and {t.trace_id}")
            raise TraceError(f"{where}: two passes through the pipeline are both example "
                             f"'{t.example_id}', and one example is one pass")


def example_of(trace: Trace, target: str | None) -> Example:
    fields = {INPUT: trace.root_input,
              RECORDED_FIELD: json.dumps(trace.templates, ensure_ascii=False)}
    return Example(trace.example_id, fields, target)  # type: ignore[arg-type]


def text_lines(path: str | Path, flag: str) -> list[str]:
    """The lines of a file a flag names; TraceError (one line) when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise TraceError(f"{flag} {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{flag} {path}: cannot read ({exc.__class__.__name__})") from None


def json_lines(lines: list[str]) -> Iterator[tuple[int, Any]]:
    """(line number, its JSON value, None when it is not JSON) of each non-blank line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError:
            yield number, None


def read_targets(path: str | Path, traces: list[Trace]) -> dict[str, str]:
    """example id -> target, from `{"trace_id": ..., "target": ...}` or `{"input": ...,
    "target": ...}` lines. TraceError on a bad line or a file that matches no trace."""
    lines = text_lines(path, "--targets")
    by_trace = {}
    for t in traces:
        by_trace.setdefault(t.trace_id, []).append(t)
    by_input: dict[str, list[Trace]] = {}
    for t in traces:
        by_input.setdefault(t.root_input.strip(), []).append(t)
    found: dict[str, str] = {}
    for number, row in json_lines(lines):
        if not isinstance(row, dict) or not isinstance(row.get(TARGET), str) or not (
                isinstance(row.get("trace_id"), str) or isinstance(row.get("input"), str)):
            raise TraceError(f"{path}:{number}: expected a JSON object with 'target' and "
                             "'trace_id' (32 hex digits) or 'input' (the trace's root input)")
        matched = by_trace.get(row["trace_id"].lower(), []) if "trace_id" in row else \
            by_input.get(plain_input(row["input"]).strip(), [])
        for t in matched:
            found[t.example_id] = row[TARGET]
    if not found:
        raise TraceError(f"--targets {path}: no line matches a trace of the file (by "
                         "trace_id or input)")
    return found


def pipeline_graph(pipeline: Pipeline, metric: str, name: str) -> GraphSpec:
    """The graph of recorded nodes; `metric` is a grader name or FILE.py:NAME."""
    metric_fn = None
    if metric not in METRICS:
        metric_fn = _python_metric(metric)
    elif metric == "judge":
        raise TraceError("--metric judge is not available on imported traces: choose "
                         f"{', '.join(m for m in METRICS if m != 'judge')} or FILE.py:NAME")
    stem = _name(name)
    doc = {"name": stem if stem.startswith("traces") else f"traces-{stem}",
           "description": "imported from OpenTelemetry traces (python -m engine "
                          "import-traces)",
           "input_fields": [INPUT], "target_field": TARGET,
           "metric": "exact_match" if metric_fn else metric,
           "nodes": [{"id": n.id, "prompt": n.prompt, "inputs": n.inputs, "recorded": True,
                      **({"output": True} if n.id == pipeline.output else {})}
                     for n in pipeline.nodes.values()]}
    try:
        graph = parse_graph(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True),
                            "<traces>")
    except GraphError as exc:
        raise TraceError(f"the traces do not make a graph: {exc}") from None
    if metric_fn is None:
        return graph
    doc["metric"] = metric.rpartition(":")[2]
    return replace(graph, metric=doc["metric"], metric_fn=metric_fn,
                   yaml_text=yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


def _name(stem: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in stem)[:40] or "traces"


def _python_metric(spec: str):
    from engine.core.functions import load_functions

    where, sep, name = spec.rpartition(":")
    if not sep or not where.endswith(".py"):
        raise TraceError(f"--metric {spec!r}: choose one of {', '.join(METRICS)} or "
                         "FILE.py:NAME (a Python metric)")
    fn = load_functions(where).get(name)
    if not callable(fn):
        raise TraceError(f"--metric {spec!r}: {where} has no function '{name}'")
    return fn
