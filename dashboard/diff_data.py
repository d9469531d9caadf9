"""Cached reads of run diffs (engine/probes/diff.py) for the Compare and Prompt history
pages, and the call that runs one: the same stamp-keyed caching as `dashboard.data`
(pages write no SQL)."""

from __future__ import annotations

import asyncio
import json

import pandas as pd
import streamlit as st

from dashboard.data import CACHE_OPTIONS, Stamp, stamp
from engine.probes.diff import DiffReport, LoggedComparison, compare_logged, diff
from engine.runlog import diffs


@st.cache_data(**CACHE_OPTIONS)
def _latest(db: str, run_a: str, step_a: int, run_b: str, step_b: int, version: Stamp
            ) -> pd.DataFrame:
    rows = diffs.diff_rows(db, run_a, run_b)
    rows = rows[(rows["step_a"] == step_a) & (rows["step_b"] == step_b)]
    # per example, its newest verdict (a later diff of one example supersedes it)
    rows = rows.sort_values("created_at", ascending=False).drop_duplicates("example_id")
    for column in ("sources", "explained_by"):
        rows[column] = [json.loads(v) if isinstance(v, str) else None for v in rows[column]]
    return rows.reset_index(drop=True)


def latest_diff(db: str, run_a: str, step_a: int, run_b: str, step_b: int) -> pd.DataFrame:
    """The newest logged verdict per example of diffs of A (after step_a) against B (after
    step_b): scores, source changes, explaining set (None: not explained), patched score."""
    return _latest(db, run_a, int(step_a), run_b, int(step_b), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _comparison(db: str, run_a: str, step_a: int, run_b: str, step_b: int, example: str,
                version: Stamp) -> LoggedComparison | None:
    return compare_logged(db, run_a, step_a, run_b, step_b, example)


def comparison(db: str, run_a: str, step_a: int, run_b: str, step_b: int, example: str
               ) -> LoggedComparison | None:
    """One example's two logged traces with each node's change (no model call)."""
    return _comparison(db, run_a, int(step_a), run_b, int(step_b), example, stamp(db))


def run_diff(db: str, run_a: str, step_a: int, run_b: str, step_b: int, split: str,
             examples: str) -> DiffReport:
    """Run the diff now (through the runs' client and cache); its rows go to the log."""
    return asyncio.run(diff(db, run_a, run_b, step_a=int(step_a), step_b=int(step_b),
                            split=split, examples=examples))
