"""The selected run's panel on the Runs page: its test score, notes and tags (stored in
the run log through engine.runlog.writer.set_notes, the dashboard's one write), and
export as JSON, Parquet (a zip of one file per table) or OpenTelemetry JSON lines."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard import data
from dashboard.views.run_panel import COST_LABELS, FORMATS, deferred_export, file_stem, tags_of
from dashboard.views.text import fmt, md
from engine.runlog.writer import set_notes
from engine.runs.settings import forward_mode


def run_panel(db: str, run_id: str) -> None:
    record = data.run(db, run_id) or {}
    test = data.test_scores(db).get(run_id)
    st.subheader(f"Run {run_id}", divider="gray")
    parent = record.get("parent_run_id")
    config = json.loads(record.get("config") or "{}")
    st.caption(f"test score **{fmt(test)}**" + (
        f" · forked from **{md(parent)}** at step {record.get('fork_step')}"
        if isinstance(parent, str) else "")
        + f" · {md(forward_mode(config, record.get('graph_yaml') or ''))}")
    notes_col, export_col = st.columns([3, 2])
    with notes_col, st.form(f"notes_{run_id}", border=False):
        notes = st.text_area("Notes", value=record.get("notes") or "", height=90)
        tags = st.text_input("Tags (comma-separated)", value=", ".join(tags_of(record)))
        if st.form_submit_button("Save notes and tags"):
            try:
                set_notes(db, run_id, notes, tags.split(","))
                st.toast("Saved notes and tags")
                st.rerun()
            except Exception as exc:  # noqa: BLE001 - a locked or unreadable file: one line
                st.error(f"Could not save: {exc}")
    with export_col:
        label = st.radio("Export", list(FORMATS), key="export_format")
        suffix, mime = FORMATS[label][1], FORMATS[label][2]
        st.download_button(f"Download {label}", data=deferred_export(db, run_id, label),
                           file_name=f"{file_stem(run_id)}{suffix}", mime=mime,
                           icon=":material/download:", key="export_download")
    cost_table(db, run_id)



def cost_table(db: str, run_id: str) -> None:
    """Tokens and cost per step and phase: what the model calls spent, the run log's cache
    hits apart."""
    costs = data.step_phase_costs(db, run_id)
    if costs.empty:
        return
    # the headline is the run's own, as the Runs table counts it (reader.OWN); the probes
    # and diffs made on it later keep their rows (phases probe, diff) and are said apart
    own = costs[~costs["phase"].isin(["probe", "diff"])]
    spent, hits = int(own["model_calls"].sum()), int(own["cache_hits"].sum())
    total = own["cost_usd"].sum(min_count=1)
    later = int(costs["model_calls"].sum()) - spent
    st.markdown(f"**Cost**: {spent:,} model calls, {int(own['tokens'].sum()):,} tokens, "
                f"{'unknown price' if pd.isna(total) else f'${total:.4f}'}; "
                f"{hits:,} cache hits (free)"
                + (f"; probes and diffs made on the run later: {later:,} model calls"
                   if later else ""))
    st.dataframe(costs.rename(columns=COST_LABELS), hide_index=True, key="cost_table",
                 column_config={"cost (USD)": st.column_config.NumberColumn(format="$%.4f")})
