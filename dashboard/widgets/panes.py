"""Panes showing what happened at one node for one example at one step, reused by the
node inspector, Step through and the Learn tour."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard.views.panes import first_row, number_of
from dashboard.views.text import fmt, md
from dashboard.widgets.quality import mark
from dashboard.widgets.text import show_diff, show_messages, show_text
from engine.events import same_prompt


def call_metrics(row: dict) -> None:
    """Tokens, latency, cost and cache hit of one call."""
    c1, c2, c3, c4, c5 = st.columns(5)
    c1.metric("prompt tokens", fmt(row.get("prompt_tokens"), ".0f"))
    c2.metric("completion tokens", fmt(row.get("completion_tokens"), ".0f"))
    waited = row.get("queued_ms")
    waited = 0.0 if waited is None or pd.isna(waited) else float(waited)
    latency = row.get("latency_ms")
    hit = row.get("cache_hit")
    if hit is not None and not pd.isna(hit) and hit:  # no model time to show, not "0 ms"
        c3.metric("latency", "cached", help="answered from the run's reply cache (or, for an "
                  "import, from the recorded trace): the model was not called")
    else:
        c3.metric("latency", f"{fmt(None if latency is None else latency - waited, ',.0f')} ms",
                  help="the model's time on the call"
                       + (f"; it waited {waited:,.0f} ms for a turn before (the run's "
                          "concurrency limit, the model's slots)" if round(waited) else ""))
    c4.metric("cost", f"${fmt(row.get('cost_usd'), '.5f')}")
    c5.metric("cache hit", "–" if hit is None or pd.isna(hit) else ("yes" if hit else "no"))



def forward_pane(view: dict[str, pd.DataFrame], *, messages: bool = True) -> None:
    """The node's prompt version, its inputs (and the exact messages sent), its output."""
    act = first_row(view["activation"])
    if act is None:
        st.info("This node did not run on this example at this step.")
        return
    st.markdown(f"**Prompt, version {int(act['prompt_version'])}**")
    show_text("prompt", act.get("prompt") or "(function node: no prompt)")
    show_text("inputs", act.get("input_text"))
    if messages:
        show_messages("input messages as sent", act.get("messages"))
    if act.get("error"):
        st.error(f"error: {act['error']}")
    show_text("output", act.get("output_text"), expanded=True)
    if act.get("parse_error"):
        st.warning(f"parse: {act['parse_error']}")
        show_text("raw reply", act.get("raw_text"))



def loss_pane(loss: pd.DataFrame, metric: str = "") -> None:
    row = first_row(loss)
    if row is None:
        st.info("No loss was recorded for this example at this step.")
        return
    c1, c2 = st.columns(2)
    c1.metric("score", fmt(row.get("score"), ".2f"))
    c2.metric("split", str(row.get("split")))
    if metric:
        st.caption(f"metric: {md(metric)}")
    left, right = st.columns(2)
    with left:
        show_text("prediction (the output node's output)", row.get("prediction"))
    with right:
        show_text("target", row.get("target"))
    if row.get("error"):
        st.error(f"error: {row['error']}")
    show_text("output gradient (feedback the loss sends to the output node)",
              row.get("feedback"), expanded=True)



def gradients_received(view: dict[str, pd.DataFrame], *, expanded: bool = False) -> int:
    """Each successor's message (a gradient; for gtbp a target) with the exact backward
    prompt that produced it; returns how many were shown."""
    received = view["received"]
    grads = received[received["kind"].isin(["gradient", "target"])]
    for row in grads.to_dict("records"):
        source, what = row["from_node_id"], ("Target" if row["kind"] == "target"
                                             else "Gradient")
        with st.container(border=True):
            title = ("from the loss (output gradient)" if source == "loss"
                     else f"from successor {md(source)}")
            st.markdown(f"**{what} {title}** · method {md(row.get('method') or '')}")
            show_text(what.lower(), row["content"], expanded=True)
            if what == "Gradient" and source != "loss":
                mark(row["content"], row.get("messages"))
            if isinstance(row.get("parse_error"), str) and row["parse_error"]:
                st.warning(f"parse: {row['parse_error']}")
            if isinstance(row.get("messages"), str):
                show_messages(f"backward prompt sent by {source} (its inputs, siblings "
                              "included)", row["messages"], expanded=expanded)
                show_text("backward reply", row.get("response"))
            elif source != "loss":
                st.caption("passed on unchanged (no backward call)")
    return len(grads)



def aggregate_pane(view: dict[str, pd.DataFrame]) -> None:
    received = view["received"]
    agg = received[received["kind"] == "aggregate"]
    if agg.empty:
        st.caption("No aggregated gradient: this example was not back-propagated at this step.")
        return
    show_text("aggregated gradient (what the update acts on)", agg.iloc[0]["content"],
              expanded=True)



def gtbp_pane(view: dict[str, pd.DataFrame]) -> None:
    """gtbp: the target the node acted on beside its actual output (and as a diff), and
    the inferred input: what would have made the node produce its target."""
    received = view["received"]
    targets = received[received["kind"] == "target"]
    inferred = received[received["kind"] == "inferred_input"]
    if targets.empty and inferred.empty:
        return
    st.subheader("Target and inferred input (gtbp)")
    act = first_row(view["activation"]) or {}
    aggregate = received[received["kind"] == "aggregate"]
    target = (aggregate if not aggregate.empty else targets).iloc[0]["content"] \
        if not (aggregate.empty and targets.empty) else None
    if target is not None:
        left, right = st.columns(2)
        with left:
            show_text("target output", target, expanded=True)
        with right:
            show_text("actual output", act.get("output_text"), expanded=True)
        st.caption("actual → target, word by word")
        show_diff(act.get("output_text") or "", target or "")
    for row in inferred.to_dict("records"):
        show_text("inferred input (what would have produced the target)", row["content"],
                  expanded=True)
        if isinstance(row.get("messages"), str):
            show_messages("the call that inferred it", row["messages"])



def sent_pane(view: dict[str, pd.DataFrame]) -> None:
    sent = view["sent"]
    if sent.empty:
        st.caption("This node sent no gradient (it has no LLM-produced inputs, or it "
                   "received no feedback).")
        return
    for row in sent.to_dict("records"):
        with st.container(border=True):
            st.markdown(f"**to {md(row['node_id'])}** ({md(row['kind'])})")
            show_text("gradient", row["content"], expanded=True)
    first = sent.iloc[0]
    if isinstance(first.get("messages"), str):
        show_messages("the backward prompt (one joint call for all predecessors)",
                      first["messages"])
        show_text("backward reply", first.get("response"))



def update_pane(update: dict, *, node: str | None = None, show_call: bool = True,
                copies: list[str] | None = None, candidates: int = 1) -> None:
    """The proposed edit as a word-level diff, its fate and the validation scores;
    `copies`: the training examples it pastes into the prompt (a caveat is shown);
    `candidates`: how many candidate sets the step wrote (each pane then names its own)."""
    changed = not same_prompt(update.get("old_prompt"), update.get("new_prompt"))
    verdict = ("accepted" if update.get("accepted") else
               "rejected by the validation gate" if changed else "no change proposed")
    color = "green" if update.get("accepted") else ("red" if changed else "gray")
    candidate = update.get("candidate")
    candidate = 0 if candidate is None or pd.isna(candidate) else int(candidate)
    st.markdown(f":{color}-badge[{verdict}]" + (f" · node **{md(node)}**" if node else "")
                + (f" · candidate {candidate + 1} of {candidates}" if candidates > 1 else ""))
    if copies:
        st.warning("Caveat: this proposal copies training examples into the prompt, so "
                   "its validation gain may come from memorised cases rather than a better "
                   "instruction: " + "; ".join(f"“{md(c[:80])}”" for c in copies[:3]),
                   icon=":material/content_copy:")
    before, after = number_of(update.get("val_before")), number_of(update.get("val_after"))
    alone = number_of(update.get("val_alone"))
    c1, c2, c3 = st.columns(3)
    c1.metric("validation before", fmt(before))
    c2.metric("validation after (all edits of the step)", fmt(after),
              delta=None if before is None or after is None else round(after - before, 3),
              help="The joint gate: every changed prompt of the step together")
    c3.metric("validation with this edit alone", fmt(alone),
              delta=None if before is None or alone is None else round(alone - before, 3),
              help="The per-node gate: this node's edit with every other prompt as it was "
              "(updates.val_alone; – when not measured)")
    reason = update.get("reject_reason")
    if isinstance(reason, str) and reason:
        st.caption(f"gate: {md(reason)}")
    # one pane per proposal: the run and the verdict too (the Learn tour's gate stage can
    # show an accepted and a rejected proposal of the same node and step, from two runs)
    only = st.toggle("show only what changed", key=f"only_{update.get('run_id')}_{node}_"
                     f"{update.get('step')}_{verdict.split()[0]}_{candidate}")
    show_diff(update.get("old_prompt") or "", update.get("new_prompt") or "", only_changes=only)
    if update.get("parse_error") and not pd.isna(update["parse_error"]):
        st.caption(f"note: {update['parse_error']}")
    show_text("reasoning", update.get("reasoning"))
    if show_call and isinstance(update.get("messages"), str):
        show_messages("update prompt", update["messages"])
