"""Forks: a new run that starts from another run's state after step S, optionally with
hand-edited prompts (a person in the loop).

The fork gets its own run id, records its lineage in `runs.parent_run_id` and
`runs.fork_step`, keeps the parent's examples (unless split options change them), and
logs the state it starts from as its step S: the parent's prompt history up to S, the
hand-edited prompts as new accepted versions, and step S's scores (re-measured when a
prompt was edited or the splits changed, so that the gate compares against the prompts
and examples actually in use). Its
own optimization steps are S+1, S+2, ...
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from engine.core.forward import RunContext
from engine.core.graph import GraphSpec
from engine.core.optimizer import OptimizerState, evaluate
from engine.data.examples import Splits
from engine.events import PromptVersion, StepFinished
from engine.llm.base import Backend
from engine.runlog.reader import prompt_versions_up_to
from engine.runlog.schema import RunLogError
from engine.runlog.state import load_resume_state, run_exists
from engine.runlog.writer import open_for_writing
from engine.runs.code import bind_logged_graph

SPLIT_OPTIONS = ("train", "val", "test", "seed", "dataset", "data_dir")


@dataclass
class ForkPlan:
    config: Any  # engine.runs.execute.RunConfig
    graph: GraphSpec
    splits: Splits
    state: OptimizerState
    parent_id: str
    from_step: int
    history: list[dict]  # the parent's prompt_versions rows up to the fork step
    edited: dict[str, str]
    # New splits or edited prompts: step S's scores are measured again, so the gate compares
    # against the prompts in use on the examples in use, not the parent's other examples.
    rescore: bool = False
    resplit: bool = False  # the fork's examples are not its parent's


def plan_fork(db: str, parent_id: str, from_step: int, set_prompts: dict[str, str] | None = None,
              overrides: dict[str, Any] | None = None) -> ForkPlan:
    """Check the request against the log and prepare the fork (raises RunLogError or
    ValueError with one line)."""
    from engine.runs.execute import RunConfig, examples_of, load_splits, new_run_id

    point = load_resume_state(db, parent_id, at_step=from_step)
    if point.state is None or point.state.step != from_step:
        raise RunLogError(f"run '{parent_id}' has no complete step {from_step} to fork from")
    overrides = dict(overrides or {})
    config = RunConfig.from_json(point.config)
    parent_steps = config.steps
    for key, value in overrides.items():
        setattr(config, key, value)
    # --steps N: the fork runs N steps of its own (S+1..S+N); by default the parent's
    # remaining steps, at least one. The stored config counts steps from 0, as a run's does.
    config.steps = from_step + overrides["steps"] if "steps" in overrides \
        else max(parent_steps, from_step + 1)
    config.db, config.run_id = db, overrides.get("run_id")
    graph = bind_logged_graph(point.graph_yaml, config.graph, config.code)
    resplit = any(key in overrides for key in SPLIT_OPTIONS)
    if resplit:
        splits = load_splits(config, graph)
    else:
        splits = Splits(*(examples_of(point.examples, s) for s in ("train", "val", "test")))
    state = point.state
    edited = dict(set_prompts or {})
    for node_id, text in edited.items():
        if node_id not in graph.node_ids:
            raise ValueError(f"--set-prompt: graph '{graph.name}' has no node '{node_id}'")
        if graph.node(node_id).kind != "llm":
            raise ValueError(f"--set-prompt: node '{node_id}' is a function node: it has no "
                             "prompt")
        if not text.strip():
            raise ValueError(f"--set-prompt: the prompt for '{node_id}' is empty")
    changes = {n: (state.next_version[n], t) for n, t in edited.items()}
    state = replace(state, prompts=state.prompts.updated(changes),
                    next_version={n: v + (n in changes) for n, v in state.next_version.items()},
                    rejected={n: [] if n in changes else list(r)
                              for n, r in state.rejected.items()})
    open_for_writing(db)
    if config.run_id and run_exists(db, config.run_id):
        raise RunLogError(f"{db}: a run '{config.run_id}' already exists; choose another "
                          "--run-id")
    config.run_id = config.run_id or new_run_id(graph.name, config.method)
    history = prompt_versions_up_to(db, parent_id, from_step)
    return ForkPlan(config, graph, splits, state, parent_id, from_step, history, edited,
                    rescore=resplit or bool(edited), resplit=resplit)


async def run_fork(plan: ForkPlan, *, forward_backend: Backend | None = None,
                   optimizer_backend: Backend | None = None,
                   listeners: tuple[Callable[[Any], None], ...] = ()) -> Any:
    """Run a planned fork to `plan.config.steps`; returns engine.runs.execute.RunResult."""
    from engine.runs.execute import drive_run

    async def log_start(ctx: RunContext) -> None:
        ctx = replace(ctx, step=plan.from_step)
        for row in plan.history:
            ctx.emit(PromptVersion(ctx.run_id, row["node_id"], row["version"], row["prompt"],
                                   row["step"], row["accepted"]))
        for node_id in plan.edited:
            ctx.emit(PromptVersion(ctx.run_id, node_id, plan.state.prompts.version[node_id],
                                   plan.state.prompts.text[node_id], plan.from_step, True))
        started = time.time()
        if plan.rescore:  # the scores the fork's gate compares against
            train, _, _ = await evaluate(ctx, plan.state.prompts, plan.splits.train, "train")
            val, _, _ = await evaluate(ctx, plan.state.prompts, plan.splits.val, "val")
            plan.state.train_score, plan.state.val_score = train, val
        ctx.emit(StepFinished(ctx.run_id, plan.from_step, plan.state.train_score,
                              plan.state.val_score, bool(plan.edited), started, time.time(),
                              metrics={"forked_prompts_edited": float(len(plan.edited))}))

    return await drive_run(plan.config, plan.graph, plan.splits, plan.state, forward_backend,
                        optimizer_backend, listeners, new=True, prologue=log_start,
                        run_extra={"parent_run_id": plan.parent_id,
                                   "fork_step": plan.from_step},
                        baseline_step=plan.from_step if plan.rescore else None)


async def fork(db: str, parent_id: str, from_step: int, *,
               set_prompts: dict[str, str] | None = None,
               overrides: dict[str, Any] | None = None, **backends: Any) -> Any:
    """Plan and run a fork in one call (the Python API)."""
    return await run_fork(plan_fork(db, parent_id, from_step, set_prompts, overrides),
                          **backends)
