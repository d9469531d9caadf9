"""`trace` and `optimize`: a user's pipeline, run for real through the gateway.

`trace_pipeline` runs the pipeline once per example of a JSON lines file (each line the
input fields and `target`) through a gateway in this process, writes a root span per
example (its input fields, the pipeline's output) beside the calls the gateway recorded,
and imports those traces as a run (engine.traces.importer, step 0 their recorded calls)
whose config says how to re-run the pipeline. `open_rerun` gives such a run's forward
passes back to the pipeline; `optimize_pipeline` is the whole loop: trace, then steps of
back-propagation whose validation re-runs the pipeline with each candidate, then the
kept prompts.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.graph import parse_graph
from engine.data.examples import Example
from engine.gateway.flows import EXAMPLES as FLOW_EXAMPLES
from engine.gateway.flows import find_flows
from engine.gateway.rerun import PIPELINE_FIELDS, PipelineRerun, node_rules
from engine.gateway.runner import Outcome, PipelineSpec, Runner
from engine.gateway.server import SERVICE, Gateway, session_ids
from engine.runlog.schema import RunLogError
from engine.runlog.state import load_resume_state
from engine.runlog.writer import add_notes
from engine.traces import TraceError
from engine.traces.collect import collected
from engine.traces.importer import (
    TARGET,
    ImportResult,
    import_traces,
    json_lines,
    text_lines,
)

DEFAULT_CONCURRENCY = 4
DEFAULT_TIMEOUT = 120.0


@dataclass
class TraceResult:
    imported: ImportResult
    errors: list[tuple[int, str]] = field(default_factory=list)  # (line, why)

    def as_json(self) -> dict[str, Any]:
        return {**self.imported.as_json(), "rerun": "pipeline",
                "errors": [{"line": n, "error": e} for n, e in self.errors]}


def read_data(path: str | Path, targets: str | Path | None = None
              ) -> list[tuple[int, dict[str, Any], str | None]]:
    """(line number, input fields, target or None) of each line; TraceError on a bad one.
    `targets`: a file of the same lines with 'target', matched to these by their fields
    (its target wins)."""
    rows = []
    for number, row in json_lines(text_lines(path, "--data")):
        if not isinstance(row, dict) or not row:
            raise TraceError(f"{path}:{number}: expected a JSON object of input fields (and "
                             "'target')")
        target = row.pop(TARGET, None)
        if not row:
            raise TraceError(f"{path}:{number}: no input field besides '{TARGET}'")
        rows.append((number, row, None if target is None else str(target)))
    if not rows:
        raise TraceError(f"--data {path}: no examples")
    if targets is None:
        return rows
    given = {json.dumps(fields, sort_keys=True): target
             for _, fields, target in read_data(targets) if target is not None}
    matched = [(n, f, given.get(json.dumps(f, sort_keys=True), t)) for n, f, t in rows]
    if given and not any(json.dumps(f, sort_keys=True) in given for _, f, _ in rows):
        raise TraceError(f"--targets {targets}: no line's fields match a line of --data")
    return matched


def upstream_of(base_url: str | None, backend: str | None) -> tuple[str, Any, str | None]:
    """The upstream's base URL, what must be stopped when done (the embedded model's
    llama-server, for `--backend local`), and the model name to ask it for (None: the
    client's)."""
    if backend == "local":
        from engine.llm.factory import make_backend
        from engine.llm.server import LocalServerBackend

        served = make_backend("local", serving="server")
        if not isinstance(served, LocalServerBackend):
            raise TraceError("--backend local: the gateway needs llama.cpp's llama-server "
                             "(./dev setup builds it)")
        served.server.start()
        return served.server.base_url, served.server, served.model_name
    if not base_url:
        raise TraceError("give the upstream model: --base-url URL (an OpenAI-compatible "
                         "server) or --backend local")
    return base_url.rstrip("/"), None, None


def trace_pipeline(spec: PipelineSpec, data: str | Path, db: str | Path, *, upstream: str,
                   metric: str = "exact_match", val: int = 0, run_id: str | None = None,
                   concurrency: int = DEFAULT_CONCURRENCY, timeout: float = DEFAULT_TIMEOUT,
                   model: str | None = None, upstream_model: str | None = None,
                   local: bool = False, targets: str | Path | None = None,
                   log: Callable[[str], None] = lambda line: None) -> TraceResult:
    """Run the pipeline on each example of `data` through a gateway to `upstream` and
    import the traces as a run that re-runs the pipeline (`local`: the upstream is the
    embedded model, which later commands start again)."""
    rows = read_data(data, targets)
    tag = secrets.token_hex(4)
    passes: dict[int, list[Any]] = {}  # the first examples' calls, to ask for flows on
    flows: set[tuple[str, str]] = set()

    async def record() -> list[Outcome]:
        with Gateway(db, upstream, port=0, api_key=os.environ.get("OPENAI_API_KEY"),
                     upstream_model=upstream_model, log=log) as gateway:
            async with Runner(gateway, spec, concurrency=concurrency,
                              timeout=timeout) as runner:
                done = 0

                async def one(i: int, fields: dict[str, Any]) -> Outcome:
                    nonlocal done
                    session = f"trace-{tag}-{i}"
                    started = time.time_ns()
                    outcome = await runner.run(fields, session)
                    calls = gateway.done(session)
                    if not outcome.error and i < FLOW_EXAMPLES:
                        passes[i] = calls
                    trace_id, root = session_ids(session)
                    attributes = {"openinference.span.kind": "CHAIN",
                                  "input.value": json.dumps(fields, ensure_ascii=False),
                                  "input.mime_type": "application/json",
                                  "output.value": outcome.output or "",
                                  "semback.gateway.session": session}
                    if outcome.error:
                        attributes["semback.gateway.error"] = outcome.error
                    gateway.journal.record((
                        trace_id, root, "", "pipeline", started, time.time_ns(),
                        json.dumps(attributes, ensure_ascii=False), SERVICE))
                    done += 1
                    log(f"traced {done}/{len(rows)}"
                        + (f" (line {rows[i][0]}: {outcome.error})" if outcome.error else ""))
                    return outcome

                outcomes = list(await asyncio.gather(*(one(i, fields) for i, (_, fields, _)
                                                       in enumerate(rows))))
                if not gateway.counts.calls and any(not o.error for o in outcomes):
                    raise TraceError(f"{spec.label} made no model call through the gateway: "
                                     "its client must take its base URL from "
                                     "OPENAI_BASE_URL (or OPENAI_API_BASE), which the runner "
                                     "sets, not a URL of its own")
                if passes:  # which call reads which, asked of the pipeline itself
                    flows.update(await find_flows(gateway, runner, [
                        (rows[i][1], calls) for i, calls in sorted(passes.items())]))
                    log(f"asked the pipeline which call reads which on {len(passes)} "
                        f"example(s): {len(flows)} flow(s)")
                return outcomes

    outcomes = asyncio.run(record())
    errors = [(rows[i][0], o.error) for i, o in enumerate(outcomes) if o.error]
    ok = [i for i, o in enumerate(outcomes) if not o.error]
    if not ok:
        raise TraceError(f"the pipeline failed on every example (line {errors[0][0]}: "
                         f"{errors[0][1]})")
    trace_ids = {session_ids(f"trace-{tag}-{i}")[0]: i for i in ok}
    with tempfile.TemporaryDirectory() as folder:
        by_trace = None  # each traced example's target, by its trace id
        if any(rows[i][2] is not None for i in ok):
            by_trace = Path(folder) / "targets.jsonl"
            by_trace.write_text("".join(
                json.dumps({"trace_id": t, "target": rows[i][2]}) + "\n"
                for t, i in trace_ids.items() if rows[i][2] is not None), encoding="utf-8")
        imported = import_traces(
            Path(data).stem, db, targets=by_trace, metric=metric, base_url=upstream,
            model=model, run_id=run_id, val=val, concurrency=concurrency,
            spans=collected(db, trace_ids=list(trace_ids)), trace_order=trace_ids,
            flows=flows,
            rerun={**spec.as_json(), "concurrency": concurrency, "timeout": timeout,
                   **({"backend": "local"} if local else {})},
            extra_fields={t: {PIPELINE_FIELDS: json.dumps(rows[i][1], ensure_ascii=False)}
                          for t, i in trace_ids.items()})
    return TraceResult(imported, errors)


@asynccontextmanager
async def open_rerun(db: str | Path, run_id: str, *, base_url: str | None = None,
                     upstream_model: str | None = None,
                     log: Callable[[str], None] = lambda line: None
                     ) -> AsyncIterator[PipelineRerun | None]:
    """The re-run of a run recorded through the gateway (None for any other run): a
    gateway on a free port and the runner, closed on exit."""
    point = load_resume_state(str(db), run_id)
    rerun = point.config.get("rerun") or {}
    if not rerun:
        yield None
        return
    server = None
    if base_url:
        upstream = base_url.rstrip("/")
    elif rerun.get("backend") == "local":  # the embedded model, served again
        upstream, server, upstream_model = upstream_of(None, "local")
    else:
        upstream = (point.config.get("base_url") or "").rstrip("/")
    if not upstream:
        raise RunLogError(f"run '{run_id}' re-runs its pipeline but names no upstream model "
                          "(give --base-url)")
    graph = parse_graph(point.graph_yaml, "<run>")
    examples = [Example(str(e["example_id"]), json.loads(e["fields"] or "{}"),
                        e.get("target") or "") for e in point.examples]
    spec = PipelineSpec.from_json(rerun)
    gateway = Gateway(db, upstream, port=0, api_key=os.environ.get("OPENAI_API_KEY"),
                      upstream_model=upstream_model, log=log)
    gateway.start()
    try:
        async with Runner(gateway, spec, concurrency=int(rerun.get("concurrency") or
                                                         DEFAULT_CONCURRENCY),
                          timeout=float(rerun.get("timeout") or DEFAULT_TIMEOUT)) as runner:
            opened = PipelineRerun(gateway, runner, graph, node_rules(graph, examples))
            try:
                yield opened
            finally:
                if opened.notes:  # calls that matched no node: the run's reader is told
                    add_notes(str(db), run_id, opened.notes)
    finally:
        gateway.close()
        if server is not None:
            server.stop()


async def with_rerun(db: str | Path, run_id: str, work: Callable[[Any], Any]) -> Any:
    """`await work(rerun)` with the run's pipeline re-run open (None: a run that replays)."""
    async with open_rerun(db, run_id) as rerun:
        return await work(rerun)


async def backprop_rerun(db: str | Path, run_id: str, **settings: Any) -> Any:
    """`backprop` on any run: on one recorded through the gateway, its forward passes
    (the validation gate's included) re-run the pipeline."""
    from engine.traces.backprop import backprop

    async with open_rerun(db, run_id, base_url=settings.get("base_url")) as rerun:
        return await backprop(str(db), run_id, rerun=rerun, **settings)


def optimize_pipeline(spec: PipelineSpec, data: str | Path, db: str | Path, *,
                      upstream: str, metric: str = "exact_match", val: int = 0,
                      steps: int = 1, method: str | None = None, run_id: str | None = None,
                      concurrency: int = DEFAULT_CONCURRENCY,
                      timeout: float = DEFAULT_TIMEOUT, model: str | None = None,
                      upstream_model: str | None = None, local: bool = False,
                      targets: str | Path | None = None,
                      optimizer_backend: str | None = None,
                      optimizer_model: str | None = None,
                      log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Trace, then `steps` steps of back-propagation validated by re-running the pipeline,
    then the kept prompts: the summary `optimize --json` prints. `optimizer_backend` and
    `optimizer_model`: where the backward and update calls go (default: the upstream)."""
    from engine.runlog.traces import failing_count
    from engine.runs.handback import kept_prompts
    from engine.traces.backprop import backprop

    traced = trace_pipeline(spec, data, db, upstream=upstream, metric=metric, val=val,
                            run_id=run_id, concurrency=concurrency, timeout=timeout,
                            model=model, upstream_model=upstream_model, local=local,
                            targets=targets, log=log)
    run = traced.imported.run_id
    log(f"traced {len(traced.imported.pipeline.traces)} examples into run '{run}': "
        f"{len(traced.imported.pipeline.nodes)} nodes; {traced.imported.failing} failing")

    async def loop() -> tuple[list[dict[str, Any]], list[str]]:
        done: list[dict[str, Any]] = []
        async with open_rerun(db, run, base_url=upstream,
                              upstream_model=upstream_model) as rerun:
            for _ in range(steps):
                step = load_resume_state(str(db), run).state.step
                if failing_count(str(db), run, step) == 0:
                    log(f"step {step}: no failing training example, done")
                    break
                result = await backprop(str(db), run, method=method, rerun=rerun,
                                        optimizer_backend_kind=optimizer_backend,
                                        optimizer_model=optimizer_model)
                kept = [p.node_id for p in _proposals(result) if p.accepted]
                done.append({"step": result.state.step if result.state else None,
                             "status": result.status, "kept": kept})
                log(f"step {done[-1]['step']}: {result.status}, kept "
                    f"{', '.join(kept) or 'no edit'}")
                if result.status != "finished":
                    break
            return done, list(rerun.notes) if rerun else []

    done, notes = asyncio.run(loop())
    hand = kept_prompts(db, run)
    scores = _val_scores(db, run)
    return {"run_id": run, "rerun": "pipeline",
            "nodes": [n.id for n in traced.imported.pipeline.nodes.values()],
            "edges": [list(e) for e in traced.imported.pipeline.edges],
            "validation": {"before": scores[0] if scores else None,
                           "after": scores[-1] if scores else None,
                           "n": traced.imported.val},
            "steps": done, "errors": traced.as_json()["errors"], "notes": notes,
            "prompts": {k.node_id: k.prompt for k in hand.nodes},
            "changed": [k.node_id for k in hand.nodes if k.prompt != k.original]}


def _proposals(result: Any) -> list[Any]:
    from engine.events import Proposal

    return result.events.of(Proposal)


def _val_scores(db: str | Path, run_id: str) -> list[float | None]:
    from engine.runlog.reader import step_table

    table = step_table(db, run_id)
    return [None if v != v else float(v) for v in table["val_score"]] \
        if "val_score" in table else []
