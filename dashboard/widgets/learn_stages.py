"""The Learn tour's text and its data-driven stages: every sentence that names a node, a
target or a score is computed from the run it shows, so the text cannot contradict the
data beside it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, jobs, probe_data
from dashboard.state import Selection
from dashboard.views.blame import interval_text, unprobed_edit
from dashboard.views.learn_stages import (
    EDIT_COLUMN,
    FIX_SLOT,
    PAIR_SLOT,
    fix_node,
    gradient_row,
    llm_siblings,
    node_names,
    not_probed_here,
    pair_hint,
    pair_order,
    paired_runs,
    proposals_of,
)
from dashboard.views.text import code, fmt, md, plural
from dashboard.views.whatif import flip_label, prompt_after
from dashboard.widgets import job_watch
from dashboard.widgets.blame import blame_button, show_verdict
from dashboard.widgets.panes import update_pane
from dashboard.widgets.quality import mark
from dashboard.widgets.text import show_messages, show_text
from dashboard.widgets.validation import fork_validation


def _start_pair_buttons(tour: Selection, graph: data.RunGraph, node: str,
                        have: set[str]) -> None:
    """A button per sibling-blind method without a paired run yet, the one that can show a
    difference first; a started run is followed live until it ends."""
    listed = job_watch.follow(f"{PAIR_SLOT}|{tour.run}")
    if any(job.returncode is None for job in listed):
        return
    for rank, method in enumerate(m for m in pair_order(graph, node) if m not in have):
        hint = pair_hint(graph, node, method)
        if st.button(f"Start the paired run ({method}){hint}", key=f"learn_pair_{method}",
                     type="primary" if rank == 0 else "secondary"):
            record = data.run(tour.db, tour.run) or {}
            job = jobs.start(jobs.RunSpec(
                graph=str(jobs.DEMO_GRAPH), db=tour.db, method=method,
                seed=int(record.get("seed") or 0), **jobs.DEMO_OPTIONS))
            job_watch.remember(f"{PAIR_SLOT}|{tour.run}", job)
            st.rerun()



def _side_by_side(pair: tuple[tuple[dict | None, str], tuple[dict | None, str]]) -> None:
    """Two gradients in two columns, each with the backward prompt that wrote it."""
    for column, (row, label) in zip(st.columns(2), pair):
        with column:
            if row is None:
                st.caption(f"{label}: this run did not back-propagate this example at this "
                           "step.")
                continue
            show_text(f"gradient {label}", row["content"], expanded=True)
            mark(row["content"], row.get("messages"))
            show_messages(f"backward prompt {label}", row.get("messages"))



def contrast_in_run(tour: Selection, node: str, output: str) -> bool:
    """The run wrote a sibling-blind method's gradients beside its own (`contrast:`): show
    both for the tour's example from this one run; False when it wrote none here."""
    theirs = gradient_row(tour.db, tour.run, tour.step, tour.example, node, "contrast")
    if theirs is None:
        return False
    mine = gradient_row(tour.db, tour.run, tour.step, tour.example, node)
    method = (data.run(tour.db, tour.run) or {}).get("method", "semantic")
    st.markdown(f"What {code(node)} received from {code(output)} on example "
                f"{code(tour.example)} at step {tour.step}, from the same forward pass and "
                f"the same feedback: left with its siblings ({code(method)}, the gradient "
                f"the update used), right without ({code(theirs['method'])}, written beside "
                "it for this comparison only). No second run: this run made both calls.")
    _side_by_side(((mine, "with siblings"), (theirs, "without siblings")))
    if mine and str(mine.get("content") or "").strip() == str(theirs.get("content") or
                                                               "").strip():
        st.info("Here the two messages are the same: the siblings changed nothing on this "
                "example. Pick another failing example in the sidebar.")
    return True



def without_siblings(tour: Selection, graph: data.RunGraph) -> None:
    """The same node's gradient on the same example, with and without its siblings."""
    model = graph.model
    receivers = [i for i in dict(model.inputs).get(model.output, ()) if i in model.order]
    if not receivers or not tour.example:
        st.caption("This graph has no node with siblings.")
        return
    node = receivers[0]
    if contrast_in_run(tour, node, model.output):
        return
    pairs = paired_runs(tour.db, tour)
    order = pair_order(graph, node)
    if pairs.empty:
        st.info(f"No sibling-blind run of this graph with the same seed yet. Start one: the "
                f"same demo with method `{order[0]}` (or `{order[1]}`) and the same seed, so "
                "the same failing examples are back-propagated."
                + (f" Here {code(node)} has no LLM-produced sibling, so `semantic-nosibling`"
                   " would send the same backward prompt: `textgrad` is the comparison "
                   "that can show a difference." if not llm_siblings(graph, node) else ""))
        _start_pair_buttons(tour, graph, node, set())
        return
    pairs = pairs.assign(rank=[order.index(m) for m in pairs["method"]]).sort_values(
        ["rank", "run_id"], kind="stable")
    choice = st.radio("Sibling-blind run", list(pairs["run_id"]), horizontal=True,
                      key="learn_pair_run", format_func=lambda r: f"{r} ("
                      f"{pairs.loc[pairs['run_id'] == r, 'method'].iloc[0]})")
    pair = pairs[pairs["run_id"] == choice].iloc[0]
    method = (data.run(tour.db, tour.run) or {}).get("method", "semantic")
    mine = gradient_row(tour.db, tour.run, tour.step, tour.example, node)
    theirs = gradient_row(tour.db, pair["run_id"], tour.step, tour.example, node)
    st.markdown(f"What {code(node)} received from {code(model.output)} on example "
                f"{code(tour.example)} at step {tour.step}: left with its siblings "
                f"({code(method)}, run {md(tour.run)}), right without "
                f"({code(pair['method'])}, run {md(pair['run_id'])}).")
    _side_by_side(((mine, "with siblings"), (theirs, "without siblings")))
    compared = data.paired_gradients(tour.db, tour.run, pair["run_id"], tour.step, node)
    if not compared.empty:
        n = len(compared)
        st.markdown(
            f"Across the {plural(n, 'example')} both runs back-propagated to {code(node)} at "
            f"step {tour.step}, the backward prompts differ on "
            f"{int(compared['prompts_differ'].sum())} of {n} and the gradients on "
            f"{int(compared['gradients_differ'].sum())} of {n}.")
    if mine and theirs and mine.get("messages") == theirs.get("messages"):
        siblings = [i for i in dict(model.inputs).get(model.output, ()) if i != node]
        llm = [i for i in siblings if i in model.order]
        why = (f"{code(node)}'s siblings here are only example fields ({node_names(siblings)}), "
               "which both methods show" if siblings and not llm else
               "the method sent the same context")
        st.info(f"The two backward prompts are identical: {why}, so leaving out the "
                "LLM-produced siblings changes nothing on this graph. TextGrad writes each "
                "message from one input alone; siblings matter where a node reads two or "
                "more LLM nodes.")
    _start_pair_buttons(tour, graph, node, set(pairs["method"]))



def gate_stage(tour: Selection) -> None:
    """One accepted and one rejected proposal, with the validation scores: from this run,
    else from another run of the same graph (named), else a plain 'none'."""
    accepted, rejected = proposals_of(tour.db, tour.run)
    st.markdown(f"This run proposed {plural(len(accepted) + len(rejected), 'prompt edit')}: "
                f"{len(accepted)} accepted, {len(rejected)} rejected by the gate.")
    runs = data.runs(tour.db)
    name = runs.loc[runs["run_id"] == tour.run, "graph_name"]
    others = [r for r in runs[runs["graph_name"].isin(name)]["run_id"] if r != tour.run][:12]
    for index, label in ((0, "An accepted proposal"), (1, "A rejected proposal")):
        st.markdown(f"**{label}**")
        rows, source = (accepted, rejected)[index], tour.run
        for other in others if rows.empty else []:
            rows, source = proposals_of(tour.db, other)[index], other
            if not rows.empty:
                break
        if rows.empty:
            st.caption("None in this run or any other run of this graph in the run log.")
            continue
        row = rows.iloc[0].to_dict()
        with st.container(border=True):
            where = "" if source == tour.run else f"from run {md(source)} (none in this run) · "
            st.caption(f"{where}step {int(row['step'])} · node {md(row['node_id'])} · "
                       f"validation alone: {fmt(row.get('val_alone'))}"
                       + (f" · {md(row['reject_reason'])}" if isinstance(
                           row.get("reject_reason"), str) else ""))
            update_pane(row, node=row["node_id"], show_call=False,
                        copies=probe_data.copies_training(tour.db, source, row))



def blame_stage(tour: Selection, graph: data.RunGraph) -> None:
    """Follow the gradient at each node for the tour's example, and run each node's
    proposed prompt alone on it: which one flips it?"""
    every = probe_data.probes(tour.db, tour.run, tour.step, example_id=tour.example)
    probes = every[every["kind"] == "gradient"] if not every.empty else every
    edits = every[every["kind"] == "edit"] if not every.empty else every
    # the update call saw the back-propagated examples: an edit's flip there is not credit
    seen = not data.example_gradients(tour.db, tour.run, tour.step, tour.example).empty
    llm = [n for n in graph.model.order if n not in graph.model.functions]
    edited_nodes = probe_data.edited(tour.db, tour.run, tour.step)
    step_probes = probe_data.probes(tour.db, tour.run, tour.step)
    elsewhere = 0 if step_probes.empty else \
        step_probes.loc[step_probes["example_id"] != tour.example, "example_id"].nunique()
    rows = []
    for node in llm:
        mine = probes[probes["node_id"] == node] if not probes.empty else probes
        edit = edits[edits["node_id"] == node] if not edits.empty else edits
        row = {"node": node, "followed its gradient": not_probed_here(elsewhere)}
        if not mine.empty:
            p = mine.iloc[-1].to_dict()
            verdict = flip_label(p.get("before_score"), p.get("after_score"))
            if verdict.startswith("fixed") and bool(p.get("leaks_target")):
                verdict += " (the rewrite contains the target: a leak, not credit)"
            row.update({"score before": fmt(p.get("before_score"), ".2f"),
                        "score after": fmt(p.get("after_score"), ".2f"),
                        "followed its gradient": verdict,
                        "answer after": str(p.get("after_output") or "")[:80]})
        row[EDIT_COLUMN] = unprobed_edit(node in edited_nodes)
        if not edit.empty:
            e = edit.iloc[-1].to_dict()
            row[EDIT_COLUMN] = flip_label(e.get("before_score"), e.get("after_score"))
            if row[EDIT_COLUMN].startswith("fixed") and seen:
                row[EDIT_COLUMN] += " (its update call saw this example: not credit)"
        rows.append(row)
    st.dataframe(pd.DataFrame(rows), hide_index=True)
    fixed = [r["node"] for r in rows if str(r["followed its gradient"]).startswith("fixed")
             and "leak" not in str(r["followed its gradient"])]
    edited = [r["node"] for r in rows if r[EDIT_COLUMN].startswith("fixed")
              and "not credit" not in r[EDIT_COLUMN]]
    if fixed:
        st.success(f"Following the gradient at {node_names(fixed)} turns example "
                   f"{code(tour.example)} right: the probes blame "
                   f"{'that node' if len(fixed) == 1 else 'those nodes'}.")
    elif len(probes):
        st.info("No single node's gradient fixes this example when followed alone"
                + (f"; {node_names(edited)}'s proposed prompt, run alone, does (an example its "
                   "update call never saw): the edit probes point there." if edited else "."))
    if len(probes) and not fixed:
        st.caption("When no gradient fixes an example without carrying the answer (a leak: "
                   "a node whose right output is the answer itself can only be fixed that "
                   "way), `engine blame` weighs each node's proposed prompt instead, over "
                   "many examples. The step's failing training examples are the ones the "
                   "update call saw, so ask it on validation: choose *failing validation "
                   "examples* below (`python -m engine blame "
                   f"{tour.run} --step {tour.step} --examples val`).")
    pooled_blame(tour, llm)
    blame_button(tour.db, tour.run, tour.step, key="learn_blame", primary=True,
                 label="Follow the gradient at every node")



def pooled_blame(tour: Selection, llm: list[str]) -> None:
    """Every probe logged at the tour's step, per node, with 90% intervals, and the node
    they name by `engine blame`'s rule: what one example cannot settle."""
    counts = probe_data.node_blame(tour.db, tour.run, tour.step)
    if counts.empty:
        return
    rows = counts.to_dict("records")
    edited_nodes = probe_data.edited(tour.db, tour.run, tour.step)
    table = []
    for r in rows:
        table.append({
            "node": r["node_id"],
            "fixed by its gradient": f"{int(r['flips'])}/{int(r['probed'])}",
            "90% interval": interval_text(r["flips"], r["probed"]),
            "leaks": int(r["leaks"]),
            "fixed by its edit alone": (f"{int(r['edit_flips'])}/{int(r['edit_probed'])}"
                                        if int(r["edit_probed"]) else unprobed_edit(
                                            r["node_id"] in edited_nodes)),
            "90% interval ": interval_text(r["edit_flips"], r["edit_probed"])})
    st.markdown(f"**Over every failing example probed at step {tour.step}** (a fix that "
                "carries the answer is not counted, and an edit is counted only on examples "
                "its update call did not see)")
    st.dataframe(pd.DataFrame(table), hide_index=True)
    show_verdict(tour.db, tour.run, tour.step, rows, llm)



def _use_fixed(key: str, prompt: str) -> None:
    st.session_state[key] = prompt



def fix_stage(tour: Selection, graph: data.RunGraph) -> None:
    """Write a prompt, fork the run with it, compare validation (live until it ends)."""
    trainable = list(graph.trainable)
    if not trainable:
        st.caption("This graph has no trainable prompt to fix.")
        return
    fixed = data.fixed_prompts(tour.db, tour.run)
    start = fix_node(graph, fixed)
    node = st.selectbox("1. The node whose prompt you rewrite", trainable,
                        index=trainable.index(start), key="learn_fix_node")
    current = prompt_after(data.prompt_history(tour.db, tour.run), node, tour.step)
    key = f"learn_fix_prompt|{tour.run}|{tour.step}|{node}"
    if key not in st.session_state:
        st.session_state[key] = current
    st.caption(f"Its prompt after step {tour.step}: “{md(current)}”")
    if node in fixed:
        st.caption("The graph file gives a hand-fixed prompt for this node:")
        st.code(fixed[node], language=None, wrap_lines=True)
        st.button("Start from the hand-fixed prompt", key="learn_fix_use",
                  on_click=_use_fixed, args=(key, fixed[node]))
    else:
        st.caption("Say exactly what the node should produce and in what form; name the "
                   "answer format the next node or the metric expects.")
    text = st.text_area(f"Your prompt for {node}", key=key, height=110)
    changed = bool(text.strip()) and text.strip() != current.strip()
    st.markdown("**2. Fork from this step with it**")
    slot = f"{FIX_SLOT}|{tour.run}"
    listed = job_watch.follow(slot)
    if not any(job.returncode is None for job in listed):
        if st.button("Fork with this prompt", key="learn_fork", type="primary",
                     disabled=not changed,
                     help=None if changed else "Change the prompt first"):
            record = data.run(tour.db, tour.run) or {}
            job = jobs.start_fork(jobs.ForkSpec(run_id=tour.run, db=tour.db, step=tour.step,
                                                prompts={node: text}, steps=1),
                                  graph_name=str(record.get("graph_name") or "fork"),
                                  method=str(record.get("method") or "semantic"))
            job_watch.remember(slot, job)
            st.rerun()
    st.markdown("**3. Compare**")
    forks = [f for f in data.forks(tour.db, tour.run)
             if not data.steps(tour.db, f).empty
             and (data.run(tour.db, f) or {}).get("fork_step") == tour.step]
    if not forks:
        st.caption(f"No fork of this run from step {tour.step} yet.")
        return
    fork = forks[0]
    fork_validation(tour.db, tour.run, fork, tour.step,
                    labels=("this run", f"fork {code(fork)} with the new prompt"))
    st.page_link("screens/compare.py", label="Open the fork beside this run on Compare",
                 icon=":material/compare_arrows:",
                 query_params={"run": fork, "other": tour.run, "step": str(tour.step)})
