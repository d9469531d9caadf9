"""Curves: train and validation score per step with accepted edits marked; calls, tokens
and cost per node and per phase (forward, loss, backward, update)."""

import streamlit as st

from dashboard import data
from dashboard.state import need_run, selection
from dashboard.views.figures import score_curves, usage_by, usage_by_phase
from dashboard.views.text import fmt, md

TOTAL_LABELS = {"node_id": "node", "purpose": "phase", "prompt_tokens": "tokens in",
                "completion_tokens": "tokens out", "cost_usd": "cost (USD)",
                "cache_hits": "cache hits", "mean_latency_ms": "mean latency (ms)",
                "mean_wait_ms": "mean wait for a turn (ms)"}

sel = selection()
need_run(sel)
st.title("Curves")
st.caption(f"run **{md(sel.run)}**")
steps = data.steps(sel.db, sel.run)
if steps.empty:
    st.info("No step written yet.")
    st.stop()
best = steps["val_score"].max()
accepted = int(steps["accepted"].fillna(False).astype(bool).sum())
c1, c2, c3, c4, c5 = st.columns(5)
c1.metric("steps", int(steps["step"].max()))
c2.metric("initial validation", fmt(steps["val_score"].iloc[0]))
c3.metric("best validation", fmt(best))
c4.metric("test (final prompts)", fmt(data.test_scores(sel.db).get(sel.run)),
          help="the test split, scored once with the final prompts; – when the run had no "
               "test examples")
c5.metric("steps with an accepted edit", accepted)
val_n = data.split_sizes(sel.db, sel.run).get("val", 0)
first, top = (data.Score(steps["val_score"].iloc[0], val_n),
              data.Score(best, val_n))
if val_n:
    st.caption(f"Validation: initial {first.text()}; best {top.text()}. The bars on the "
               "validation line are each step's 95% interval; where two steps' bars overlap, "
               "these examples do not tell their scores apart.")
st.plotly_chart(score_curves(steps, val_n=val_n), key="score_curves")
st.caption("Each point sits at the prompts it scored. A step scores the training examples at "
           "its start, before its update, so step k's train score is drawn at step k − 1 and "
           "the prompts the last step kept have no train point; validation is scored on the "
           "prompts each step kept.")

totals = data.token_totals(sel.db, sel.run)
if totals.empty:
    st.caption("No LLM call logged yet.")
    st.stop()
measure = st.segmented_control("Measure", ["calls", "tokens", "cost_usd"], default="tokens",
                               format_func={"calls": "calls", "tokens": "tokens",
                                            "cost_usd": "cost (USD)"}.get, key="curves_measure")
measure = measure or "tokens"
st.caption("Model calls (cache misses) and their tokens, as the Runs table counts them; "
           "cache hits are free and counted apart (table below). Probes and diffs made on the "
           "run later are phases of their own here and the Runs table's probe calls.")
left, right = st.columns(2)
with left:
    st.plotly_chart(usage_by(totals, "node_id", measure), key="usage_node")
with right:
    st.plotly_chart(usage_by(data.step_totals(sel.db, sel.run), "step", measure),
                    key="usage_step")
st.plotly_chart(usage_by_phase(totals), key="usage_phase")
with st.expander("Calls, tokens and cost per node and phase (table)"):
    shown = totals.round({"mean_latency_ms": 0, "mean_wait_ms": 0})
    st.dataframe(shown.rename(columns=TOTAL_LABELS), hide_index=True)
    st.caption("Latency is the model's time on a call; the wait for a turn (the run's "
               "concurrency limit, the embedded model's slots, its server's start) and the "
               "pauses between retries are apart: with many calls in flight the wait can be "
               "most of a call's wall time.")
