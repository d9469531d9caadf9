"""Prompt history: the versions of one node's prompt over the run, as a timeline: each
step's proposal with its validation score, accepted, rejected or dropped from a kept
candidate whose gain did not need it (and why), the score of the edit alone where the
per-node gate or the pruning measured it, the examples that flipped after each
accepted edit, "What it changed" (the diff of that step against the one before: which
examples it flipped and which node's change explains each), and a before | after diff
(inline as an option)."""

import pandas as pd
import streamlit as st

from dashboard import data, diff_data, links
from dashboard.state import need_run, selection
from dashboard.views.text import fmt, md, plural
from dashboard.widgets.text import show_side_by_side, show_text
from engine.core.optimizer import PRUNED_REASON
from engine.data.stats import bracketed, score_interval
from engine.events import same_prompt
from engine.runlog.probing import chosen_updates

COPY_WORDS = ("copies", "copy", "training example", "leak")


def verdict(edit: dict) -> str:
    """accepted, rejected, unchanged, or dropped: an edit of the kept candidate that its
    gain did not need (engine/core/optimizer.py prune_edits)."""
    changed = not same_prompt(edit.get("old_prompt"), edit.get("new_prompt"))
    if edit.get("accepted"):
        return "accepted"
    reason = edit.get("reject_reason")
    if changed and isinstance(reason, str) and reason.startswith(PRUNED_REASON):
        return "dropped"
    return "rejected" if changed else "unchanged"


def candidate_label(edit: dict) -> str | None:
    """'2 of 2' for the second of a step's two candidate prompt sets (--proposals); None
    where the step wrote one."""
    of = int(edit.get("candidates") or 1)
    return f"{int(edit.get('candidate') or 0) + 1} of {of}" if of > 1 else None


def with_candidates(edits: pd.DataFrame) -> pd.DataFrame:
    """`edits` with `candidates`, how many candidate prompt sets each row's step wrote."""
    if edits.empty or "candidate" not in edits:
        return edits.assign(candidate=0, candidates=1)
    return edits.assign(candidates=edits.groupby("step")["candidate"].transform("max") + 1)


def blame_probed(edits: pd.DataFrame) -> list[bool]:
    """Per row of one node's `edits` (with `candidate`): whether it is the edit blame's
    edit probes run at its step. A step writes one row per candidate prompt set under
    --proposals, and blame tests one of them (engine.runlog.probing.chosen_updates: the kept
    candidate's, else the best-scored one that changed the prompt, else the first)."""
    picked = set()
    for step, rows in edits.groupby("step"):
        chosen = chosen_updates([{**r, "node_id": ""} for r in rows.to_dict("records")])
        picked.add((int(step), int(chosen[0].get("candidate") or 0)))
    return [(int(s), int(c or 0)) in picked for s, c in zip(edits["step"], edits["candidate"])]


def after_interval(score: float, val_n: int) -> str | None:
    """'[0.55, 0.88]': the 95% interval of a validation score on `val_n` examples (as
    `run`'s summary and Curves give it); None when not measured."""
    bounds = score_interval(None if pd.isna(score) else float(score), val_n)
    return bracketed(bounds) if bounds else None


def flip_counts(edits: pd.DataFrame, flips: pd.DataFrame, kind: str) -> list[int | None]:
    """Per row: how many examples the next step `kind` ('fixed' or 'broke') after the
    row's edit was accepted; None for an edit that was not (it never ran, and under
    --proposals the step's flips belong to the candidate that was kept)."""
    counts = flips[flips["flipped"] == kind].groupby("step").size() if not flips.empty \
        else pd.Series(dtype=int)
    return [int(counts.get(s, 0)) if bool(a) else None
            for s, a in zip(edits["step"], edits["accepted"].fillna(False))]


def timeline(edits: pd.DataFrame, flips: pd.DataFrame, probed: list[bool], val_n: int = 0
             ) -> pd.DataFrame:
    """The page's table; `probed` is blame_probed(edits)."""
    several = {"candidate": [candidate_label(e) for e in edits.to_dict("records")],
               "blame probes": ["this edit" if b else "" for b in probed]} \
        if (edits["candidates"] > 1).any() else {}
    return pd.DataFrame({
        "step": edits["step"], **several, "version": edits["version"],
        "verdict": [verdict(e) for e in edits.to_dict("records")],
        "validation before": edits["val_before"], "validation after": edits["val_after"],
        "after 95%": [after_interval(v, val_n) for v in edits["val_after"]],
        "edit alone": edits["val_alone"],
        "fixed after": flip_counts(edits, flips, "fixed"),
        "broke after": flip_counts(edits, flips, "broke"),
        "reason": edits["reject_reason"]})


def edit_card(sel, node: str, edit: dict, flips: pd.DataFrame, *, inline: bool, only: bool,
              val_n: int = 0, probed: bool = False) -> None:
    kind = verdict(edit)
    color = {"accepted": "green", "rejected": "red", "dropped": "orange"}.get(kind, "gray")
    label = candidate_label(edit)
    title = (f"step {edit['step']}{f' · candidate {label}' if label else ''} · {kind} · "
             f"validation {fmt(edit['val_before'])} → {fmt(edit['val_after'])}"
             + (f" on {plural(val_n, 'example')}" if val_n else ""))
    with st.expander(title, expanded=kind != "unchanged"):
        st.markdown(f":{color}-badge[{kind}]" + (
            f" · edit alone on validation: **{fmt(edit['val_alone'])}**"
            if pd.notna(edit.get("val_alone")) else "") + (
            " · of this step's candidates, the edit blame's edit probes run"
            if probed and label else ""))
        reason = edit.get("reject_reason")
        if isinstance(reason, str) and reason:
            caveat = any(w in reason.lower() for w in COPY_WORDS)
            (st.warning if caveat else st.info)(f"why: {reason}")
        show_side_by_side(edit.get("old_prompt") or "", edit.get("new_prompt") or "",
                          labels=("before", "after"), inline=inline, only_changes=only)
        show_text("reasoning", edit.get("reasoning"))
        mine = flips[flips["step"] == edit["step"]]
        if kind == "accepted":
            what_it_changed(sel, node, int(edit["step"]))
            later = int(edit["step"]) + 1  # the first step trained with the edit
            trained = later in set(data.steps(sel.db, sel.run)["step"])
            training = f"training at step {later}" if trained else \
                "no later step trained with it"
            if mine.empty:
                st.caption(f"No example changed pass/fail: validation in this step's gate, "
                           f"{training}.")
            else:
                st.caption("Examples that flipped with this edit: validation in this step's "
                           f"gate pass, against the validation before it; {training}"
                           + (", the first trained with it" if trained else "")
                           + " (edits of other nodes accepted at the same step share them):")
                st.dataframe(mine.rename(columns={
                    "split": "split", "example_id": "example", "score_before": "score before",
                    "score_after": "score after", "flipped": "flipped"}).drop(columns="step"),
                    hide_index=True)
                first = mine.iloc[0]["example_id"]
                shown = later if trained else int(edit["step"])  # a step that exists
                st.page_link("screens/examples.py", label=f"Open step {shown} in Examples, "
                             "flipped only", icon=":material/table:",
                             query_params={**sel.link(step=shown, example=first),
                                           "flipped": "1"})


def what_it_changed(sel, node: str, step: int) -> None:
    """The diff of this step against the one before (python -m engine diff RUN --step-a
    S): which validation examples the accepted prompts changed, and which node's change
    explains each. Verdicts are read back from the run log."""
    if step < 1:
        return
    clicked = st.button("What it changed", key=f"changed_{node}_{step}",
                        icon=":material/difference:",
                        help=f"diff the prompts after step {step} against those after step "
                             f"{step - 1} on validation: patch each changed node's output "
                             "into the older run and see which change flips each example")
    if clicked:
        with st.spinner("patching the new outputs into the previous step…"):
            try:
                report = diff_data.run_diff(sel.db, sel.run, step, sel.run, step - 1, "val",
                                            "differing")
            except ValueError as exc:
                st.error(f"error: {exc}")
                return
        st.caption(f"diff: {plural(report.calls, 'call')} ({report.model_calls} to the model), "
                   f"{report.tokens:,} tokens, {report.seconds:.1f} s")
    rows = diff_data.latest_diff(sel.db, sel.run, step, sel.run, step - 1)
    if rows.empty:
        return
    changed = rows[[abs((a or 0) - (b or 0)) > 1e-9 for a, b in
                    zip(rows["score_a"], rows["score_b"])]]
    st.caption(f"What it changed: {len(changed)} of {len(rows)} validation examples score "
               f"differently after step {step} than after step {step - 1}.")
    if not changed.empty:
        st.dataframe(pd.DataFrame({
            "example": changed["example_id"], f"after step {step - 1}": changed["score_b"],
            f"after step {step}": changed["score_a"],
            "changed nodes": [", ".join(x or []) for x in changed["sources"]],
            "explained by": [", ".join(x) if x else "not explained within the bound"
                             for x in changed["explained_by"]]}), hide_index=True,
            key=f"changed_table_{node}_{step}")


sel = selection()
graph = need_run(sel)
node = sel.node or graph.model.output
st.title(f"Prompt history · {node}")
history = data.node_history(sel.db, sel.run, node)
edits, flips = with_candidates(history["edits"]), history["flips"]
prompts = data.prompt_history(sel.db, sel.run)
versions = prompts[prompts["node_id"] == node]
accepted_edits = int(sum(edits["accepted"].fillna(False)))
# versions logged: the starting prompt, each proposal (kept or not) and prompts set by
# hand (a fork's start): said apart, so that "2 versions, 0 accepted" does not puzzle
hand_set = max(int(((versions["accepted"].fillna(False).astype(bool))
                    & (versions["version"] > 0)).sum()) - accepted_edits, 0)
st.caption(f"run **{md(sel.run)}** · {plural(len(versions), 'prompt version')}: the starting "
           f"prompt, {plural(len(edits), 'proposal')} ({accepted_edits} accepted)"
           + (f", {plural(hand_set, 'prompt')} set by hand" if hand_set else ""))
if edits.empty:
    st.info(f"No update was proposed for node {node} in this run (it is not trainable, or "
            "no step back-propagated to it yet).")
    show_text("prompt", dict(graph.prompts).get(node), expanded=True)
    st.stop()
val_n = data.split_sizes(sel.db, sel.run).get("val", 0)
probed = blame_probed(edits)
st.dataframe(timeline(edits, flips, probed, val_n), hide_index=True, column_config={
    "validation before": st.column_config.NumberColumn(format="%.3f"),
    "validation after": st.column_config.NumberColumn(format="%.3f"),
    "after 95%": st.column_config.TextColumn(
        help=f"95% interval of the validation score after, on {plural(val_n, 'example')}"),
    "edit alone": st.column_config.NumberColumn(
        format="%.3f", help="validation score with only this node's edit applied"),
    "verdict": st.column_config.TextColumn(
        help="dropped: an edit of the step's kept candidate that the gain did not need "
             "(validation scored as well without it); the reason says by how much"),
    "blame probes": st.column_config.TextColumn(
        help="of a step's candidate prompt sets, the one whose edit of this node blame's "
             "edit probes run: the kept candidate's, else the best-scored that changed it")})
c1, c2 = st.columns(2)
links.page_option("inline", False, [True, False], cast=links.flag)
inline = c1.toggle("inline diff", key="inline", help="one column instead of before | after")
links.page_option("only", False, [True, False], cast=links.flag)
only = c2.toggle("show only what changed", key="only")
for edit, tested in reversed(list(zip(edits.to_dict("records"), probed))):
    edit_card(sel, node, edit, flips, inline=inline, only=only, val_n=val_n, probed=tested)
