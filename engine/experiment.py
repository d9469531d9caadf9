"""The experiment harness: `python -m engine experiment PLAN` runs a plan of benchmark runs
(the paper's protocol is benchmarks/plans/paper.yaml) and writes results.md and results.csv.

A plan is a YAML file: `name`, `description` and a list of `entries`. Each entry is a graph
run with several methods (or named variants of a method, for ablations) on one dataset, or
on every BBH task (`tasks: all`), for one or more seeds. Each (entry, task, variant, seed)
is one run: `engine.run.execute`, logged in the run log like any other run. Finished runs
are found again in the run log by their run id prefix and configuration and skipped, so an
interrupted experiment continues where it stopped. Results are always read back from the
run log. One file because the harness is one workflow: plan -> estimate -> runs -> table.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import re
import secrets
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engine.data.datasets import (
    BBH_ALGORITHMIC_TASKS,
    BBH_NLP_TASKS,
    DatasetError,
    bbh_tasks,
    load_examples,
    with_target,
)
from engine.data.examples import SplitError, Splits, split_examples
from engine.events import CallRecord, StepFinished
from engine.graph import Graph, GraphError, load_graph
from engine.llm.base import LLMError
from engine.methods import METHODS, make_method
from engine.run import RunConfig, RunResult, execute, load_splits, sizes
from engine.runlog.schema import RunLogError

PLAN_KEYS = ("name", "description", "entries")
ENTRY_KEYS = ("name", "description", "graph", "dataset", "test_dataset", "tasks", "methods",
              "variants", "steps", "train", "val", "test", "seeds", "failures", "update_mode",
              "gate", "paper")
VARIANT_KEYS = ("name", "method", "update_mode", "gate", "options")
NAME = re.compile(r"^[A-Za-z0-9_-]+$")
GROUPS = {"nlp": ("BBH NLP", BBH_NLP_TASKS), "algorithmic": ("BBH algorithmic",
                                                          BBH_ALGORITHMIC_TASKS)}
# Average tokens per call, for the estimate only (the run log records the real figures):
# a forward call shows the question, the hints and the node's prompt; a backward or update
# call shows a node's neighbourhood and feedback for k examples.
FORWARD_TOKENS = (600, 200)
OPTIMIZER_TOKENS = (1500, 400)
# Fields of a stored run's config that must equal the plan's for the run to count as done.
SAME_CONFIG = ("method", "backend", "steps", "train", "val", "test", "seed", "dataset",
               "failures_per_step", "gate", "update_mode", "temperature", "method_options")


class PlanError(ValueError):
    """A plan that cannot be run, described in one line."""


# Problems with the input, not with one run: they stop the experiment (status 2).
BAD_INPUT = (PlanError, DatasetError, GraphError, SplitError, LLMError, RunLogError, ValueError,
             FileNotFoundError)


# --- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    method: str
    update_mode: str = "all"
    gate: bool = True
    options: tuple[tuple[str, Any], ...] = ()  # method options, e.g. (("m0", 2),) for gtbp

    def describe(self) -> str:
        flags = [self.method] + [f"{k}={v}" for k, v in self.options] \
            + (["one prompt at a time"] if self.update_mode == "one" else []) \
            + ([] if self.gate else ["no gate"])
        return self.name if flags == [self.name] else f"{self.name} ({', '.join(flags)})"


@dataclass(frozen=True)
class Entry:
    name: str
    graph: str
    variants: tuple[Variant, ...]
    dataset: str | None = None
    test_dataset: str | None = None
    tasks: tuple[str, ...] | None = None  # ("all",) expands to every BBH task file
    steps: int = 4
    train: int | None = None
    val: int | None = None
    test: int | None = None  # None: every example left (or the whole test_dataset)
    seeds: tuple[int, ...] = (0,)
    failures: int = 2
    paper: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    name: str
    path: str
    entries: tuple[Entry, ...]
    description: str = ""


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan; raises PlanError with one line naming the entry at fault."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: plan file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise PlanError(f"{path}{where}: YAML syntax error: "
                        f"{getattr(exc, 'problem', None) or exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a plan must be a YAML mapping with an 'entries' list")
    _check_keys(data, PLAN_KEYS, f"{path}")
    name = str(data.get("name") or path.stem)
    if not NAME.match(name):
        raise PlanError(f"{path}: plan name '{name}' may only use letters, digits, _ and -")
    items = data.get("entries")
    if not isinstance(items, list) or not items:
        raise PlanError(f"{path}: 'entries' must be a non-empty list")
    entries = [_parse_entry(item, i, path) for i, item in enumerate(items)]
    names = [e.name for e in entries]
    for n in names:
        if names.count(n) > 1:
            raise PlanError(f"{path}: entry name '{n}' is used twice")
    return Plan(name, str(path), tuple(entries), str(data.get("description") or ""))


def _check_keys(data: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            raise PlanError(f"{where}: unknown key '{key}' (allowed: {', '.join(allowed)})")


def _parse_entry(item: Any, index: int, path: Path) -> Entry:
    if not isinstance(item, dict):
        raise PlanError(f"{path}: entry {index + 1} must be a mapping with 'name' and 'graph'")
    name = item.get("name")
    where = f"{path}: entry '{name}'" if name else f"{path}: entry {index + 1}"
    _check_keys(item, ENTRY_KEYS, where)
    if not isinstance(name, str) or not NAME.match(name):
        raise PlanError(f"{where}: needs a 'name' of letters, digits, _ and -")
    if not item.get("graph"):
        raise PlanError(f"{where}: missing 'graph'")
    graph = _find_graph(str(item["graph"]), path, where)
    default = Variant("", "", _choice(item, "update_mode", ("all", "one"), "all", where),
                      _flag(item, "gate", True, where))
    methods = item.get("methods") or []
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise PlanError(f"{where}: 'methods' must be a list of method names")
    variants = [replace(default, name=m, method=m) for m in methods]
    for v in item.get("variants") or []:
        variants.append(_parse_variant(v, default, where))
    if not variants:
        raise PlanError(f"{where}: give 'methods' or 'variants'")
    for v in variants:
        if v.method not in METHODS:
            raise PlanError(f"{where}: unknown method '{v.method}' "
                            f"(known: {', '.join(sorted(METHODS))})")
        try:
            make_method(v.method, **dict(v.options))
        except (TypeError, ValueError) as exc:
            raise PlanError(f"{where}: variant '{v.name}': bad options for '{v.method}': "
                            f"{exc}") from None
        if [w.name for w in variants].count(v.name) > 1:
            raise PlanError(f"{where}: variant or method '{v.name}' appears twice")
    tasks = item.get("tasks")
    if tasks is not None:
        tasks = ("all",) if tasks == "all" else tasks
        if not isinstance(tasks, (list, tuple)) or not tasks or \
                not all(isinstance(t, str) and NAME.match(t) for t in tasks):
            raise PlanError(f"{where}: 'tasks' must be 'all' or a list of BBH task names")
        if item.get("dataset") or item.get("test_dataset"):
            raise PlanError(f"{where}: 'tasks' picks the dataset (bbh/<task>); "
                            f"drop 'dataset' and 'test_dataset'")
    seeds = item.get("seeds", [0])
    seeds = [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds):
        raise PlanError(f"{where}: 'seeds' must be a list of whole numbers")
    entry = Entry(
        name=name, graph=graph, variants=tuple(variants),
        dataset=_text(item, "dataset", where), test_dataset=_text(item, "test_dataset", where),
        tasks=tuple(tasks) if tasks else None, steps=_count(item, "steps", where, 4),
        train=_count(item, "train", where), val=_count(item, "val", where),
        test=_count(item, "test", where), seeds=tuple(seeds),
        failures=_count(item, "failures", where, 2), paper=_paper(item, where))
    if entry.failures < 1:
        raise PlanError(f"{where}: 'failures' (examples back-propagated per step) must be "
                        f"at least 1")
    _check_paper_labels(entry, where)
    return entry


def _parse_variant(item: Any, default: Variant, where: str) -> Variant:
    if not isinstance(item, dict) or not item.get("name") or not item.get("method"):
        raise PlanError(f"{where}: each variant needs a 'name' and a 'method'")
    _check_keys(item, VARIANT_KEYS, f"{where}: variant '{item['name']}'")
    if not NAME.match(str(item["name"])):
        raise PlanError(f"{where}: variant name '{item['name']}' may only use letters, "
                        f"digits, _ and -")
    vwhere = f"{where}: variant '{item['name']}'"
    options = item.get("options") or {}
    if not isinstance(options, dict):
        raise PlanError(f"{vwhere}: 'options' must map option names to values")
    return Variant(str(item["name"]), str(item["method"]),
                   _choice(item, "update_mode", ("all", "one"), default.update_mode, vwhere),
                   _flag(item, "gate", default.gate, vwhere), tuple(sorted(options.items())))


def _find_graph(text: str, plan_path: Path, where: str) -> str:
    """A graph path as given (from the working directory), else relative to the plan's
    folder or one of its parents (plans in benchmarks/plans/ name sample_graphs/...)."""
    given = Path(text).expanduser()
    if given.is_absolute() or given.is_file():
        if not given.is_file():
            raise PlanError(f"{where}: graph '{text}' not found")
        return str(given)
    folder = plan_path.resolve().parent
    for base in (folder, *folder.parents):
        if (base / given).is_file():
            return str(base / given)
    raise PlanError(f"{where}: graph '{text}' not found (looked in the working directory "
                    f"and above {folder})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(item: dict, key: str, where: str, default: int | None = None) -> int | None:
    value = item.get(key, default)
    if value is not None and (not _is_int(value) or value < 0):
        raise PlanError(f"{where}: '{key}' must be a whole number of at least 0"
                        + (" or null" if default is None else ""))
    return value


def _choice(item: dict, key: str, allowed: tuple[str, ...], default: str, where: str) -> str:
    value = item.get(key, default)
    if value not in allowed:
        raise PlanError(f"{where}: '{key}' must be one of {', '.join(allowed)}")
    return value


def _flag(item: dict, key: str, default: bool, where: str) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise PlanError(f"{where}: '{key}' must be true or false")
    return value


def _text(item: dict, key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise PlanError(f"{where}: '{key}' must be a dataset name")
    return value


def _paper(item: dict, where: str) -> dict[str, float]:
    paper = item.get("paper") or {}
    if not isinstance(paper, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in paper.values()):
        raise PlanError(f"{where}: 'paper' must map a method or variant (for BBH: "
                        f"group/method) to the paper's figure in percent")
    return {str(k): float(v) for k, v in paper.items()}


def _check_paper_labels(entry: Entry, where: str) -> None:
    names = {v.name for v in entry.variants}
    for label in entry.paper:
        group, _, name = label.rpartition("/")
        if name not in names or (group and (not entry.tasks or group not in GROUPS)) or \
                (entry.tasks and not group):
            expected = "nlp/<method>, algorithmic/<method>" if entry.tasks else "<method>"
            raise PlanError(f"{where}: 'paper' label '{label}' matches no row "
                            f"(expected {expected} with one of: {', '.join(sorted(names))})")


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


# --- the estimate ---------------------------------------------------------------------


@dataclass
class Estimate:
    runs: int = 0
    forward_calls: int = 0
    optimizer_calls: int = 0
    cost: float | None = 0.0

    @property
    def tokens(self) -> int:
        return self.forward_calls * sum(FORWARD_TOKENS) + \
            self.optimizer_calls * sum(OPTIMIZER_TOKENS)

    def add(self, other: Estimate) -> None:
        self.runs += other.runs
        self.forward_calls += other.forward_calls
        self.optimizer_calls += other.optimizer_calls
        self.cost = None if self.cost is None or other.cost is None else self.cost + other.cost


def backward_calls_per_example(graph: Graph, method: str) -> int:
    """Backward calls for one example: one per (node, input) pair for textgrad and its
    subclasses, none without gradients, else one per LLM node with node inputs (semantic;
    an approximation for other methods such as gtbp)."""
    from engine.methods.textgrad import TextGrad

    cls = METHODS[method]
    if not cls.uses_gradients:
        return 0
    fan_in = [len(graph.predecessors(n.id)) for n in graph.nodes if n.kind == "llm"]
    return sum(fan_in) if issubclass(cls, TextGrad) else sum(1 for f in fan_in if f)


def estimate_run(graph: Graph, config: RunConfig, n_train: int, n_val: int, n_test: int,
                 models: tuple[str, str], prices: dict) -> Estimate:
    """Upper bound on one run's calls: every evaluated example runs every LLM node (step 0
    on train and validation; each step on train, then its candidate on validation; the
    test once), k failing examples are back-propagated and each trainable node (one, in
    update mode 'one') gets an update call per step. The reply cache is ignored."""
    from engine.llm.pricing import cost_usd

    llm_nodes = sum(1 for n in graph.nodes if n.kind == "llm")
    evaluated = (config.steps + 1) * (n_train + n_val) + n_test
    updates = 1 if config.update_mode == "one" else len(graph.trainable_nodes)
    optimizer = config.steps * (min(config.failures_per_step, n_train)
                                * backward_calls_per_example(graph, config.method) + updates)
    optimizer += evaluated if graph.metric == "judge" else 0
    forward = evaluated * llm_nodes
    costs = [cost_usd(prices, models[0], forward * FORWARD_TOKENS[0],
                      forward * FORWARD_TOKENS[1]),
             cost_usd(prices, models[1], optimizer * OPTIMIZER_TOKENS[0],
                      optimizer * OPTIMIZER_TOKENS[1])]
    return Estimate(1, forward, optimizer, None if None in costs else sum(costs))


def resolved_models(config: RunConfig) -> tuple[str, str]:
    from engine.llm.factory import default_model

    model = config.model or default_model(config.backend)
    return model, config.optimizer_model or model


def estimate_table(cells: list[Cell], pending: list[Cell]) -> tuple[Table, Estimate]:
    from engine.llm.pricing import load_prices

    prices = load_prices()
    per_entry: dict[str, Estimate] = {}
    for cell in pending:
        graph = load_graph(cell.config.graph)
        s = cell.splits
        est = estimate_run(graph, cell.config, len(s.train), len(s.val), len(s.test),
                           resolved_models(cell.config), prices)
        per_entry.setdefault(cell.entry.name, Estimate()).add(est)
    table = Table("entry", "to run", "done", "forward calls", "optimizer calls", "tokens",
                  "cost $", title="Estimate (upper bound; cached replies cost nothing)")
    total = Estimate()
    for name in dict.fromkeys(c.entry.name for c in cells):
        est = per_entry.get(name, Estimate())
        done = sum(1 for c in cells if c.entry.name == name and c.run_id)
        table.add_row(name, str(est.runs), str(done), f"{est.forward_calls:,}",
                      f"{est.optimizer_calls:,}", _compact(est.tokens), _money(est.cost))
        total.add(est)
    table.add_row("total", str(total.runs), str(sum(1 for c in cells if c.run_id)),
                  f"{total.forward_calls:,}", f"{total.optimizer_calls:,}",
                  _compact(total.tokens), _money(total.cost), style="bold")
    return table, total


def _compact(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else str(n)


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.2f}"


def confirm(total: Estimate, assume_yes: bool, stdin: TextIO, console: Any) -> bool:
    """--yes, or 'y' typed at a terminal. Without a terminal and without --yes: PlanError."""
    if assume_yes or total.runs == 0:
        return True
    if not stdin.isatty():
        raise PlanError(f"not confirmed: standard input is not a terminal; pass --yes to "
                        f"start the {total.runs} runs estimated above")
    console.print("Proceed? [y/N] ", end="", markup=False, highlight=False)
    return stdin.readline().strip().lower() in ("y", "yes")


# --- running --------------------------------------------------------------------------


def finished_runs(db: str, cells: list[Cell]) -> None:
    """Set `run_id` of each cell that has a finished run in the log with the same prefix,
    configuration, models and graph text (the latest one if several)."""
    from engine.runlog.schema import check_readable, connect

    if not Path(db).exists():
        return
    check_readable(db)
    with connect(db, read_only=True) as con:
        rows = con.execute("SELECT run_id, config, model, optimizer_model, graph_yaml FROM runs "
                           "WHERE starts_with(run_id, 'exp.') AND status = 'finished' "
                           "ORDER BY started_at DESC").fetchall()
    for cell in cells:
        want = cell.config.to_json()
        graph_text = load_graph(cell.config.graph).yaml_text
        for run_id, config, model, optimizer_model, graph_yaml in rows:
            stored = json.loads(config)
            if run_id.startswith(cell.prefix) and graph_yaml == graph_text and \
                    (model, optimizer_model) == resolved_models(cell.config) and \
                    all(stored.get(k) == want[k] for k in SAME_CONFIG):
                cell.run_id = run_id
                break


async def run_cell(cell: Cell, listeners: tuple) -> RunResult:
    """`execute` for the cell; with a separate test set, the same steps with its splits."""
    config = replace(cell.config, run_id=cell.prefix + time.strftime("%Y%m%d-%H%M%S") +
                     f".{secrets.token_hex(2)}")
    if not cell.entry.test_dataset:
        return await execute(config, listeners=listeners)
    # a benchmark's own test split (GSM8K, LIAR): the cell prepared the splits
    return await execute(config, listeners=listeners, splits=cell.splits)


def run_cells(pending: list[Cell], console: Any) -> list[str]:
    """Run the cells one after another (each run is itself concurrent); returns the labels
    of the runs that did not finish. Bad input aborts; other failures move on."""
    failed: list[str] = []
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[calls]} calls"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("runs", total=len(pending), calls=0)
        calls = {"n": 0}
        for cell in pending:
            progress.update(bar, description=cell.label)

            def listener(event: Any, cell: Cell = cell) -> None:
                if isinstance(event, CallRecord):
                    calls["n"] += 1
                    progress.update(bar, calls=calls["n"])
                elif isinstance(event, StepFinished):
                    progress.update(bar, description=f"{cell.label} step {event.step}/"
                                                     f"{cell.config.steps}")

            try:
                result = asyncio.run(run_cell(cell, (listener,)))
            except BAD_INPUT:
                raise
            except Exception as exc:  # noqa: BLE001 - one failed run must not stop the rest
                failed.append(cell.label)
                progress.console.print(f"failed: {cell.label}: {exc.__class__.__name__}: "
                                       f"{exc}", markup=False, highlight=False)
                progress.advance(bar)
                continue
            if result.status != "finished":
                failed.append(cell.label)
                progress.console.print(f"{result.status}: {cell.label} ({result.run_id})",
                                       markup=False)
                break
            cell.run_id = result.run_id
            score = "" if result.test_score is None else f": test {result.test_score:.3f}"
            progress.console.print(f"done: {cell.label}{score} ({result.run_id})",
                                   markup=False, highlight=False)
            progress.advance(bar)
    return failed


# --- results --------------------------------------------------------------------------

COLUMNS = ("entry", "level", "set", "variant", "method", "options", "update_mode", "gate",
           "test_pct", "paper_pct", "val_pct", "steps", "accepted_edits", "calls", "tokens",
           "cost_usd", "runs_finished", "runs_planned", "run_ids")


def run_metrics(db: str, run_ids: list[str]) -> dict[str, dict]:
    """Per run: test score, last validation score, steps, accepted edits, calls, tokens,
    cost, models."""
    from engine.runlog.schema import connect

    if not run_ids:
        return {}
    with connect(db, read_only=True) as con:
        cursor = con.execute("""
            SELECT r.run_id, r.model, r.optimizer_model, r.backend, t.test, s.steps, s.val,
                   coalesce(u.accepted, 0) AS accepted, coalesce(c.calls, 0) AS calls,
                   coalesce(c.tokens, 0) AS tokens, c.cost
            FROM runs r
            LEFT JOIN (SELECT run_id, max(value) AS test FROM metrics
                       WHERE key = 'test_score' GROUP BY run_id) t USING (run_id)
            LEFT JOIN (SELECT run_id, max(step) AS steps, arg_max(val_score, step) AS val
                       FROM steps GROUP BY run_id) s USING (run_id)
            LEFT JOIN (SELECT run_id, count(*) FILTER (WHERE accepted) AS accepted
                       FROM updates GROUP BY run_id) u USING (run_id)
            LEFT JOIN (SELECT run_id, count(*) AS calls,
                              sum(prompt_tokens + completion_tokens) AS tokens,
                              sum(cost_usd) AS cost
                       FROM llm_calls GROUP BY run_id) c USING (run_id)
            WHERE list_contains(?, r.run_id)""", [run_ids])
        names = [d[0] for d in cursor.description]
        return {row[0]: dict(zip(names, row)) for row in cursor.fetchall()}


def _mean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else None


def _row(entry: Entry, level: str, label: str, variant: Variant, cells: list[Cell],
         metrics: dict[str, dict], scores: list[float | None] | None = None) -> dict:
    """level: entry, task, or a BBH group (nlp, algorithmic, other); a group's score is
    the mean of its tasks' scores, not of its runs."""
    found = [metrics[c.run_id] for c in cells if c.run_id in metrics]
    costs = [m["cost"] for m in found]
    paper_key = {"entry": variant.name, "nlp": f"nlp/{variant.name}",
                 "algorithmic": f"algorithmic/{variant.name}"}.get(level)
    return {
        "entry": entry.name, "level": level, "set": label, "variant": variant.name,
        "method": variant.method, "options": " ".join(f"{k}={v}" for k, v in variant.options),
        "update_mode": variant.update_mode, "gate": variant.gate, "label": variant.describe(),
        "test_pct": _pct(_mean(scores if scores is not None else (m["test"] for m in found))),
        "paper_pct": entry.paper.get(paper_key) if paper_key else None,
        "val_pct": _pct(_mean(m["val"] for m in found)),
        "steps": max((m["steps"] or 0 for m in found), default=None),
        "accepted_edits": sum(m["accepted"] for m in found),
        "calls": sum(m["calls"] for m in found), "tokens": sum(int(m["tokens"]) for m in found),
        "cost_usd": None if not found or None in costs else round(sum(costs), 4),
        "runs_finished": len(found), "runs_planned": len(cells),
        "run_ids": " ".join(c.run_id for c in cells if c.run_id in metrics),
    }


def _pct(value: float | None) -> float | None:
    return None if value is None else round(100 * value, 1)


def result_rows(cells: list[Cell], metrics: dict[str, dict]) -> list[dict]:
    """One row per (entry, set, variant): plain entries, BBH groups (mean over tasks of the
    per-task mean over seeds), then per-task rows."""
    rows, task_rows = [], []
    entries = list(dict.fromkeys(c.entry.name for c in cells))
    for name in entries:
        mine = [c for c in cells if c.entry.name == name]
        entry = mine[0].entry
        for variant in entry.variants:
            vcells = [c for c in mine if c.variant == variant]
            if not entry.tasks:
                label = entry.test_dataset or entry.dataset or "graph's dataset"
                rows.append(_row(entry, "entry", label, variant, vcells, metrics))
                continue
            per_task = {t: [c for c in vcells if c.task == t]
                        for t in dict.fromkeys(c.task for c in vcells)}
            task_rows += [_row(entry, "task", t, variant, tc, metrics)
                          for t, tc in per_task.items()]
            grouped = {g: [t for t in per_task if t in names] for g, (_, names) in GROUPS.items()}
            grouped["other"] = [t for t in per_task
                                if not any(t in ts for ts in grouped.values())]
            for group, tasks in grouped.items():
                if not tasks:
                    continue
                title = GROUPS[group][0] if group in GROUPS else "BBH other"
                scores = [_mean(metrics[c.run_id]["test"] for c in per_task[t]
                                if c.run_id in metrics) for t in tasks]
                rows.append(_row(entry, group, f"{title} ({_plural(len(tasks), 'task')})",
                                 variant, [c for t in tasks for c in per_task[t]], metrics,
                                 scores))
    return rows + task_rows


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def write_results(out_dir: Path, plan: Plan, rows: list[dict], metrics: dict[str, dict],
                  db: str) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, md_path = out_dir / "results.csv", out_dir / "results.md"
    with csv_path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items()} for r in rows)
    md_path.write_text(results_markdown(plan, rows, metrics, db), encoding="utf-8")
    return md_path, csv_path


def results_markdown(plan: Plan, rows: list[dict], metrics: dict[str, dict], db: str) -> str:
    models = sorted({f"{m['backend']}: {m['model']} forward, {m['optimizer_model']} optimizer"
                     for m in metrics.values()})
    lines = [f"# Results: plan `{plan.name}`", "",
             f"Plan `{plan.path}`; run log `{db}`; written {time.strftime('%Y-%m-%d %H:%M')}.",
             f"Models: {'; '.join(models) or 'no finished runs yet'}.", "",
             "Test and validation scores in percent, mean over seeds; BBH groups are the "
             "mean over their tasks. *paper*: the figure the paper reports (gpt-4o-mini "
             "forward). Calls, tokens and cost are totals, cached replies included at no "
             "cost.", ""]
    lines += _md_table([r for r in rows if r["level"] != "task"], group_ids=True)
    tasks = [r for r in rows if r["level"] == "task"]
    if tasks:
        lines += ["", "## BBH per task", ""] + _md_table(tasks, group_ids=False)
    return "\n".join(lines) + "\n"


def _md_table(rows: list[dict], group_ids: bool) -> list[str]:
    head = ["entry", "set", "method", "test %", "paper %", "val %", "steps", "accepted edits",
            "calls", "tokens", "cost $", "runs"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        done = f"{r['runs_finished']}/{r['runs_planned']}"
        runs = r["run_ids"] if r["runs_planned"] == 1 or not group_ids else \
            f"{done} (ids in results.csv)"
        if r["runs_finished"] < r["runs_planned"] and r["runs_planned"] == 1:
            runs = "not run"
        cells = [r["entry"], r["set"], r["label"], _num(r["test_pct"]), _num(r["paper_pct"]),
                 _num(r["val_pct"]), _num(r["steps"]), str(r["accepted_edits"]),
                 f"{r['calls']:,}", f"{r['tokens']:,}",
                 "" if r["cost_usd"] is None else f"{r['cost_usd']:.2f}", runs]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _num(value: Any) -> str:
    return "" if value is None else (f"{value:.1f}" if isinstance(value, float) else str(value))


# --- command line ---------------------------------------------------------------------


def register_cli(subparsers: Any) -> None:
    from engine.llm.factory import BACKENDS

    p = subparsers.add_parser("experiment", help="run a plan of benchmark runs (the paper's "
                                                 "protocol) and write a results table")
    p.add_argument("plan", help="plan file, e.g. benchmarks/plans/paper.yaml")
    p.add_argument("--db", default="runs.duckdb", help="run log (default: runs.duckdb)")
    p.add_argument("--data-dir", help="where the benchmark data lives (gsm8k/, liar/, bbh/)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="model backend (default: openai if OPENAI_API_KEY or OPENAI_BASE_URL "
                        "is set, else the embedded local model)")
    p.add_argument("--model", help="model for forward calls")
    p.add_argument("--optimizer-model", help="model for loss, backward and update calls")
    p.add_argument("--base-url", help="OpenAI-compatible server URL (default: OPENAI_BASE_URL)")
    p.add_argument("--out", help="folder for results.md and results.csv "
                                 "(default: results/<plan name>/)")
    p.add_argument("--yes", action="store_true", help="start without asking")
    p.add_argument("--concurrency", type=_positive, default=16,
                   help="LLM calls in flight within each run")
    p.add_argument("--limit-tasks", type=_positive, metavar="N",
                   help="only the first N BBH tasks (alphabetical), for trying a plan")
    p.add_argument("--methods", metavar="A,B",
                   help="only run these methods or variants (the table still shows the rest)")
    p.set_defaults(func=cmd_experiment)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, not {text}")
    return value


def _selected(cells: list[Cell], methods: str | None) -> list[Cell]:
    if not methods:
        return cells
    wanted = {m.strip() for m in methods.split(",") if m.strip()}
    known = {n for c in cells for n in (c.variant.name, c.variant.method)}
    unknown = sorted(wanted - known)
    if unknown:
        raise PlanError(f"--methods: '{unknown[0]}' is no method or variant of this plan "
                        f"(plan has: {', '.join(sorted(known))})")
    return [c for c in cells if c.variant.name in wanted or c.variant.method in wanted]


def cmd_experiment(args: argparse.Namespace) -> int:
    from engine.cli import console, out
    from engine.llm.factory import default_backend_kind

    plan = load_plan(args.plan)
    base = RunConfig(graph="", backend=args.backend or default_backend_kind(), model=args.model,
                     optimizer_model=args.optimizer_model, db=args.db, data_dir=args.data_dir,
                     concurrency=args.concurrency, base_url=args.base_url)
    cells = expand(plan, args.data_dir, args.limit_tasks)
    prepare(cells, base)
    finished_runs(args.db, cells)
    pending = [c for c in _selected(cells, args.methods) if not c.run_id]
    table, total = estimate_table(cells, pending)
    out.print(table)
    out.print(f"{len(cells)} runs in plan '{plan.name}': {len(cells) - len(pending)} already "
              f"finished or filtered out, {len(pending)} to run. Tokens assume "
              f"{sum(FORWARD_TOKENS)} per forward call and {sum(OPTIMIZER_TOKENS)} per "
              f"optimizer call.", markup=False, highlight=False)
    if not confirm(total, args.yes, sys.stdin, console):
        console.print("not started", markup=False)
        return 1
    failed = run_cells(pending, console) if pending else []
    metrics = run_metrics(args.db, [c.run_id for c in cells if c.run_id])
    rows = result_rows(cells, metrics)
    out_dir = Path(args.out) if args.out else Path("results") / plan.name
    md_path, csv_path = write_results(out_dir, plan, rows, metrics, args.db)
    out.print("\n".join(_md_table([r for r in rows if r["level"] != "task"], True)),
              markup=False, highlight=False)
    out.print(f"results: {md_path} and {csv_path}; open any run with the dashboard "
              f"(run log {args.db})", markup=False, highlight=False)
    if failed:
        console.print(f"{len(failed)} runs did not finish: {', '.join(failed)}; run the same "
                      f"command again to retry them", markup=False, highlight=False)
        return 1
    return 0
