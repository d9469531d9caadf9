"""Learn: a guided tour of semantic backpropagation on the demo graph (forward pass, loss,
semantic gradient and why the siblings matter, update), each stage tied to the live
graph and to what really happened in a demo run."""
from dataclasses import replace

import streamlit as st

from dashboard import data, jobs
from dashboard.state import PENDING_RUN_KEY, Selection, selection
from dashboard.views.graph_view import draw_graph
from dashboard.views.panes import forward_pane, gradients_received, loss_pane, update_pane
from dashboard.views.text import md

TOUR_KEY = "tour"
STAGES = ["The graph", "Forward pass", "Loss", "Semantic gradient", "Update", "Explore"]
TEXT = {
    "The graph": """
An **agentic graph** is a pipeline of language-model calls. Each box is a node: a prompt
(its *parameter*, the thing we optimize) applied to its inputs: fields of the example or
the outputs of earlier nodes. The demo graph has two nodes: `mood` writes a word about a
product review, and `answer` reads the review **and** `mood`'s word and says whether the
review is positive. The starting prompts are deliberately poor.""",
    "Forward pass": """
The **forward pass** runs every node as soon as its inputs exist, in dependency order:
first `mood`, then `answer`. Each run is one call; the reply between `<output>` tags is
the node's output, which flows along the grey arrows. The outlined node is the one this
stage is about; below is what it really did on one example of the demo run.""",
    "Loss": """
The **loss** compares the output node's answer with the expected one. With an exact
metric the score is 1 or 0, and the feedback sent back into the graph (the *output
gradient*) is simply the expected answer: `The expected output is: "Yes".`""",
    "Semantic gradient": """
The **backward pass** walks the graph in reverse. `answer` receives the feedback and one
call asks how each of its LLM-produced inputs (here: `mood`) should have been different.
That call sees **all** of `answer`'s inputs together, the review as well as `mood`'s word:
these are `mood`'s *siblings*. Just as the derivative of x₁·x₂ with respect to x₁ is x₂
(it depends on the other input's value), a useful message to `mood` depends on what the
other inputs already provide. TextGrad, by contrast, writes each message from one input
alone. The orange arrow is the gradient; below is the exact backward prompt the engine
sent and the message it produced.""",
    "Update": """
The **update** rewrites each trainable prompt from a few failing examples: for each, the
node's input, its output and the gradient it received. All new prompts are tried
together on the validation split and kept only if the score strictly improves (the
*gate*). Below: the proposed edit as a word-level diff (green added, red removed) and the
gate's verdict.""",
    "Explore": """
That is one step. An optimization repeats it for a few steps. Explore any run with the
other pages: the **Graph** colours nodes by failures, gradient length or edit fate; **Step
through** walks one example stop by stop; the **Node inspector** shows every prompt and
message for one node; **Curves** and **Compare** show scores and costs.""",
}


def highlight(stage: str, graph) -> str | None:
    """The node a stage is about: the first node, the loss, or the output node."""
    return {"Forward pass": graph.model.order[0], "Loss": "__loss__",
            "Semantic gradient": graph.model.output}.get(stage)


def tour_run(sel: Selection) -> Selection | None:
    """The run the tour shows: the selected one if it is a demo run, else the newest demo
    run, with a back-propagated example at a step that proposed edits."""
    if not data.exists(sel.db):
        return None
    runs = data.runs(sel.db)
    demos = runs[runs["graph_name"] == "demo"]
    if sel.run in set(demos["run_id"]) and sel.step is not None:
        return sel
    if demos.empty:
        return None
    run = demos.iloc[0]["run_id"]
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
    elif stage == "Update":
        for update in data.updates(tour.db, tour.run, tour.step).to_dict("records"):
            with st.container(border=True):
                update_pane(update, node=update["node_id"], show_call=False)
    elif stage == "Explore":
        for page, label in (("screens/graph.py", "Graph"), ("screens/step.py", "Step through"),
                            ("screens/inspect.py", "Node inspector"),
                            ("screens/curves.py", "Curves")):
            st.page_link(page, label=label, query_params=tour.link(node=output))


sel = selection()
st.title("Learn: semantic backpropagation in five stages")
tour = tour_run(sel)
if tour is None:
    st.info("The tour shows a real run of the demo graph. None is in this run log yet: "
            "start one (about two minutes on the embedded model), then come back.")
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
left, right = st.columns([2, 3])
with left:
    st.markdown(TEXT[stage])
    st.button("Next stage ▶", on_click=_next, disabled=stage == STAGES[-1], key="tour_next")
with right:
    quantity = "edit" if stage == "Update" else "grad_chars" if stage == "Semantic gradient" \
        else "fail_share"
    draw_graph(tour, graph, quantity, highlight=highlight(stage, graph), height=300)
live(stage, tour, graph)
