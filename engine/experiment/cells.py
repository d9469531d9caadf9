"""Cells: one run each. A plan expands to one cell per (entry, task, variant, seed); each
cell gets its RunConfig and splits, is found again in the run log if it already finished
(by run id prefix and configuration), and is otherwise run with `engine.runs.execute.execute`.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from engine.core.graph import GraphError, load_graph
from engine.data.datasets import DatasetError, bbh_tasks, load_examples, with_target
from engine.data.examples import SplitError, Splits, split_examples
from engine.events import CallRecord, StepFinished
from engine.experiment.plan import Entry, Plan, PlanError, Variant
from engine.llm.base import LLMError
from engine.llm.budget import Budget
from engine.llm.limits import AdaptiveLimit
from engine.runlog.schema import RunLogError
from engine.runs.execute import (
    SHARED_BUDGET,
    SHARED_LIMIT,
    RunConfig,
    RunResult,
    execute,
    load_splits,
    sizes,
)

# Fields of a stored run's config that must equal the plan's for the run to count as done.
SAME_CONFIG = ("method", "backend", "steps", "proposals", "train", "val", "test", "seed",
               "dataset", "failures_per_step", "gate", "update_mode", "temperature",
               "method_options")
# what a run logged before a setting existed ran with
OLDER_RUNS = {"proposals": 1}

# Problems with the input, not with one run: they stop the experiment (status 2).
BAD_INPUT = (PlanError, DatasetError, GraphError, SplitError, LLMError, RunLogError, ValueError,
             FileNotFoundError)


# --- cells: one run each ------------------------------------------------------------


@dataclass
class Cell:
    """One run of the plan: an entry, a BBH task (or none), a variant and a seed."""

    plan: str
    entry: Entry
    task: str | None
    variant: Variant
    seed: int
    config: RunConfig | None = None
    splits: Splits | None = None
    run_id: str | None = None  # the finished run that holds this cell's result

    @property
    def prefix(self) -> str:
        parts = [self.plan, self.entry.name, *([self.task] if self.task else []),
                 self.variant.name, f"s{self.seed}"]
        return "exp." + ".".join(parts) + "."

    @property
    def label(self) -> str:
        where = f"{self.entry.name}/{self.task}" if self.task else self.entry.name
        return f"{where} {self.variant.name} seed {self.seed}"


def expand(plan: Plan, data_dir: str | None, limit_tasks: int | None = None) -> list[Cell]:
    cells = []
    for entry in plan.entries:
        tasks: list[str | None] = [None]
        if entry.tasks:
            tasks = list(bbh_tasks(data_dir)) if entry.tasks == ("all",) else list(entry.tasks)
            if not tasks:
                raise PlanError(f"{plan.path}: entry '{entry.name}': tasks: all, but no BBH "
                                f"task files in {data_dir or '$SEMBACK_DATA_DIR'}/bbh "
                                f"(pass --data-dir)")
            tasks = tasks[:limit_tasks] if limit_tasks else tasks
        cells += [Cell(plan.name, entry, task, variant, seed) for task in tasks
                  for variant in entry.variants for seed in entry.seeds]
    return cells


def prepare(cells: list[Cell], base: RunConfig) -> None:
    """Fill in each cell's RunConfig and splits (loading its data validates it)."""
    loaded: dict[tuple, Any] = {}
    for cell in cells:
        entry = cell.entry
        dataset = f"bbh/{cell.task}" if cell.task else entry.dataset
        config = replace(base, graph=entry.graph, method=cell.variant.method, steps=entry.steps,
                         proposals=entry.proposals,
                         train=entry.train, val=entry.val, test=0, seed=cell.seed,
                         dataset=dataset, failures_per_step=entry.failures,
                         gate=cell.variant.gate, update_mode=cell.variant.update_mode,
                         method_options=dict(cell.variant.options), run_id=None)
        key = (entry.graph, dataset, entry.test_dataset, cell.seed, entry.train, entry.val,
               entry.test)
        try:
            if key not in loaded:
                loaded[key] = _load_cell_splits(config, entry)
        except (DatasetError, GraphError, SplitError, ValueError) as exc:
            task = f" task '{cell.task}'" if cell.task else ""
            raise PlanError(f"entry '{entry.name}'{task}: {exc}") from None
        cell.splits = loaded[key]
        if cell.variant.gate and entry.steps > 0 and not cell.splits.val:
            raise PlanError(f"entry '{entry.name}': the validation gate needs validation "
                            f"examples: set 'val' above 0 or 'gate: false'")
        cell.config = replace(config, test=len(cell.splits.test))


def _load_cell_splits(config: RunConfig, entry: Entry) -> Splits:
    """The splits `execute` will cut (test: every example left, unless the plan says how
    many), or train and validation with the whole of `test_dataset` as the test."""
    graph = load_graph(config.graph)
    n_train, n_val, _ = sizes(config, graph)
    graph_dir = str(Path(graph.path).parent)
    if entry.test_dataset:
        train_val = load_splits(config, graph)
        examples = with_target(load_examples(entry.test_dataset, data_dir=config.data_dir,
                                             graph_dir=graph_dir), graph.target_field)
        test = split_examples(examples, config.seed, 0, 0, entry.test).test
        splits = Splits(train_val.train, train_val.val, test)
    else:
        n_test = entry.test
        if n_test is None:
            dataset = config.dataset or graph.dataset
            if not dataset:
                raise PlanError("no dataset: set 'dataset' in the entry or the graph")
            total = len(load_examples(dataset, data_dir=config.data_dir, graph_dir=graph_dir))
            n_test = max(total - n_train - n_val, 0)
        splits = load_splits(replace(config, test=n_test), graph)
    return splits


def resolved_models(config: RunConfig) -> tuple[str, str]:
    """The (forward, optimizer) model names a run with `config` will record: an embedded
    model without --optimizer-model is optimized by the model it pairs with, when that one
    is installed (as `execute` picks it)."""
    from engine.llm.factory import default_model
    from engine.llm.models import paired_optimizer

    model = config.model or default_model(config.backend)
    if config.optimizer_model:
        return model, config.optimizer_model
    kind = config.optimizer_backend or config.backend
    if kind != config.backend:
        return model, default_model(kind)
    if kind == "local":
        return model, paired_optimizer(model)[0] or model
    return model, model


# --- running --------------------------------------------------------------------------


def finished_runs(db: str, cells: list[Cell]) -> None:
    """Set `run_id` of each cell that has a finished run in the log with the same prefix,
    configuration, models and graph text (the latest one if several)."""
    from engine.runlog.experiments import finished_experiment_runs

    rows = finished_experiment_runs(db)
    for cell in cells:
        want = cell.config.to_json()
        graph_text = load_graph(cell.config.graph).yaml_text
        models = resolved_models(cell.config)  # looks up installed models: once per cell
        for row in rows:
            if row["run_id"].startswith(cell.prefix) and row["graph_yaml"] == graph_text and \
                    (row["model"], row["optimizer_model"]) == models and \
                    all(row["config"].get(k, OLDER_RUNS.get(k)) == want[k] for k in SAME_CONFIG):
                cell.run_id = row["run_id"]
                break


async def run_cell(cell: Cell, listeners: tuple) -> RunResult:
    """`execute` for the cell; with a separate test set, the same steps with its splits."""
    config = replace(cell.config, run_id=cell.prefix + time.strftime("%Y%m%d-%H%M%S") +
                     f".{secrets.token_hex(4)}")
    if not cell.entry.test_dataset:
        return await execute(config, listeners=listeners)
    # a benchmark's own test split (GSM8K, LIAR): the cell prepared the splits
    return await execute(config, listeners=listeners, splits=cell.splits)


def run_cells(pending: list[Cell], console: Any, parallel: int = 1,
              concurrency: int | None = None, budget: Budget | None = None) -> list[str]:
    """Run the cells, up to `parallel` at once in this process under one shared
    concurrency limit (each run is itself concurrent) and one shared `budget`; returns the
    labels of the runs that did not finish. Bad input aborts; a failed run moves on; a
    stopped run (by the user, or by the budget) stops the rest."""
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[calls]} calls"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("runs", total=len(pending), calls=0)
        limit = AdaptiveLimit() if concurrency is None else \
            AdaptiveLimit(start=concurrency, ceiling=concurrency)
        return asyncio.run(_run_all(pending, parallel, limit, progress, bar, budget))


async def _run_all(pending: list[Cell], parallel: int, limit: AdaptiveLimit, progress: Any,
                   bar: Any, budget: Budget | None = None) -> list[str]:
    SHARED_LIMIT.set(limit)  # every run's client takes its calls from this one limit
    SHARED_BUDGET.set(budget if budget is not None and budget.limited else None)
    slots = asyncio.Semaphore(parallel)
    failed: list[str] = []
    calls = {"n": 0, "stopped": False}

    async def one(cell: Cell) -> None:
        async with slots:
            if calls["stopped"]:
                return
            progress.update(bar, description=cell.label)

            def listener(event: Any) -> None:
                if isinstance(event, CallRecord):
                    calls["n"] += 1
                    progress.update(bar, calls=calls["n"])
                elif isinstance(event, StepFinished) and parallel == 1:
                    progress.update(bar, description=f"{cell.label} step {event.step}/"
                                                     f"{cell.config.steps}")

            try:
                result = await run_cell(cell, (listener,))
            except BAD_INPUT:
                raise
            except Exception as exc:  # noqa: BLE001 - one failed run must not stop the rest
                failed.append(cell.label)
                progress.console.print(f"failed: {cell.label}: {exc.__class__.__name__}: "
                                       f"{exc}", markup=False, highlight=False)
                progress.advance(bar)
                return
            if result.status != "finished":
                failed.append(cell.label)
                calls["stopped"] = True
                why = f": {result.reason}" if result.reason else ""
                progress.console.print(f"{result.status}: {cell.label} ({result.run_id}){why}",
                                       markup=False, highlight=False)
                return
            cell.run_id = result.run_id
            score = "" if result.test_score is None else f": test {result.test_score:.3f}"
            progress.console.print(f"done: {cell.label}{score} ({result.run_id})",
                                   markup=False, highlight=False)
            progress.advance(bar)

    await asyncio.gather(*(one(cell) for cell in pending))
    return failed
