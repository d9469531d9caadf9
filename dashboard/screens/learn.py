"""Learn: a guided tour of semantic backpropagation on the demo graph (forward pass, loss,
semantic gradient, the same gradient without siblings, update, the gate, checking the
blame with probes), each stage tied to the live graph and to what really happened in a
demo run; the text quotes the run's own nodes, targets and scores."""
from dataclasses import replace

import streamlit as st

from dashboard import data, jobs, probe_data
from dashboard.state import PENDING_RUN_KEY, Selection, selection
from dashboard.views.colors import QUANTITIES
from dashboard.views.learn_stages import (
    FIX_TEXT,
    SIBLING_BLIND,
    STAGES,
    forward_text,
    gradient_text,
    graph_text,
    loss_text,
)
from dashboard.views.panes import candidate_count
from dashboard.views.quality import noise_note
from dashboard.views.text import md
from dashboard.widgets.graph_view import draw_graph
from dashboard.widgets.learn_stages import blame_stage, fix_stage, gate_stage, without_siblings
from dashboard.widgets.method_compare import compare_section
from dashboard.widgets.panes import forward_pane, gradients_received, loss_pane, update_pane

TOUR_KEY = "tour"
TEXT = {
    "Update": """
The **update** rewrites each trainable prompt from a few failing examples: for each, the
node's input, its output and the gradient it received. All new prompts are tried
together on the validation split and kept only if the score strictly improves (the
*gate*), less any edit the gain did not need. Below: the proposed edit as a word-level
diff (green added, red removed) and the gate's verdict.""",
    "Without siblings": """
A **sibling-blind** method (`semantic-nosibling`, or TextGrad) writes each input's
message from that input alone. Below: the same node's gradient on the same example, with
its siblings and without. A run whose graph sets `contrast:` (the demo does) made both
backward calls on the same forward pass; otherwise the sibling-blind one comes from a
paired run with the same seed. Look for what the sibling-aware message can say that the
other cannot: what the other inputs already covered.""",
    "The gate": """
A candidate is kept only if the validation score **strictly improves** with it: the
*gate*. When a kept candidate changed several prompts, each edit is then left out in turn
and validation scored again: an edit the score does not need (as good or better without
it) is dropped, so the run keeps only the edits that earned their place. Below: a
proposal the gate accepted and one it rejected or dropped (its reason says which), from
this run where it has them, with the validation score before and after, and the score of
the edit alone where the engine measured it (per-node gates, or the pruning).""",
    "Check the blame": """
A gradient is a claim: "had this node's output been like this, the answer would have been
right". A **probe** tests it: the optimizer model rewrites the node's output the way its
gradient says, and only what depends on the node re-runs. Follow the gradient at each node,
one at a time, and watch which one turns the wrong answer right.""",
    "Fix it yourself": FIX_TEXT,
}


def explore_text() -> str:
    """The last stage's text; the Graph page's colour options are named from the list the
    Graph page itself offers, so the two cannot drift apart."""
    colours = [label[0].lower() + label[1:] for label in QUANTITIES.values()]
    listed = "; ".join(colours[:-1]) + "; or " + colours[-1] if len(colours) > 1 else colours[0]
    return ("That is one step. An optimization repeats it for a few steps. Explore any run "
            f"with the other pages: the **Graph** colours nodes by {listed}; **Step "
            "through** walks one example stop by stop; the **Node inspector** shows every "
            "prompt and message for one node; **Curves** and **Compare** show scores and "
            "costs.")


def highlight(stage: str, graph) -> str | None:
    """The node a stage is about: the first node, the loss, or the output node."""
    receivers = graph.model.predecessors(graph.model.output) or [graph.model.output]
    return {"Forward pass": graph.model.order[0], "Loss": "__loss__",
            "Semantic gradient": graph.model.output,
            "Without siblings": receivers[0]}.get(stage)


def stage_text(stage: str, tour: Selection, graph) -> str:
    """The stage's explanation, computed from the run where it names data."""
    if stage == "The graph":
        return graph_text(graph, (data.run(tour.db, tour.run) or {}).get("graph_name", ""))
    if stage == "Forward pass":
        return forward_text(graph)
    if stage == "Loss":
        losses = data.example_trace(tour.db, tour.run, tour.step, tour.example)["losses"] \
            if tour.example else None
        row = losses.iloc[0].to_dict() if losses is not None and not losses.empty else None
        return loss_text({**row, "example_id": tour.example} if row else None, graph.metric)
    if stage == "Semantic gradient":
        return gradient_text(graph)
    if stage == "Explore":
        return explore_text()
    return TEXT[stage]


def tour_demo_runs(runs) -> list[str]:
    """Demo runs the tour can show, best first: sibling-aware ones before sibling-blind
    ones (the tour's stages say "siblings included", and its paired run is the
    sibling-blind one), runs of their own before forks, newest first."""
    demos = runs[runs["graph_name"] == "demo"]
    if demos.empty:
        return []
    parents = demos["parent_run_id"] if "parent_run_id" in demos else [None] * len(demos)
    rank = sorted(zip(demos["method"].isin(SIBLING_BLIND),
                      [isinstance(p, str) and bool(p) for p in parents],
                      range(len(demos))))  # list_runs is newest first
    return [demos.iloc[i]["run_id"] for *_, i in rank]


def tour_run(sel: Selection) -> Selection | None:
    """The run the tour shows: the selected one if it is a sibling-aware demo run, else
    the best demo run (tour_demo_runs), with a back-propagated example at a step that
    proposed edits."""
    if not data.exists(sel.db):
        return None
    runs = data.runs(sel.db)
    ranked = tour_demo_runs(runs)
    if not ranked:
        return None
    aware = set(runs.loc[~runs["method"].isin(SIBLING_BLIND), "run_id"])
    if sel.run in aware.intersection(ranked) and sel.step is not None:
        return sel
    run = ranked[0]
    steps = data.steps(sel.db, run)
    if steps.empty:
        return None
    proposed = steps[steps["proposed"] > 0]
    step = int((proposed if not proposed.empty else steps)["step"].iloc[-1])
    examples = data.step_examples(sel.db, run, step)
    example = examples.iloc[0]["example_id"] if not examples.empty else None
    return replace(sel, run=run, step=step, example=example, node=None)


def _next() -> None:
    current = st.session_state.get(TOUR_KEY) or STAGES[0]
    st.session_state[TOUR_KEY] = STAGES[min(STAGES.index(current) + 1, len(STAGES) - 1)]


def live(stage: str, tour: Selection, graph) -> None:
    output = graph.model.output
    if stage in ("Forward pass", "Loss", "Semantic gradient") and not tour.example:
        return
    if stage == "Forward pass":
        for name in graph.model.order:
            st.markdown(f"**{md(name)}**")
            forward_pane(data.node_view(tour.db, tour.run, tour.step, tour.example, name),
                         messages=False)
    elif stage == "Loss":
        loss_pane(data.example_trace(tour.db, tour.run, tour.step, tour.example)["losses"],
                  graph.metric)
    elif stage == "Semantic gradient":
        receivers = graph.model.predecessors(output) or [output]
        st.markdown(f"**What {md(receivers[0])} received from {md(output)}**")
        view = data.node_view(tour.db, tour.run, tour.step, tour.example, receivers[0])
        if not gradients_received(view, expanded=True):
            st.caption("This example was not back-propagated: pick a failing one in the "
                       "sidebar.")
        run = data.run(tour.db, tour.run) or {}
        if run.get("backend") == "local":  # the embedded model that wrote the gradients
            st.info(noise_note(run.get("optimizer_model") or run.get("model")),
                    icon=":material/info:")
    elif stage == "Without siblings":
        without_siblings(tour, graph)
        st.markdown("**Which method's gradients fix more?** Re-run each method's backward "
                    "pass on this step's failing examples and follow its gradients.")
        compare_section(tour.db, tour.run, tour.step, key="learn_compare")
    elif stage == "Update":
        updates = data.updates(tour.db, tour.run, tour.step)
        count = candidate_count(updates)
        if count > 1:
            st.markdown(f"This step wrote **{count} candidate prompt sets** from the same "
                        "gradients (`--proposals`; the first greedy, the others sampled). "
                        "Each was scored on validation; the best is kept only if it "
                        "improves.")
        for update in updates.to_dict("records"):
            with st.container(border=True):
                update_pane(update, node=update["node_id"], show_call=False,
                            copies=probe_data.copies_training(tour.db, tour.run, update),
                            candidates=count)
    elif stage == "The gate":
        gate_stage(tour)
    elif stage == "Check the blame":
        blame_stage(tour, graph)
    elif stage == "Fix it yourself":
        fix_stage(tour, graph)
    elif stage == "Explore":
        for page, label in (("screens/graph.py", "Graph"), ("screens/step.py", "Step through"),
                            ("screens/inspect.py", "Node inspector"),
                            ("screens/curves.py", "Curves")):
            st.page_link(page, label=label, query_params=tour.link(node=output))


sel = selection()
st.title(f"Learn: semantic backpropagation in {len(STAGES)} stages")
tour = tour_run(sel)
if tour is None:
    st.info("The tour shows a real run of the demo graph. None is in this run log yet: "
            f"start one ({jobs.DEMO_DURATION}), then come back.")
    if st.button("Run the demo", type="primary", key="learn_demo"):
        job = jobs.start(jobs.RunSpec(graph=str(jobs.DEMO_GRAPH), db=sel.db,
                                      **jobs.DEMO_OPTIONS))
        st.session_state[PENDING_RUN_KEY] = job.run_id
        st.success(f"Started {job.run_id}; follow it on the Runs page.")
    st.stop()
graph = data.graph(tour.db, tour.run)
if tour.run != sel.run:
    st.caption(f"Showing demo run **{md(tour.run)}** (step {tour.step}, example "
               f"{md(tour.example)}); select it in the sidebar to choose another example.")
if st.session_state.get(TOUR_KEY) not in STAGES:
    st.session_state[TOUR_KEY] = STAGES[0]
stage = st.segmented_control("Stage", STAGES, key=TOUR_KEY, bind="query-params",
                             required=True)
stage = stage or STAGES[0]
quantity = ("edit" if stage in ("Update", "The gate", "Fix it yourself") else
            "blame" if stage == "Check the blame" else "grad_chars")
draw_graph(tour, graph, quantity, highlight=highlight(stage, graph), height=300)
if quantity == "grad_chars":  # two lengths on one drawing: say which is which
    st.caption(f"A box's ∇ chars: its aggregated gradient, the mean over the examples "
               f"back-propagated at step {tour.step}; an arrow's: what one successor sent "
               f"for example {md(tour.example)}, before aggregation. They agree only where a "
               "node has one successor and the example is the step's only one.")
st.markdown(stage_text(stage, tour, graph))
st.button("Next stage ▶", on_click=_next, disabled=stage == STAGES[-1], key="tour_next")
live(stage, tour, graph)
