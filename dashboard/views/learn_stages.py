"""The Learn tour's text and its data-driven stages: every sentence that names a node, a
target or a score is computed from the run it shows, so the text cannot contradict the
data beside it."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, jobs, probe_data
from dashboard.state import Selection
from dashboard.views import job_watch
from dashboard.views.blame import blame_button, interval_text, show_verdict
from dashboard.views.panes import update_pane
from dashboard.views.quality import mark
from dashboard.views.text import code, fmt, md, plural, show_messages, show_text
from dashboard.views.validation import fork_validation
from dashboard.views.whatif import flip_label, prompt_after
from engine.events import same_prompt
from engine.methods import METHODS

STAGES = ["The graph", "Forward pass", "Loss", "Semantic gradient", "Without siblings",
          "Update", "The gate", "Check the blame", "Fix it yourself", "Explore"]
# methods whose gradients never see the other inputs of the same node, as they declare it
SIBLING_BLIND = tuple(sorted(name for name, m in METHODS.items()
                             if m.uses_gradients and not m.sibling_aware))
PAIR_SLOT = "learn_pair"
FIX_SLOT = "learn_fix"


def _names(items: list[str]) -> str:
    quoted = [code(i) for i in items]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def graph_text(graph: data.RunGraph, name: str) -> str:
    """What the graph is, node by node, from the graph the run logged."""
    model = graph.model
    prompts = dict(graph.prompts)
    lines = [f"An **agentic graph** is a pipeline of language-model calls. Each box is a "
             f"node: a prompt (its *parameter*, the thing we optimize) applied to its inputs, "
             f"fields of the example or outputs of earlier nodes. The {code(name)} graph has "
             f"{len(model.order)} nodes:"]
    for node in model.order:
        reads = _names(list(dict(model.inputs).get(node, ())))
        role = " (the output node)" if node == model.output else ""
        prompt = prompts.get(node) or "a Python function"
        lines.append(f"- {code(node)}{role} reads {reads}; its starting prompt: "
                     f"“{md(prompt)}”")
    return "\n".join(lines)


def forward_text(graph: data.RunGraph) -> str:
    order = list(graph.model.order)
    sequence = ", then ".join(f"{code(n)}" for n in order)
    return (f"The **forward pass** runs every node as soon as its inputs exist, in dependency "
            f"order: {sequence}. Each run is one call; the reply is the node's output, which "
            "flows along the grey arrows. Below is what each node really did on the example.")


def loss_text(loss: dict | None, metric: str) -> str:
    """The loss stage's text, quoting the example's own target and prediction."""
    if not loss:
        return "The **loss** compares the output node's answer with the expected one."
    target, prediction = str(loss.get("target") or ""), str(loss.get("prediction") or "")
    verdict = "correct" if (loss.get("score") or 0) >= 1 else "wrong"
    return (f"The **loss** compares the output node's answer with the expected one. On "
            f"example {code(loss.get('example_id'))} the expected output is "
            f"“{md(target)}” and the graph answered “{md(prediction)}”: {verdict} (score "
            f"{fmt(loss.get('score'), '.2f')}, metric {code(metric)}). The feedback sent back "
            "into the graph (the *output gradient*) is shown below, as the engine wrote it.")


def gradient_text(graph: data.RunGraph) -> str:
    model = graph.model
    inputs = list(dict(model.inputs).get(model.output, ()))
    llm = [i for i in inputs if i in model.order]
    if not llm:
        return ("The **backward pass** walks the graph in reverse; this graph's output node "
                "reads no other node, so no gradient flows further.")
    others = [i for i in inputs if i != llm[0]]
    return (f"The **backward pass** walks the graph in reverse. {code(model.output)} receives "
            f"the feedback, and one call asks how each of its LLM-produced inputs "
            f"({_names(llm)}) should have been different. That call sees all of "
            f"{code(model.output)}'s inputs together: for {code(llm[0])} its *siblings* are "
            f"{_names(others) if others else 'none'}. Just as the derivative of x₁·x₂ with "
            "respect to x₁ is x₂, a useful message to one input depends on what the others "
            "already provide. The orange arrow is the gradient; below is the exact backward "
            "prompt and the message it produced.")


def paired_runs(db: str, tour: Selection) -> pd.DataFrame:
    """Sibling-blind runs (semantic-nosibling, textgrad) of the same graph and seed."""
    runs = data.runs(db)
    record = runs[runs["run_id"] == tour.run]
    if record.empty:
        return runs.iloc[0:0]
    mine = record.iloc[0]
    return runs[(runs["graph_name"] == mine["graph_name"]) & runs["method"].isin(SIBLING_BLIND)
                & (runs["seed"] == mine["seed"]) & (runs["run_id"] != tour.run)]


def llm_siblings(graph: data.RunGraph, node: str) -> list[str]:
    """The other LLM-produced inputs of the node `node` feeds (the output node)."""
    model = graph.model
    return [i for i in dict(model.inputs).get(model.output, ()) if i != node
            and i in model.order and i not in model.functions]


def pair_order(graph: data.RunGraph, node: str) -> list[str]:
    """The sibling-blind methods, the one that can show a difference on this graph first:
    where `node` has no LLM-produced sibling, semantic-nosibling sends the very same
    backward prompt as semantic, and only TextGrad's one-input messages differ."""
    if llm_siblings(graph, node):
        return list(SIBLING_BLIND)
    return sorted(SIBLING_BLIND, key=lambda m: m != "textgrad")


def pair_hint(graph: data.RunGraph, node: str, method: str) -> str:
    """What a paired run of `method` will show for `node` on this graph, said truthfully
    (the paired run button's label ends with it)."""
    siblings = llm_siblings(graph, node)
    if siblings:
        shown = _names(siblings)
        if method == "textgrad":
            return f" (one backward call per input: {code(node)}'s leaves out {shown})"
        return f" (the same call without {shown}'s output)"
    if method == "textgrad":
        return " (can differ on this graph: one backward call per input)"
    return (f" (the same backward prompt here: {code(node)} has no LLM-produced sibling)")


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


def _gradient_row(db: str, run: str, step: int, example: str, node: str,
                  kind: str = "gradient") -> dict | None:
    """The first gradient row of `kind` the node received: 'gradient' (the run's own), or
    'contrast' (a sibling-blind method's, written beside it on the same forward pass)."""
    received = data.node_view(db, run, step, example, node)["received"]
    rows = received[received["kind"] == kind]
    return None if rows.empty else rows.iloc[0].to_dict()


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
    theirs = _gradient_row(tour.db, tour.run, tour.step, tour.example, node, "contrast")
    if theirs is None:
        return False
    mine = _gradient_row(tour.db, tour.run, tour.step, tour.example, node)
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
    mine = _gradient_row(tour.db, tour.run, tour.step, tour.example, node)
    theirs = _gradient_row(tour.db, pair["run_id"], tour.step, tour.example, node)
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
        why = (f"{code(node)}'s siblings here are only example fields ({_names(siblings)}), "
               "which both methods show" if siblings and not llm else
               "the method sent the same context")
        st.info(f"The two backward prompts are identical: {why}, so leaving out the "
                "LLM-produced siblings changes nothing on this graph. TextGrad writes each "
                "message from one input alone; siblings matter where a node reads two or "
                "more LLM nodes.")
    _start_pair_buttons(tour, graph, node, set(pairs["method"]))


def _proposals(db: str, run: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's changed proposals: (accepted, rejected)."""
    updates = probe_data.all_updates(db, run)
    changed = updates[[not same_prompt(o, n) for o, n in
                       zip(updates["old_prompt"].fillna(""), updates["new_prompt"].fillna(""))]]
    kept = changed["accepted"].fillna(False).astype(bool)
    return changed[kept], changed[~kept]


def gate_stage(tour: Selection) -> None:
    """One accepted and one rejected proposal, with the validation scores: from this run,
    else from another run of the same graph (named), else a plain 'none'."""
    accepted, rejected = _proposals(tour.db, tour.run)
    st.markdown(f"This run proposed {plural(len(accepted) + len(rejected), 'prompt edit')}: "
                f"{len(accepted)} accepted, {len(rejected)} rejected by the gate.")
    runs = data.runs(tour.db)
    name = runs.loc[runs["run_id"] == tour.run, "graph_name"]
    others = [r for r in runs[runs["graph_name"].isin(name)]["run_id"] if r != tour.run][:12]
    for index, label in ((0, "An accepted proposal"), (1, "A rejected proposal")):
        st.markdown(f"**{label}**")
        rows, source = (accepted, rejected)[index], tour.run
        for other in others if rows.empty else []:
            rows, source = _proposals(tour.db, other)[index], other
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


EDIT_COLUMN = "ran with its proposed prompt"


def blame_stage(tour: Selection, graph: data.RunGraph) -> None:
    """Follow the gradient at each node for the tour's example, and run each node's
    proposed prompt alone on it: which one flips it?"""
    every = probe_data.probes(tour.db, tour.run, tour.step, example_id=tour.example)
    probes = every[every["kind"] == "gradient"] if not every.empty else every
    edits = every[every["kind"] == "edit"] if not every.empty else every
    # the update call saw the back-propagated examples: an edit's flip there is not credit
    seen = not data.example_gradients(tour.db, tour.run, tour.step, tour.example).empty
    llm = [n for n in graph.model.order if n not in graph.model.functions]
    rows = []
    for node in llm:
        mine = probes[probes["node_id"] == node] if not probes.empty else probes
        edit = edits[edits["node_id"] == node] if not edits.empty else edits
        row = {"node": node, "followed its gradient": "not probed yet"}
        if not mine.empty:
            p = mine.iloc[-1].to_dict()
            verdict = flip_label(p.get("before_score"), p.get("after_score"))
            if verdict.startswith("fixed") and bool(p.get("leaks_target")):
                verdict += " (the rewrite contains the target: a leak, not credit)"
            row.update({"score before": fmt(p.get("before_score"), ".2f"),
                        "score after": fmt(p.get("after_score"), ".2f"),
                        "followed its gradient": verdict,
                        "answer after": str(p.get("after_output") or "")[:80]})
        row[EDIT_COLUMN] = "no proposal probed"
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
        st.success(f"Following the gradient at {_names(fixed)} turns example "
                   f"{code(tour.example)} right: the probes blame "
                   f"{'that node' if len(fixed) == 1 else 'those nodes'}.")
    elif len(probes):
        st.info("No single node's gradient fixes this example when followed alone"
                + (f"; {_names(edited)}'s proposed prompt, run alone, does (an example its "
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
    table = []
    for r in rows:
        table.append({
            "node": r["node_id"],
            "fixed by its gradient": f"{int(r['flips'])}/{int(r['probed'])}",
            "90% interval": interval_text(r["flips"], r["probed"]),
            "leaks": int(r["leaks"]),
            "fixed by its edit alone": (f"{int(r['edit_flips'])}/{int(r['edit_probed'])}"
                                        if int(r["edit_probed"]) else "no proposal probed"),
            "90% interval ": interval_text(r["edit_flips"], r["edit_probed"])})
    st.markdown(f"**Over every failing example probed at step {tour.step}** (a fix that "
                "carries the answer is not counted, and an edit is counted only on examples "
                "its update call did not see)")
    st.dataframe(pd.DataFrame(table), hide_index=True)
    show_verdict(tour.db, tour.run, tour.step, rows, llm)


FIX_TEXT = """
The prompts are the graph's parameters, and you can set them by hand too. Three steps:
**1. Write a prompt** for one node below (or start from the hand-fixed one, where the graph
file has one); **2. Fork** the run from this step with it: a new run that starts from this
run's state with your prompt, re-measured on the validation split; **3. Compare** the
fork's validation score with this run's, here and on the Compare page."""


def fix_node(graph: data.RunGraph, fixed: dict[str, str]) -> str:
    """The node the stage starts on: the first trainable node with a hand-fixed prompt,
    else the output node (when trainable), else the first trainable node."""
    trainable = list(graph.trainable)
    for node in trainable:
        if node in fixed:
            return node
    return graph.model.output if graph.model.output in trainable else (
        trainable[0] if trainable else graph.model.output)


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
