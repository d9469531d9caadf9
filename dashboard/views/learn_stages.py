"""The Learn tour's text and its data-driven stages: every sentence that names a node, a
target or a score is computed from the run it shows, so the text cannot contradict the
data beside it.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/learn_stages.py."""

from __future__ import annotations

import pandas as pd

from dashboard import data
from dashboard.state import Selection
from dashboard.views.text import code, fmt, md
from engine.events import same_prompt
from engine.methods import METHODS

STAGES = ["The graph", "Forward pass", "Loss", "Semantic gradient", "Without siblings",
          "Update", "The gate", "Check the blame", "Fix it yourself", "Explore"]

# methods whose gradients never see the other inputs of the same node, as they declare it
SIBLING_BLIND = tuple(sorted(name for name, m in METHODS.items()
                             if m.uses_gradients and not m.sibling_aware))

PAIR_SLOT = "learn_pair"

FIX_SLOT = "learn_fix"



def node_names(items: list[str]) -> str:
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
        reads = node_names(list(dict(model.inputs).get(node, ())))
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
            f"({node_names(llm)}) should have been different. That call sees all of "
            f"{code(model.output)}'s inputs together: for {code(llm[0])} its *siblings* are "
            f"{node_names(others) if others else 'none'}. Just as the derivative of x₁·x₂ with "
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
        shown = node_names(siblings)
        if method == "textgrad":
            return f" (one backward call per input: {code(node)}'s leaves out {shown})"
        return f" (the same call without {shown}'s output)"
    if method == "textgrad":
        return " (can differ on this graph: one backward call per input)"
    return (f" (the same backward prompt here: {code(node)} has no LLM-produced sibling)")



def gradient_row(db: str, run: str, step: int, example: str, node: str,
                  kind: str = "gradient") -> dict | None:
    """The first gradient row of `kind` the node received: 'gradient' (the run's own), or
    'contrast' (a sibling-blind method's, written beside it on the same forward pass)."""
    received = data.node_view(db, run, step, example, node)["received"]
    rows = received[received["kind"] == kind]
    return None if rows.empty else rows.iloc[0].to_dict()



def proposals_of(db: str, run: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A run's changed proposals: (accepted, rejected)."""
    updates = data.updates(db, run)
    changed = updates[[not same_prompt(o, n) for o, n in
                       zip(updates["old_prompt"].fillna(""), updates["new_prompt"].fillna(""))]]
    kept = changed["accepted"].fillna(False).astype(bool)
    return changed[kept], changed[~kept]



EDIT_COLUMN = "ran with its proposed prompt"

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


def not_probed_here(probed_elsewhere: int) -> str:
    """A node the step's probes never touched on this example: "not probed yet" when the
    step has no probe at all, else that the blame probed other examples (a validation
    blame's verdict above a training example's table must not read as no blame at all)."""
    if not probed_elsewhere:
        return "not probed yet"
    return (f"not probed on this example (the step's probes are on {probed_elsewhere} "
            f"other example{'' if probed_elsewhere == 1 else 's'}: see the pooled verdict)")
