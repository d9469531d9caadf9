"""Cached access to the run log for the pages (pages write no SQL).

Every read is a function of the database path and the run (never a connection), made
cached by `@cached`: its cache is keyed on those arguments and the run log's stamp (mtime
and size of the database and its WAL; a lake's newest snapshot id), so a new write changes
the stamp and a live run is re-read, and an unchanged log is served from memory. The
reader underneath opens short-lived read-only connections that retry while the engine
holds the write lock (a lake has no lock: each commit is a snapshot).
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ParamSpec, TypeVar, overload

import pandas as pd
import streamlit as st

from dashboard.views import graph_model as gh
from dashboard.views.collected import EMPTY as EMPTY_COLLECTED
from dashboard.views.collected import Collected, collected_overview
from engine.data.stats import Z95, score_interval
from engine.runlog import debug, lake, reader

Stamp = tuple[int, ...]
CACHE_OPTIONS = dict(show_spinner=False, max_entries=256, ttl=3600)


# A lake's stamp costs a query of its catalog (a few milliseconds; a page asks for it
# dozens of times): each dashboard process asks at most this often per lake.
LAKE_STAMP_SECONDS = 0.5
_lake_stamps: dict[str, tuple[float, Stamp]] = {}
_lake_stamps_lock = threading.Lock()


def stamp(db: str) -> Stamp:
    """Changes whenever the engine writes: (mtime_ns, size) of the file and its WAL; over
    a lake, (its newest snapshot id,), read at most every LAKE_STAMP_SECONDS."""
    if lake.is_lake(db):
        return _lake_stamp(db)
    out: list[int] = []
    for path in (Path(db), Path(f"{db}.wal")):
        try:
            info = path.stat()
            out += [info.st_mtime_ns, info.st_size]
        except OSError:
            out += [0, 0]
    return tuple(out)


def _lake_stamp(db: str) -> Stamp:
    now = time.monotonic()
    with _lake_stamps_lock:
        seen = _lake_stamps.get(db)
    if seen is not None and now - seen[0] < LAKE_STAMP_SECONDS:
        return seen[1]
    try:
        found: Stamp = (lake.snapshot(db),)
    except Exception:  # noqa: BLE001 - unreachable or not a lake yet: the read says why
        return (-1, time.monotonic_ns())  # a new stamp each time: nothing served stale
    with _lake_stamps_lock:
        _lake_stamps[db] = (now, found)
    return found


def exists(db: str) -> bool:
    """The run log is there: a file, or a lake (a file catalog exists as a file; a Postgres
    catalog, or an address the lake refuses, is taken as there: the read says if not)."""
    if lake.is_lake(db):
        try:
            return lake.exists(db)
        except lake.LakeError:
            return True
    return bool(db) and os.path.isfile(db)


@dataclass(frozen=True)
class RunGraph:
    model: gh.GraphModel
    trainable: tuple[str, ...]
    description: str
    metric: str
    prompts: tuple[tuple[str, str], ...]  # initial prompt per node


# --- cached queries ---------------------------------------------------------------------


P = ParamSpec("P")
T = TypeVar("T")
# an annotation that makes a parameter an int -> whether None passes as None (a string
# under `from __future__ import annotations`)
_INTS = {"int": False, int: False, "int | None": True, int | None: True}


@overload
def cached(read: Callable[P, T], *, absent: Callable[[], T] | None = None) -> Callable[P, T]:
    ...


@overload
def cached(read: None = None, *, absent: Callable[[], T] | None = None
           ) -> Callable[[Callable[P, T]], Callable[P, T]]:
    ...


def cached(read=None, *, absent=None):
    """`read(db, ...)` served from memory while the run log's stamp is unchanged.

    The decorated function keeps its name, signature and docstring; a call computes the
    stamp and looks up (db, stamp, the other arguments) in a `st.cache_data` cache of its
    own (CACHE_OPTIONS), reading only on a miss. Defaults are filled in first, so a
    default passed or left out is one entry; a parameter annotated `int` (`int | None`) is
    passed as a Python int (None stays None), so numpy's int64 from a frame and a plain int
    share an entry; `**options` are sorted by name. With `absent`, a run log that does not
    exist (see exists()) gives `absent()`, unread and uncached."""
    if read is None:
        return functools.partial(cached, absent=absent)
    signature = inspect.signature(read)
    ints = {name: _INTS[p.annotation] for name, p in signature.parameters.items()
            if p.annotation in _INTS}

    def fetch(db: str, version: Stamp, args: tuple, options: tuple):
        return read(db, *args, **dict(options))

    # st.cache_data keys a function's cache on its module, qualified name and source: each
    # read gets a name of its own, and its own source (inspect follows __wrapped__), so an
    # edit to one read's body is a new cache of that read alone, as a hand-written one was
    fetch.__signature__ = inspect.signature(fetch)  # the arguments' names, for the cache
    fetch.__module__ = read.__module__
    fetch.__name__ = f"_{read.__name__}"
    fetch.__qualname__ = f"{read.__qualname__}.<cached>"
    fetch.__wrapped__ = read
    cache = st.cache_data(**CACHE_OPTIONS)(fetch)

    @functools.wraps(read)
    def serve(db: str, *args, **kwargs):
        if absent is not None and not exists(db):
            return absent()
        bound = signature.bind(db, *args, **kwargs)
        bound.apply_defaults()
        for name, optional in ints.items():
            value = bound.arguments[name]
            bound.arguments[name] = None if optional and value is None else int(value)
        return cache(db, stamp(db), bound.args[1:], tuple(sorted(bound.kwargs.items())))

    serve.cache = cache  # its st.cache_data function (.clear())
    return serve


def _no_runs() -> pd.DataFrame:
    return pd.DataFrame(columns=["run_id", "graph_name", "method", "status"])


@cached(absent=_no_runs)
def runs(db: str) -> pd.DataFrame:
    """One row per run (see reader.list_runs); empty when the file does not exist yet."""
    return reader.list_runs(db)


@cached
def run(db: str, run_id: str) -> dict | None:
    return reader.run_record(db, run_id)


@cached
def graph(db: str, run_id: str) -> RunGraph | None:
    """The run's graph as logged when it started (not the file on disk today)."""
    from engine.api.support import read_logged_graph
    from engine.core.graph import GraphError

    record = reader.run_record(db, run_id)
    if record is None or not record.get("graph_yaml"):
        return None
    try:  # a Python-built graph names its functions and metric; they are not run here
        graph = read_logged_graph(record["graph_yaml"], f"<run {run_id}>")
    except GraphError:  # logged by another engine version: the pages say so, no crash
        return None
    return RunGraph(gh.GraphModel.from_graph(graph), tuple(graph.trainable_nodes),
                    graph.description, graph.metric, tuple((n.id, n.prompt) for n in graph.nodes))


@cached
def steps(db: str, run_id: str) -> pd.DataFrame:
    return reader.step_table(db, run_id)


@cached
def split_sizes(db: str, run_id: str) -> dict[str, int]:
    """Examples per split of a run (see reader.split_sizes)."""
    return reader.split_sizes(db, run_id)


@cached
def step_examples(db: str, run_id: str, step: int) -> pd.DataFrame:
    return reader.step_examples(db, run_id, step)


@cached
def node_stats(db: str, run_id: str, step: int) -> pd.DataFrame:
    return reader.node_step_stats(db, run_id, step)


@cached
def flows(db: str, run_id: str, step: int, example_id: str | None = None) -> pd.DataFrame:
    return reader.gradient_flows(db, run_id, step, example_id)


@cached
def node_view(db: str, run_id: str, step: int, example_id: str, node_id: str
              ) -> dict[str, pd.DataFrame]:
    return reader.node_view(db, run_id, step, example_id, node_id)


@cached
def example_trace(db: str, run_id: str, step: int, example_id: str) -> dict[str, pd.DataFrame]:
    return reader.example_trace(db, run_id, step, example_id)


@cached
def updates(db: str, run_id: str, step: int | None = None) -> pd.DataFrame:
    return reader.step_updates(db, run_id, step)


@cached
def prompt_history(db: str, run_id: str) -> pd.DataFrame:
    return reader.prompt_history(db, run_id)


@cached
def paired_gradients(db: str, run_a: str, run_b: str, step: int, node_id: str
                     ) -> pd.DataFrame:
    """One node's gradients in two runs, example by example (reader.paired_gradients)."""
    return reader.paired_gradients(db, run_a, run_b, step, node_id)


@cached
def example_gradients(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return reader.example_gradients(db, run_id, step, example_id)


@cached
def token_totals(db: str, run_id: str) -> pd.DataFrame:
    return reader.token_totals(db, run_id)


@cached
def step_phase_costs(db: str, run_id: str) -> pd.DataFrame:
    return reader.step_phase_costs(db, run_id)


@cached
def step_totals(db: str, run_id: str) -> pd.DataFrame:
    return reader.step_totals(db, run_id)


# --- debugging views: examples, traces, prompt history, per-example compare -------------


@cached
def example_rows(db: str, run_id: str, step: int, **options) -> pd.DataFrame:
    """One page of the step's examples table (see debug.example_rows for the options)."""
    return debug.example_rows(db, run_id, step, **options)


@cached
def example_calls(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return debug.example_calls(db, run_id, step, example_id)


@cached
def node_history(db: str, run_id: str, node_id: str) -> dict[str, pd.DataFrame]:
    return debug.node_history(db, run_id, node_id)


@cached
def _compare_rows(db: str, a: str, b: str, step_a: int, step_b: int) -> pd.DataFrame:
    return debug.compare_rows(db, a, b, step_a, step_b)


def compare_rows(db: str, a: str, b: str, step_a: int, step_b: int, metric: str = "auto"
                 ) -> pd.DataFrame:
    """The shared examples with each side's graded answer (`answer_a`, `answer_b`):
    `disagree` when the graded answers or the scores differ, `raw_differs` when only the
    raw text does (`Yes.` against `Yes.\n</output>` is no disagreement)."""
    rows = _compare_rows(db, a, b, step_a, step_b).copy()
    rows["answer_a"] = [graded_answer(metric, p, t) for p, t in
                        zip(rows["prediction_a"], rows["target"])]
    rows["answer_b"] = [graded_answer(metric, p, t) for p, t in
                        zip(rows["prediction_b"], rows["target"])]
    scores_differ = [abs((x if pd.notna(x) else 0.0) - (y if pd.notna(y) else 0.0)) > 1e-9
                     for x, y in zip(rows["score_a"], rows["score_b"])]
    rows["disagree"] = [bool(d or x != y) for d, x, y in
                        zip(scores_differ, rows["answer_a"], rows["answer_b"])]
    rows["raw_differs"] = [(x or "") != (y or "") for x, y in
                           zip(rows["prediction_a"], rows["prediction_b"])]
    return rows


def graded_answer(metric: str, prediction: object, target: object) -> str:
    """The answer the grader reads in a prediction (the metric's canonical form); for a
    judge or Python metric, the whitespace-normalized text."""
    from engine.data.graders import extract_answer, normalize_text

    text = prediction if isinstance(prediction, str) else ""
    if metric in ("judge", "python", ""):
        return normalize_text(text)
    try:
        return extract_answer(metric, text, target if isinstance(target, str) else "")
    except (KeyError, ValueError):
        return normalize_text(text)


@cached
def steps_with_gradients(db: str, run_id: str) -> list[int]:
    """Steps at which the run back-propagated (sent gradients or targets)."""
    return debug.steps_with_gradients(db, run_id)


@cached
def backward_calls(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return debug.backward_calls(db, run_id, step, example_id)


@cached
def forks(db: str, run_id: str) -> list[str]:
    """Runs forked from `run_id`, newest first."""
    return debug.forks(db, run_id)


@cached(absent=dict)
def test_scores(db: str) -> dict[str, float]:
    """run id -> test-split score, for the runs that evaluated one."""
    frame = debug.test_scores(db)
    return dict(zip(frame["run_id"], frame["test_score"]))


# --- derived values ---------------------------------------------------------------------


def default_step(steps: pd.DataFrame) -> int | None:
    """The step a run opens at: the latest that back-propagated something, else the
    latest step."""
    if steps.empty:
        return None
    with_edits = steps[steps["proposed"] > 0]
    return int((with_edits if not with_edits.empty else steps)["step"].iloc[-1])


def lead_example(db: str, run_id: str, step: int) -> str | None:
    """The example to show first at a step: a failing one that was back-propagated (it has
    gradients to look at), else any back-propagated one, else the first."""
    examples = step_examples(db, run_id, int(step))
    if examples.empty:
        return None
    sent = examples[examples["gradients"] > 0]
    failing = sent[sent["score"].fillna(0) < 1]
    for frame in (failing, sent, examples):
        if not frame.empty:
            return str(frame.iloc[0]["example_id"])
    return None


def starting_step(db: str, run_id: str) -> int:
    """The step a run starts from: 0 (its baseline), or a fork's step S (re-measured)."""
    fork = (run(db, run_id) or {}).get("fork_step")
    return 0 if fork is None or pd.isna(fork) else int(fork)


def steps_done(db: str, run_id: str) -> int:
    """Optimization steps the run wrote itself: those after its starting step (0, the
    baseline; a fork's S, which it re-measures), so a fork from step 1 that ran one step
    has written 1, not 2."""
    table = steps(db, run_id)
    return 0 if table.empty else max(int(table["step"].max()) - starting_step(db, run_id), 0)


def baseline_done(db: str, run_id: str) -> bool:
    """The run's starting step (step 0, or a fork's S) is in the run log."""
    table = steps(db, run_id)
    return bool((table["step"] == starting_step(db, run_id)).any()) if not table.empty else False


def current_prompts(db: str, run_id: str) -> dict[str, str]:
    """Each node's latest accepted prompt (the initial one when no edit was accepted)."""
    history = prompt_history(db, run_id)
    accepted = history[history["accepted"].fillna(False).astype(bool)]
    latest = accepted.sort_values("version").groupby("node_id").tail(1)
    return dict(zip(latest["node_id"], latest["prompt"]))


@dataclass(frozen=True)
class Score:
    """A validation score with the number of examples behind it and a 95% interval."""

    value: float | None
    n: int

    def interval(self) -> tuple[float, float] | None:
        """Wilson's 95% interval for a pass rate measured on `n` examples."""
        return score_interval(self.value, self.n, Z95)

    def text(self) -> str:
        """'0.250 on 8 examples (95% interval 0.07–0.59)', or '–' when not measured."""
        if self.value is None or self.value != self.value:
            return "–"
        bounds = self.interval()
        if bounds is None:
            return f"{self.value:.3f}"
        return (f"{self.value:.3f} on {self.n} example{'s' if self.n != 1 else ''} (95% "
                f"interval {bounds[0]:.2f}–{bounds[1]:.2f})")


def validation_at(db: str, run_id: str, step: int) -> Score:
    """The validation score a run logged at `step` (for a fork's first step: its edited
    prompts, re-measured) and the number of validation examples it was measured on."""
    table = steps(db, run_id)
    row = table[table["step"] == int(step)]
    value = None if row.empty or pd.isna(row.iloc[0]["val_score"]) else float(
        row.iloc[0]["val_score"])
    examples = step_examples(db, run_id, int(step)) if not row.empty else None
    n = 0 if examples is None else int((examples["split"] == "val").sum())
    return Score(value, n)


def fixed_prompts(db: str, run_id: str) -> dict[str, str]:
    """Hand-fixed prompts for a run's graph, node id -> prompt: for the demo, the measured
    ones beside it (sample_graphs/data/demo_fixed_prompts.yaml, which
    benchmarks/demo_prompts.py scores); {} for other graphs."""
    import yaml

    from dashboard.jobs import DEMO_FIXED_PROMPTS

    record = run(db, run_id) or {}
    if record.get("graph_name") != "demo" or not DEMO_FIXED_PROMPTS.is_file():
        return {}
    try:
        found = yaml.safe_load(DEMO_FIXED_PROMPTS.read_text(encoding="utf-8"))
    except yaml.YAMLError:
        return {}
    if not isinstance(found, dict):
        return {}
    return {str(k): str(v) for k, v in found.items() if isinstance(v, str | int)}


@cached(absent=lambda: EMPTY_COLLECTED)
def collected(db: str) -> Collected:
    """The spans `engine collect` received into the run log, per service and per trace
    (dashboard.views.collected); empty before the file exists."""
    from engine.runlog.collected import collected_heads

    return collected_overview(collected_heads(db))
