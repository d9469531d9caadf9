"""Compare: two runs side by side (for example `semantic` against `textgrad` on the same
graph and seed, or a fork against its parent): score curves on one chart, per example the
graded answers and scores, "Why do they differ?" (the two traces with source changes
marked, and the diff that finds the change that matters: engine/probes/diff.py), the same
example's gradients per node side by side, and each node's prompt diffed parent -> fork."""
import json

import pandas as pd
import streamlit as st

from dashboard import data, diff_data, links
from dashboard.state import need_run, selection
from dashboard.views.diff import change_caption
from dashboard.views.figures import compare_curves
from dashboard.views.text import fmt, md, plural
from dashboard.views.validation import best_validation
from dashboard.widgets.text import show_diff, show_side_by_side
from dashboard.widgets.validation import fork_validation

OTHER_KEY = "other"
PAIR_KEY = "pair"  # the example whose gradients are paired (a row picked in the table)


def default_other(runs: pd.DataFrame, run: str, db: str = "") -> str | None:
    """A fork's parent (runs.parent_run_id), else a fork of this run, else another run
    of the same graph, preferring the same seed and a different method; None when no
    other run has this graph (runs of different graphs are not paired unasked)."""
    me = runs[runs["run_id"] == run].iloc[0]
    others = runs[runs["run_id"] != run].copy()
    if others.empty:
        return None
    parent = (data.run(db, run) or {}).get("parent_run_id") if db else None
    if isinstance(parent, str) and parent in set(others["run_id"]):
        return parent
    children = data.forks(db, run) if db else []
    if children:
        return children[0]
    others = others[others["graph_name"] == me["graph_name"]].copy()
    if others.empty:
        return None
    others["rank"] = [(s != me["seed"], m == me["method"])
                      for s, m in zip(others["seed"], others["method"])]
    return others.sort_values("rank", kind="stable").iloc[0]["run_id"]


def fork_pair(db: str, a: str, b: str) -> tuple[str, str, int] | None:
    """(parent, fork, the step the fork starts from) when one run is a fork of the other
    and both logged that step; None otherwise."""
    for parent, fork in ((a, b), (b, a)):
        record = data.run(db, fork) or {}
        start = record.get("fork_step")
        if record.get("parent_run_id") == parent and start is not None and start == start:
            logged = [set(data.steps(db, r)["step"]) for r in (parent, fork)]
            if all(int(start) in steps for steps in logged):
                return parent, fork, int(start)
    return None


def summary(runs: pd.DataFrame, a: str, b: str, tests: dict[str, float]) -> None:
    rows = runs.set_index("run_id").loc[[a, b]]
    table = pd.DataFrame({
        "run": [a, b], "graph": rows["graph_name"].values, "method": rows["method"].values,
        "seed": rows["seed"].values, "status": rows["status"].values,
        "steps": rows["steps"].values, "best validation": rows["best_val"].values,
        "test": [tests.get(r) for r in (a, b)],
        "calls": rows["calls"].values, "tokens": rows["tokens"].values,
        "cost (USD)": rows["cost_usd"].values})
    st.dataframe(table, hide_index=True)


def _prompt_text(messages_json: object) -> str:
    """A call's messages as one text (role lines then content), for diffing."""
    try:
        messages = json.loads(messages_json) if isinstance(messages_json, str) else []
    except ValueError:
        messages = []
    return "\n\n".join(f"[{m.get('role', '')}]\n{m.get('content', '')}" for m in messages)


def paired_backward(sel, other: str, step: int, example: str) -> None:
    """Where both runs back-propagated `example`: per (node, sender) both gradients and
    both backward prompts side by side, A's words missing from B in red, B's new words
    in green."""
    ga = data.backward_calls(sel.db, sel.run, step, example)
    gb = data.backward_calls(sel.db, other, step, example)
    if ga.empty or gb.empty:
        who = "either run" if ga.empty and gb.empty else ("A" if ga.empty else "B")
        st.caption(f"{who} did not back-propagate example {example} at step {step}: "
                   "pick an example both runs back-propagated (column 'both back-propagated').")
        return
    only = st.toggle("show only what changed", key="compare_grad_only")
    keys = list(dict.fromkeys([*zip(ga["node_id"], ga["from_node_id"]),
                               *zip(gb["node_id"], gb["from_node_id"])]))
    for node, sender in keys:
        ra = ga[(ga["node_id"] == node) & (ga["from_node_id"] == sender)]
        rb = gb[(gb["node_id"] == node) & (gb["from_node_id"] == sender)]
        st.markdown(f"**{md(node)}** ← {md(sender)}")
        a = ra.iloc[0].to_dict() if not ra.empty else {}
        b = rb.iloc[0].to_dict() if not rb.empty else {}
        show_side_by_side(a.get("content") or "", b.get("content") or "",
                          labels=(f"A gradient ({a.get('method') or 'none'})",
                                  f"B gradient ({b.get('method') or 'none'})"),
                          only_changes=only)
        pa, pb = _prompt_text(a.get("messages")), _prompt_text(b.get("messages"))
        if pa or pb:
            with st.expander(f"backward prompts sent by {sender}: A | B"
                             + (" (identical)" if pa == pb else "")):
                show_side_by_side(pa, pb, labels=("A backward prompt", "B backward prompt"),
                                  only_changes=only)


def _example_clicked() -> None:
    state = st.session_state.get("compare_table")
    rows = getattr(getattr(state, "selection", None), "rows", None) or []
    ids = st.session_state.get("_compare_rows", [])
    if rows and rows[0] < len(ids):
        st.session_state[PAIR_KEY] = ids[rows[0]]


def unscored_training(db: str, a: str, b: str, step: int, metric: str) -> str:
    """A sentence naming the run(s) whose prompts in effect after `step` were never scored
    on their training examples (a step that kept an edit is scored on train only at the next
    step), whose training rows are therefore not compared; "" when both were."""
    missing = [name for name, run in (("A", a), ("B", b))
               if data.split_sizes(db, run).get("train", 0) and "train" not in set(
                   data.compare_rows(db, run, run, step, step, metric)["split"])]
    if not missing:
        return ""
    return (f" No training example is compared: {' and '.join(missing)} "
            f"{'has' if len(missing) == 1 else 'have'} no step after step {step} to score "
            "those prompts on train.")


def per_example(sel, other: str, step: int, metric: str) -> str | None:
    """Both runs' prediction, graded answer and score per shared example; returns the
    example to pair."""
    rows = data.compare_rows(sel.db, sel.run, other, step, step, metric)
    unscored = unscored_training(sel.db, sel.run, other, step, metric)
    if rows.empty:
        st.caption("The two runs share no example scored with the prompts in effect after "
                   f"step {step} (different data or seed).{unscored}")
        return None
    links.page_option("disagree", False, [True, False], cast=links.flag)
    disagree = st.toggle("only examples where the runs disagree", key="disagree",
                         help="a different graded answer or a different score (raw-text "
                              "differences alone do not count)")
    shown = rows[rows["disagree"]] if disagree else rows
    st.session_state["_compare_rows"] = list(shown["example_id"])
    table = pd.DataFrame({
        "split": shown["split"], "example": shown["example_id"],
        "A prediction": shown["prediction_a"], "A answer": shown["answer_a"],
        "A score": shown["score_a"],
        "B prediction": shown["prediction_b"], "B answer": shown["answer_b"],
        "B score": shown["score_b"],
        "disagree": shown["disagree"], "raw text differs": shown["raw_differs"],
        "both back-propagated": shown["backprop_a"] & shown["backprop_b"]})
    st.dataframe(table, hide_index=True, key="compare_table", on_select=_example_clicked,
                 selection_mode="single-row")
    raw_only = int((rows["raw_differs"] & ~rows["disagree"]).sum())
    st.caption(f"{int(rows['disagree'].sum())} of {len(rows)} shared examples disagree with "
               f"the prompts in effect after step {step} (graded answer or score)"
               + (f"; {raw_only} more differ only in raw text (same graded answer and "
                  "score)" if raw_only else "")
               + ". Each side's row is the pass that scored those prompts: validation in the "
               "step's gate, training at the next step's start (a step scores training "
               f"before its update).{unscored} Select a row to pair its gradients below (by "
               "default an example both runs back-propagated).")
    both = list(rows.loc[rows["backprop_a"] & rows["backprop_b"], "example_id"])
    differing = list(rows.loc[rows["disagree"], "example_id"])
    shared = list(rows["example_id"])
    chosen = links.page_option(PAIR_KEY, "")  # a row picked here, kept in the address
    for candidate in (chosen, sel.example if sel.example in both else None, *both[:1],
                      *differing[:1], sel.example, shared[0]):
        if candidate in shared:
            return candidate
    return None


def paired_step(sel, other: str, common: list[int]) -> tuple[int, str]:
    """The step whose examples are paired: the selected one when both runs back-propagated
    there, else the latest step both back-propagated, else the selected (or last common)
    step; with the sentence that says which and why."""
    wanted = sel.step if sel.step in common else common[-1]
    ba = set(data.steps_with_gradients(sel.db, sel.run))
    bb = set(data.steps_with_gradients(sel.db, other))
    both = [s for s in common if s in ba and s in bb]
    if wanted in both:
        return wanted, f"Step {wanted}: both runs back-propagated at this step."
    if both:
        return both[-1], (f"Step {both[-1]}, the latest step both runs back-propagated "
                          f"(at step {wanted} {'A' if wanted not in ba else 'B'} "
                          "back-propagated nothing).")
    return wanted, (f"Step {wanted}: no step in common where both runs back-propagated, so "
                    "gradients cannot be paired; predictions and scores are still compared.")


def prompts_diff(sel, other: str) -> None:
    """Each node's prompt from the older run to the newer: a fork's parent -> the fork
    (whichever side the fork is on), else A -> B."""
    pa, pb = data.current_prompts(sel.db, sel.run), data.current_prompts(sel.db, other)
    a_parent = (data.run(sel.db, sel.run) or {}).get("parent_run_id")
    flipped = a_parent == other  # A is a fork of B: diff B (parent) -> A (child)
    st.caption("B (parent) → A (fork): struck out is the parent's text, green the fork's."
               if flipped else "A → B: struck out is A's text, green B's."
               + (" A is B's parent." if (data.run(sel.db, other) or {}).get(
                   "parent_run_id") == sel.run else ""))
    only = st.toggle("show only what changed", key="compare_only")
    for node in dict.fromkeys([*pa, *pb]):
        a, b = pa.get(node, ""), pb.get(node, "")
        st.markdown(f"**{md(node)}**" + (" · identical" if a == b else ""))
        show_diff(*((b, a) if flipped else (a, b)), only_changes=only)


KIND_COLORS = {"source": "#f4a259", "downstream": "#d9d9d9", "unchanged": "#ffffff"}
EXPLAINS_COLOR = "#5bb85d"


def change_graph(model, colors: dict[str, str], captions: dict[str, str],
                 explained: list[str]) -> str:
    """The graph as Graphviz DOT, each node filled by its change and the explaining nodes
    outlined (a static drawing: nothing to click here)."""
    def q(text: str) -> str:
        return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["digraph {", "rankdir=LR;", 'node [shape=box, style="rounded,filled", '
             'fontname="sans-serif", fontsize=11];']
    for field_name in model.fields:
        lines.append(f'{q(field_name)} [shape=plaintext, style="", fontcolor="#666666"];')
    for node in model.order:
        label = q(node)[:-1] + "\\n" + q(captions.get(node, ""))[1:]  # DOT's line break
        lines.append(f"{q(node)} [id={q('why-' + node)}, label={label}, "
                     f"fillcolor={q(colors.get(node, '#ffffff'))}, "
                     f"penwidth={3 if node in explained else 1}];")
    for node, inputs in model.inputs:
        for source in inputs:
            lines.append(f"{q(source)} -> {q(node)};")
    lines.append("}")
    return "\n".join(lines)


def why_they_differ(sel, other: str, step: int, example: str, graph) -> None:
    """The two traces of one example side by side with source changes marked, a button
    that runs the diff (this example, or every differing one), and the explaining node
    highlighted on the graph. Results are read back from the run log, so a link or a
    reload shows them again."""
    st.caption(f"Each side with the prompts in effect after step {step}. A **source "
               "change** is a node whose own behaviour differs (its prompt, its model, or "
               "its output from the same inputs); a **downstream** change only received "
               "other inputs. The diff patches source changes from A into B, re-runs what "
               "depends on them in B's configuration (through the cache), and reports the "
               "smallest set that gives B A's score.")
    verdicts = diff_data.latest_diff(sel.db, sel.run, step, other, step)
    mine = verdicts[verdicts["example_id"] == example]
    split = "val"
    compared = diff_data.comparison(sel.db, sel.run, step, other, step, example)
    if compared is not None:
        split = compared.diff.split
    c1, c2 = st.columns(2)
    run_one = c1.button(f"Why do they differ? Run the diff for {example}", key="why_one",
                        icon=":material/difference:")
    run_all = c2.button(f"Run it for every differing {split} example", key="why_all")
    if run_one or run_all:
        with st.spinner("patching source changes from A into B…"):
            try:
                report = diff_data.run_diff(sel.db, sel.run, step, other, step, split,
                                            example if run_one else "differing")
            except ValueError as exc:
                st.error(f"error: {exc}")
                return
        st.session_state["_diff_cost"] = (f"Last diff: {plural(report.calls, 'call')} "
                                          f"({report.model_calls} to the model), "
                                          f"{report.tokens:,} tokens, {report.seconds:.1f} s.")
        verdicts = diff_data.latest_diff(sel.db, sel.run, step, other, step)
        mine = verdicts[verdicts["example_id"] == example]
    if st.session_state.get("_diff_cost"):
        st.caption(st.session_state["_diff_cost"])
    explained = None
    if not mine.empty:
        row = mine.iloc[0]
        if abs((row["score_a"] or 0) - (row["score_b"] or 0)) < 1e-9:
            st.info(f"Example {example}: same score in A and B ({fmt(row['score_a'])}): "
                    "nothing to explain.")
        elif row["explained_by"]:
            explained = list(row["explained_by"])
            st.success(f"Example {example} scores {fmt(row['score_a'])} in A and "
                       f"{fmt(row['score_b'])} in B: explained by "
                       f"**{md(', '.join(explained))}** (B with "
                       f"{'that output' if len(explained) == 1 else 'those outputs'} from A "
                       f"scores {fmt(row['patched_score'])}).")
        elif compared is not None and any(c.why.startswith("model differs")
                                          for c in compared.diff.changes):
            st.warning(f"Example {example}: not explained: the two runs use different "
                       "models, which changes every LLM node at once, so no output is "
                       "patched from one into the other (source changes: "
                       f"{md(', '.join(row['sources']) or 'none')}).")
        else:
            st.warning(f"Example {example}: not explained within the bound (source changes "
                       f"tried: {md(', '.join(row['sources']) or 'none')}).")
    if compared is None:
        st.caption(f"Example {example} has no logged trace with these prompts on one side: "
                   "the diff computes it (forward pass through the cache).")
    else:
        changes = {c.node: c for c in compared.diff.changes}
        colors = {n: EXPLAINS_COLOR if explained and n in explained
                  else KIND_COLORS.get(c.kind, "#ffffff") for n, c in changes.items()}
        captions = {n: change_caption(c.kind, c.why, bool(explained and n in explained))
                    for n, c in changes.items()}
        st.graphviz_chart(change_graph(graph.model, colors, captions, explained or []))
        st.caption("Green: the explaining node; orange: source changes; grey: downstream "
                   "changes; white: the same output on both sides.")
        if compared.not_compared:
            st.caption("Not compared (in one graph only): "
                       + ", ".join(md(n) for n in compared.not_compared))
        for node in compared.order:
            change = changes[node]
            mark = {"source": ":orange-badge[source change]",
                    "downstream": ":gray-badge[downstream]"}.get(change.kind, "")
            if explained and node in explained:
                mark = ":green-badge[explains]" + " " + mark
            st.markdown(f"**{md(node)}** {mark} · {md(change.why)}")
            show_side_by_side(compared.outputs_a.get(node, ""), compared.outputs_b.get(node, ""),
                              labels=("A output", "B output"))
    if len(verdicts) > 1 or (len(verdicts) == 1 and mine.empty):
        differing = verdicts[[abs((a or 0) - (b or 0)) > 1e-9 for a, b in
                              zip(verdicts["score_a"], verdicts["score_b"])]]
        st.markdown(f"**Every example diffed** ({len(differing)} of {len(verdicts)} score "
                    "differently)")
        st.dataframe(pd.DataFrame({
            "example": differing["example_id"], "A score": differing["score_a"],
            "B score": differing["score_b"],
            "source changes": [", ".join(x or []) for x in differing["sources"]],
            "explained by": [", ".join(x) if x else "not explained within the bound"
                             for x in differing["explained_by"]],
            "patched score": differing["patched_score"]}), hide_index=True, key="why_table")


sel = selection()
graph = need_run(sel)
runs = data.runs(sel.db)
choices = [r for r in runs["run_id"] if r != sel.run]
st.title("Compare")
if not choices:
    st.info("Only one run in this run log: start another (for example the same graph and "
            "seed with method textgrad) on the Runs page.")
    st.stop()
if st.session_state.get(OTHER_KEY) not in choices:
    wanted = st.query_params.get(OTHER_KEY)
    st.session_state[OTHER_KEY] = (wanted if wanted in choices
                                   else default_other(runs, sel.run, sel.db))
other = st.selectbox("Compare with", choices, index=None, key=OTHER_KEY, bind="query-params",
                     placeholder="choose a run")
if other is None:
    mine = runs.loc[runs["run_id"] == sel.run, "graph_name"].iloc[0]
    st.info(f"No other run of graph **{md(mine)}** in this run log: choose a run to "
            "compare with (runs of different graphs are not paired unasked).")
    st.stop()
summary(runs, sel.run, other, data.test_scores(sel.db))
lineage = fork_pair(sel.db, sel.run, other)
if lineage is not None:
    parent, fork, start = lineage
    fork_validation(sel.db, parent, fork, start,
                    labels=(f"parent {'A' if parent == sel.run else 'B'} ({md(parent)})",
                            f"fork {'A' if fork == sel.run else 'B'} ({md(fork)})"))
sa, sb = data.steps(sel.db, sel.run), data.steps(sel.db, other)
na, nb = (data.split_sizes(sel.db, run).get("val", 0) for run in (sel.run, other))
st.plotly_chart(compare_curves(sa, sb, "A", "B", na, nb), key="compare_curves")
st.caption(f"A = {md(sel.run)} (solid) · B = {md(other)} (dashed) · validation bars: 95% "
           f"intervals on {na} (A) and {nb} (B) examples")

st.subheader("Per example", divider="gray")
common_steps = sorted(set(sa["step"]) & set(sb["step"]))
if sel.step is None or not common_steps:
    st.caption("No step in common yet.")
else:
    step, why_step = paired_step(sel, other, common_steps)
    st.caption(why_step)
    example = per_example(sel, other, step, graph.metric)
    if example is not None:
        st.subheader(f"Why do they differ? · example {example} · step {step}", divider="gray")
        why_they_differ(sel, other, step, example, graph)
        st.subheader(f"Gradients and backward prompts · example {example} · step {step}",
                     divider="gray")
        st.caption("A left, B right; words of A missing from B in red, B's new words in "
                   "green.")
        paired_backward(sel, other, step, example)

st.subheader("Prompts: latest accepted versions", divider="gray")
prompts_diff(sel, other)
st.caption(f"Best validation: A {best_validation(sel.db, sel.run)}; "
           f"B {best_validation(sel.db, other)}.")
