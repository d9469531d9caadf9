"""Putting a run together: configuration, data, backends, run log, and resume.

`execute(config)` starts a run; `resume(db, run_id)` continues one from its last complete
step. Both write through `RunLogWriter` and return a `RunResult`.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import secrets
import signal
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from engine.core.forward import RunContext
from engine.core.graph import GraphSpec, load_graph
from engine.core.optimizer import OptimizerConfig, OptimizerState, evaluate, run_steps
from engine.data.datasets import check_input_fields, load_examples, with_target
from engine.data.examples import Example, Splits, split_examples
from engine.events import CallRecord, Collector, EventBus, StepFinished
from engine.llm.base import DEFAULT_TIMEOUT, Backend
from engine.llm.budget import Budget, BudgetExhausted
from engine.llm.client import CallStats, LLMClient, ModelUnavailable, RetryPolicy
from engine.llm.factory import call_timeout
from engine.llm.limits import AdaptiveLimit
from engine.methods import METHODS, Method, make_method
from engine.prompts import structured as S
from engine.prompts.sets import prompt_set
from engine.runlog.schema import RunLogError
from engine.runlog.state import load_cache, load_resume_state, run_exists
from engine.runlog.writer import RunLogWriter, open_for_writing, run_row
from engine.runs.progress import ProgressTracker
from engine.runs.settings import RunConfig

DEFAULT_SPLITS = {"train": 20, "val": 20, "test": 0}
# The concurrency limit of every run started in this context (experiment --parallel: one
# limit for all its runs); None: each run has its own.
SHARED_LIMIT: ContextVar[AdaptiveLimit | None] = ContextVar("shared_limit", default=None)
# The budget of every run started in this context (experiment --max-calls/--max-cost: one
# budget for the whole plan); None: each run has its own, from its RunConfig.
SHARED_BUDGET: ContextVar[Budget | None] = ContextVar("shared_budget", default=None)


class StepCallGuard:
    """A listener placed before the writer: a step in which every model call failed (none
    answered, cached replies aside) is not a step. Raising here keeps its StepFinished from
    reaching the run log, so the run ends `failed` with the reason and resumes at that step.
    """

    def __init__(self) -> None:
        self.tried: dict[int, int] = {}
        self.answered: dict[int, int] = {}
        self.last_error: dict[int, str] = {}

    def __call__(self, event: Any) -> None:
        if isinstance(event, CallRecord) and not event.cache_hit:
            self.tried[event.step] = self.tried.get(event.step, 0) + 1
            if event.error:
                self.last_error[event.step] = event.error
            else:
                self.answered[event.step] = self.answered.get(event.step, 0) + 1
        elif isinstance(event, StepFinished) and self.tried.get(event.step) \
                and not self.answered.get(event.step):
            raise ModelUnavailable(
                f"step {event.step}: all {self.tried[event.step]} model calls failed (last: "
                f"{self.last_error.get(event.step)}); the step was not logged: resume the run "
                f"once the model answers")


def method_from_config(config: RunConfig) -> Method:
    """The run's method; an option it does not take is a ValueError of one line."""
    try:
        return make_method(config.method, **config.method_options)
    except TypeError:
        cls = METHODS.get(config.method)
        takes = [p for p in inspect.signature(cls).parameters] if cls else []
        known = f"its options: {', '.join(takes)}" if takes else "it takes no options"
        given = ", ".join(sorted(config.method_options))
        raise ValueError(f"--option {given}: not an option of method '{config.method}' "
                         f"({known})") from None


@dataclass
class RunResult:
    run_id: str
    status: str
    state: OptimizerState | None
    test_score: float | None
    stats: CallStats
    events: Collector
    reason: str | None = None  # why a run that did not finish stopped (its budget, say)


def new_run_id(graph_name: str, method: str) -> str:
    """A readable, unique run id: graph, method, start time and a short random suffix."""
    return f"{graph_name}-{method}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def sizes(config: RunConfig, graph: GraphSpec) -> tuple[int, int, int]:
    def pick(key: str) -> int:
        value = getattr(config, key)
        return int(value if value is not None else graph.splits.get(key, DEFAULT_SPLITS[key]))
    return pick("train"), pick("val"), pick("test")


def load_splits(config: RunConfig, graph: GraphSpec) -> Splits:
    dataset = config.dataset or graph.dataset
    if not dataset:
        raise ValueError(f"{graph.path}: no dataset: set 'dataset' in the graph or pass --dataset")
    examples = with_target(load_examples(dataset, data_dir=config.data_dir,
                                         graph_dir=str(Path(graph.path).parent)),
                           graph.target_field)
    check_input_fields(examples, graph.input_fields, dataset)
    n_train, n_val, n_test = sizes(config, graph)
    return split_examples(examples, config.seed, n_train, n_val, n_test)


def make_client(config: RunConfig, cache, forward_backend: Backend | None,
                optimizer_backend: Backend | None) -> LLMClient:
    from engine.console import console
    from engine.llm.factory import default_model, make_backend
    from engine.llm.models import paired_optimizer

    # --concurrency 1 keeps the embedded model to one llama context (with every core)
    local = {"model": config.model, "chat_format": config.chat_format,
             "contexts": config.concurrency, "serving": config.local_serving}
    options = local if config.backend == "local" else {}
    if forward_backend is None and config.backend == "scripted" and config.scripted_responder:
        from engine.runs.code import load_responder

        options = {"scripted_options": {"responder": load_responder(config.scripted_responder)}}
    forward = forward_backend or make_backend(
        config.backend, base_url=config.base_url, timeout=config.timeout, **options)
    opt_kind = config.optimizer_backend or config.backend
    opt_model = config.optimizer_model
    if opt_model is None and optimizer_backend is None and opt_kind == "local" == forward.name:
        opt_model, note = paired_optimizer(getattr(forward, "model_name", None))
        if note:
            console.print(note, markup=False, highlight=False)
    if optimizer_backend is None and opt_kind == "local" and opt_model \
            and not _same_local_model(forward, opt_model):
        # another embedded model for the optimizer's calls: a backend of its own (one
        # llama model is one file; a remote backend names its model in each request)
        optimizer_backend = make_backend("local", timeout=config.timeout, for_optimizer=True,
                                         **{**local, "model": opt_model})
    optimizer = optimizer_backend or (
        forward if opt_kind == config.backend else
        make_backend(opt_kind, base_url=config.base_url, timeout=config.timeout))
    if config.structured == "on" and not getattr(optimizer, "supports_schema", False):
        raise ValueError(f"--structured on: the {optimizer.name} backend cannot enforce a JSON "
                         "schema; use --structured auto or off")
    # a local GGUF file is logged by its file name, not the path it was given by
    model = (getattr(forward, "model_name", None) if forward.name == "local" else None) \
        or config.model or default_model(config.backend)
    optimizer_model = (getattr(optimizer, "model_name", None)
                       if optimizer is not forward and optimizer.name == "local" else None) \
        or opt_model or (model if opt_kind == config.backend
                                      else default_model(opt_kind))
    return LLMClient(
        forward_backend=forward, forward_model=model, optimizer_backend=optimizer,
        optimizer_model=optimizer_model, cache=cache, concurrency=config.concurrency,
        backend_limits=dict(config.backend_limits), shared_limit=SHARED_LIMIT.get(),
        # a provider's calls, timed here; the embedded model's backends time their own
        # (engine/llm/base.py)
        retry=RetryPolicy(max_retries=config.max_retries, timeout=DEFAULT_TIMEOUT
                          if config.timeout is None else config.timeout),
        temperature=config.temperature, seed=config.seed, structured=config.structured,
        structure=S.prepare,
        budget=SHARED_BUDGET.get() or Budget(config.max_calls, config.max_cost))


def _same_local_model(forward: Backend, spec: str) -> bool:
    """Whether the embedded model `spec` (a name or a GGUF path) is the file `forward` runs."""
    if forward.name != "local":
        return False
    from engine.llm.models import resolve_model

    return resolve_model(spec).sha256 == getattr(forward, "model_sha256", None)


def model_sha256(backend: Backend | None) -> str | None:
    """The SHA-256 of the model file a backend runs (local models), else None."""
    return getattr(backend, "model_sha256", None)


def default_max_tokens(config: RunConfig) -> tuple[int, int]:
    small = config.backend == "local"
    return (config.max_tokens or (128 if small else 512),
            config.optimizer_max_tokens or (128 if small else 1024))


def _example_rows(run_id: str, splits: Splits) -> list[dict]:
    return [{"run_id": run_id, "split": name, "example_id": ex.id, "position": i,
             "fields": json.dumps(ex.fields, ensure_ascii=False), "target": ex.target}
            for name, items in splits.by_name().items() for i, ex in enumerate(items)]


async def execute(config: RunConfig, *, forward_backend: Backend | None = None,
                  optimizer_backend: Backend | None = None,
                  listeners: tuple[Callable[[Any], None], ...] = (),
                  splits: Splits | None = None, graph: GraphSpec | None = None) -> RunResult:
    """Validate, load, and run an optimization, logging every event to `config.db`.

    `splits` replaces the seeded cut of the graph's dataset, for benchmarks with a test
    split of their own (GSM8K, LIAR); it must be disjoint, which is checked. `graph`, a
    graph already built (engine.api.builder), replaces loading `config.graph`."""
    graph = graph or load_graph(config.graph)
    method_from_config(config)  # fail fast on a bad method or option
    prompt_set(config.prompts)  # and on an unknown prompt set
    if splits is None:
        splits = load_splits(config, graph)
    else:
        ids = [e.id for part in (splits.train, splits.val, splits.test) for e in part]
        if len(ids) != len(set(ids)):
            raise ValueError("the given splits share examples; train, val and test must be "
                             "disjoint")
    if config.gate and config.steps > 0 and not splits.val:
        raise ValueError("the validation gate needs validation examples: set --val above 0 "
                         "or pass --no-gate")
    if config.scripted_responder:
        from engine.runs.code import load_responder, resolved_responder

        if config.backend != "scripted":
            raise ValueError("--scripted-responder: only the scripted backend takes a "
                             f"responder, not --backend {config.backend}")
        config.scripted_responder = resolved_responder(config.scripted_responder)
        load_responder(config.scripted_responder)  # fail fast, before the run log
    open_for_writing(config.db)
    if config.run_id and run_exists(config.db, config.run_id):
        raise RunLogError(f"{config.db}: a run '{config.run_id}' already exists; choose "
                          "another --run-id, or continue it with: python -m engine resume")
    config.run_id = config.run_id or new_run_id(graph.name, config.method)
    if not config.code:
        from engine.runs.code import code_origins

        config.code = code_origins(graph)
    return await drive_run(config, graph, splits, None, forward_backend, optimizer_backend,
                        listeners, new=True)


async def resume(db: str, run_id: str, *, forward_backend: Backend | None = None,
                 optimizer_backend: Backend | None = None,
                 listeners: tuple[Callable[[Any], None], ...] = (),
                 functions: Mapping[str, Callable[..., Any]] | None = None,
                 max_calls: int | None = None, max_cost: float | None = None) -> RunResult:
    """Continue `run_id` from its last complete step with its accepted prompts;
    `functions` binds the logged graph's Python function names again (engine.api.builder).
    `max_calls` / `max_cost` replace the run's budget for this invocation (unset: the
    budget the run was started with, counted afresh)."""
    point = load_resume_state(db, run_id)
    if point.status == "finished":
        raise RunLogError(f"run '{run_id}' has already finished; nothing to resume")
    config = RunConfig.from_json(point.config)
    config.db, config.run_id = db, run_id
    if max_calls is not None:
        config.max_calls = max_calls
    if max_cost is not None:
        config.max_cost = max_cost
    open_for_writing(db)  # before any model call
    from engine.runs.code import bind_logged_graph

    graph = bind_logged_graph(point.graph_yaml, config.graph, config.code, functions)
    splits = Splits(*(examples_of(point.examples, s) for s in ("train", "val", "test")))
    return await drive_run(config, graph, splits, point.state, forward_backend, optimizer_backend,
                        listeners, new=False, test_done=point.test_done)


def examples_of(rows: list[dict], split: str) -> list[Example]:
    return [Example(r["example_id"], json.loads(r["fields"]), r["target"])
            for r in sorted(rows, key=lambda r: r["position"]) if r["split"] == split]


async def drive_run(config: RunConfig, graph: GraphSpec, splits: Splits,
                 state: OptimizerState | None, forward_backend, optimizer_backend, listeners,
                 *, new: bool, test_done: bool = False, run_extra: dict | None = None,
                 prologue: Callable[[RunContext], Any] | None = None,
                 baseline_step: int | None = 0, rerun: Any = None) -> RunResult:
    """Run `config.steps` from `state` (None: from step 0). `prologue` runs first (a fork
    logs the state it starts from); `baseline_step` is the step whose forward pass scores
    validation too (step 0; a fork's first step when it re-measures; None: none), for the
    progress counts."""
    method = method_from_config(config)
    cache = load_cache(config.db, config.cache)
    client = make_client(config, cache, forward_backend, optimizer_backend)
    if new and config.backend == "local" and config.model is None:
        config.model = client.forward_model  # resumes and forks load the same model
    writer = RunLogWriter(config.db, config.run_id, cache)
    collector = Collector()
    bus = EventBus([StepCallGuard(), writer, collector, *listeners])
    client.on_call, client.on_event, client.run_id = bus.emit, bus.emit, config.run_id
    bus.add(ProgressTracker(  # Progress events: phase and calls, for the CLI and dashboard
        graph, {name: len(part) for name, part in splits.by_name().items()},
        failures=config.failures_per_step, method=type(method), run_id=config.run_id,
        trainable=graph.trainable_nodes, update_mode=config.update_mode,
        update_when=config.update_when,
        node_gates=config.node_gates, emit=bus.emit, baseline_step=baseline_step,
        proposals=config.proposals, contrast=config.contrast))
    if new:
        writer.start_run({**run_row(config.run_id, graph, config.to_json(),
                                    client.forward_backend.name, client.forward_model,
                                    client.optimizer_model,
                                    model_sha256=model_sha256(client.forward_backend),
                                    optimizer_model_sha256=model_sha256(
                                        client.optimizer_backend)),
                          **(run_extra or {})},
                         _example_rows(config.run_id, splits))
    else:
        writer.set_status("running")
    max_tokens, optimizer_max_tokens = default_max_tokens(config)
    ctx = RunContext(graph, client, bus.emit, config.run_id, 0, max_tokens, optimizer_max_tokens,
                     prompt_set(config.prompts), rerun=rerun)
    opt = OptimizerConfig(config.steps, config.failures_per_step, config.gate,
                          config.update_mode, config.seed, config.node_gates,
                          allow_copies=config.allow_copies, update_when=config.update_when,
                          proposals=config.proposals,
                          contrast=make_method(config.contrast) if config.contrast else None)
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    try:
        loop.add_signal_handler(signal.SIGTERM, current.cancel)
    except (NotImplementedError, RuntimeError, ValueError):
        pass
    # Everything loaded so far (SDKs, pandas, the dataset) lives for the whole run: move it
    # out of the collector's sight, so that full collections do not stall the event loop
    # for ~0.1 s while hundreds of calls are in flight.
    gc.collect()
    gc.freeze()
    test_score, reason = None, None
    try:
        if prologue is not None:  # a fork logs the state it starts from
            await prologue(ctx)
        state = await run_steps(ctx, method, splits, opt, state)
        if splits.test and not test_done:
            test_ctx = replace(ctx, step=state.step)
            test_score, _, _ = await evaluate(test_ctx, state.prompts, splits.test, "test")
            writer.flush(metrics={"test_score": test_score} if test_score is not None else {})
        writer.finish("finished")
        status = "finished"
    except asyncio.CancelledError:
        writer.finish("stopped", "stopped by the user")
        status = "stopped"
    except BudgetExhausted as exc:
        # the calls already on their way are paid for: let their replies reach the cache
        await client.settle(call_timeout(config.backend, config.timeout))
        writer.save_cache()
        status, reason = "budget", str(exc)
        writer.finish(status, reason)
    except BaseException as exc:
        try:
            writer.finish("failed" if isinstance(exc, Exception) else "stopped",
                          f"{exc.__class__.__name__}: {exc}")
        except Exception as late:  # noqa: BLE001 - the original error is the one to report
            exc.add_note(f"(the run log could not record the failure either: {late})")
        raise
    finally:
        gc.unfreeze()
        try:
            loop.remove_signal_handler(signal.SIGTERM)
        except (NotImplementedError, RuntimeError, ValueError):
            pass
        await client.aclose()
    return RunResult(config.run_id, status, state, test_score, client.stats, collector, reason)


def step_rows(result: RunResult) -> list[StepFinished]:
    return result.events.of(StepFinished)
