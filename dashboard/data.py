"""Cached access to the run log for the pages (pages write no SQL).

Every cached function takes the database path, the run, and the run log's stamp (mtime
and size of the database and its WAL; a lake's newest snapshot id) as arguments, never a
connection: a new write changes the stamp, so a live run is re-read, and an unchanged log
is served from memory. The reader underneath opens short-lived read-only connections that
retry while the engine holds the write lock (a lake has no lock: each commit is a
snapshot).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

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


@st.cache_data(**CACHE_OPTIONS)
def _runs(db: str, version: Stamp) -> pd.DataFrame:
    return reader.list_runs(db)


def runs(db: str) -> pd.DataFrame:
    """One row per run (see reader.list_runs); empty when the file does not exist yet."""
    if not exists(db):
        return pd.DataFrame(columns=["run_id", "graph_name", "method", "status"])
    return _runs(db, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _run(db: str, run_id: str, version: Stamp) -> dict | None:
    return reader.run_record(db, run_id)


def run(db: str, run_id: str) -> dict | None:
    return _run(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _graph(db: str, run_id: str, version: Stamp) -> RunGraph | None:
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


def graph(db: str, run_id: str) -> RunGraph | None:
    """The run's graph as logged when it started (not the file on disk today)."""
    return _graph(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _steps(db: str, run_id: str, version: Stamp) -> pd.DataFrame:
    return reader.step_table(db, run_id)


def steps(db: str, run_id: str) -> pd.DataFrame:
    return _steps(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _split_sizes(db: str, run_id: str, version: Stamp) -> dict[str, int]:
    return reader.split_sizes(db, run_id)


def split_sizes(db: str, run_id: str) -> dict[str, int]:
    """Examples per split of a run (see reader.split_sizes)."""
    return _split_sizes(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _step_examples(db: str, run_id: str, step: int, version: Stamp) -> pd.DataFrame:
    return reader.step_examples(db, run_id, step)


def step_examples(db: str, run_id: str, step: int) -> pd.DataFrame:
    return _step_examples(db, run_id, int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _node_stats(db: str, run_id: str, step: int, version: Stamp) -> pd.DataFrame:
    return reader.node_step_stats(db, run_id, step)


def node_stats(db: str, run_id: str, step: int) -> pd.DataFrame:
    return _node_stats(db, run_id, int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _flows(db: str, run_id: str, step: int, example_id: str | None, version: Stamp
           ) -> pd.DataFrame:
    return reader.gradient_flows(db, run_id, step, example_id)


def flows(db: str, run_id: str, step: int, example_id: str | None = None) -> pd.DataFrame:
    return _flows(db, run_id, int(step), example_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _node_view(db: str, run_id: str, step: int, example_id: str, node_id: str,
               version: Stamp) -> dict[str, pd.DataFrame]:
    return reader.node_view(db, run_id, step, example_id, node_id)


def node_view(db: str, run_id: str, step: int, example_id: str, node_id: str
              ) -> dict[str, pd.DataFrame]:
    return _node_view(db, run_id, int(step), example_id, node_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _example_trace(db: str, run_id: str, step: int, example_id: str, version: Stamp
                   ) -> dict[str, pd.DataFrame]:
    return reader.example_trace(db, run_id, step, example_id)


def example_trace(db: str, run_id: str, step: int, example_id: str) -> dict[str, pd.DataFrame]:
    return _example_trace(db, run_id, int(step), example_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _updates(db: str, run_id: str, step: int | None, version: Stamp) -> pd.DataFrame:
    return reader.step_updates(db, run_id, step)


def updates(db: str, run_id: str, step: int | None = None) -> pd.DataFrame:
    return _updates(db, run_id, None if step is None else int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _prompt_history(db: str, run_id: str, version: Stamp) -> pd.DataFrame:
    return reader.prompt_history(db, run_id)


def prompt_history(db: str, run_id: str) -> pd.DataFrame:
    return _prompt_history(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _paired_gradients(db: str, run_a: str, run_b: str, step: int, node_id: str,
                      version: Stamp) -> pd.DataFrame:
    return reader.paired_gradients(db, run_a, run_b, step, node_id)


def paired_gradients(db: str, run_a: str, run_b: str, step: int, node_id: str
                     ) -> pd.DataFrame:
    """One node's gradients in two runs, example by example (reader.paired_gradients)."""
    return _paired_gradients(db, run_a, run_b, int(step), node_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _example_gradients(db: str, run_id: str, step: int, example_id: str, version: Stamp
                       ) -> pd.DataFrame:
    return reader.example_gradients(db, run_id, step, example_id)


def example_gradients(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return _example_gradients(db, run_id, int(step), example_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _token_totals(db: str, run_id: str, version: Stamp) -> pd.DataFrame:
    return reader.token_totals(db, run_id)


def token_totals(db: str, run_id: str) -> pd.DataFrame:
    return _token_totals(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _step_phase_costs(db: str, run_id: str, version: Stamp) -> pd.DataFrame:
    return reader.step_phase_costs(db, run_id)


def step_phase_costs(db: str, run_id: str) -> pd.DataFrame:
    return _step_phase_costs(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _step_totals(db: str, run_id: str, version: Stamp) -> pd.DataFrame:
    return reader.step_totals(db, run_id)


def step_totals(db: str, run_id: str) -> pd.DataFrame:
    return _step_totals(db, run_id, stamp(db))


# --- debugging views: examples, traces, prompt history, per-example compare -------------


@st.cache_data(**CACHE_OPTIONS)
def _example_rows(db: str, run_id: str, step: int, options: tuple, version: Stamp
                  ) -> pd.DataFrame:
    return debug.example_rows(db, run_id, step, **dict(options))


def example_rows(db: str, run_id: str, step: int, **options) -> pd.DataFrame:
    """One page of the step's examples table (see debug.example_rows for the options)."""
    return _example_rows(db, run_id, int(step), tuple(sorted(options.items())), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _example_calls(db: str, run_id: str, step: int, example_id: str, version: Stamp
                   ) -> pd.DataFrame:
    return debug.example_calls(db, run_id, step, example_id)


def example_calls(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return _example_calls(db, run_id, int(step), example_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _node_history(db: str, run_id: str, node_id: str, version: Stamp
                  ) -> dict[str, pd.DataFrame]:
    return debug.node_history(db, run_id, node_id)


def node_history(db: str, run_id: str, node_id: str) -> dict[str, pd.DataFrame]:
    return _node_history(db, run_id, node_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _compare_rows(db: str, a: str, b: str, step_a: int, step_b: int, version: Stamp
                  ) -> pd.DataFrame:
    return debug.compare_rows(db, a, b, step_a, step_b)


def compare_rows(db: str, a: str, b: str, step_a: int, step_b: int, metric: str = "auto"
                 ) -> pd.DataFrame:
    """The shared examples with each side's graded answer (`answer_a`, `answer_b`):
    `disagree` when the graded answers or the scores differ, `raw_differs` when only the
    raw text does (`Yes.` against `Yes.\n</output>` is no disagreement)."""
    rows = _compare_rows(db, a, b, int(step_a), int(step_b), stamp(db)).copy()
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


@st.cache_data(**CACHE_OPTIONS)
def _backpropagated_steps(db: str, run_id: str, version: Stamp) -> list[int]:
    return debug.backpropagated_steps(db, run_id)


def backpropagated_steps(db: str, run_id: str) -> list[int]:
    """Steps at which the run back-propagated (sent gradients or targets)."""
    return _backpropagated_steps(db, run_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _backward_calls(db: str, run_id: str, step: int, example_id: str, version: Stamp
                    ) -> pd.DataFrame:
    return debug.backward_calls(db, run_id, step, example_id)


def backward_calls(db: str, run_id: str, step: int, example_id: str) -> pd.DataFrame:
    return _backward_calls(db, run_id, int(step), example_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _test_scores(db: str, version: Stamp) -> dict[str, float]:
    frame = debug.test_scores(db)
    return dict(zip(frame["run_id"], frame["test_score"]))


@st.cache_data(**CACHE_OPTIONS)
def _forks(db: str, run_id: str, version: Stamp) -> list[str]:
    return debug.forks(db, run_id)


def forks(db: str, run_id: str) -> list[str]:
    """Runs forked from `run_id`, newest first."""
    return _forks(db, run_id, stamp(db))


def test_scores(db: str) -> dict[str, float]:
    """run id -> test-split score, for the runs that evaluated one."""
    return _test_scores(db, stamp(db)) if exists(db) else {}


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


@st.cache_data(**CACHE_OPTIONS)
def _collected(db: str, version: Stamp) -> Collected:
    from engine.runlog.collected import collected_heads

    return collected_overview(collected_heads(db))


def collected(db: str) -> Collected:
    """The spans `engine collect` received into the run log, per service and per trace
    (dashboard.views.collected); empty before the file exists."""
    if not exists(db):
        return EMPTY_COLLECTED
    return _collected(db, stamp(db))
