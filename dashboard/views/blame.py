"""Checking the blame in one click, from any page that shows a step: a button starts
`python -m engine blame RUN --step S [--examples val]` in the background (follow the
gradient at every LLM node, and run each node's proposed edit alone, on every failing
example of the chosen split), its progress shows live, and the page rereads the probes
when it ends. One slot per (run, step), so the Graph page, the Examples page, the
inspector and the Learn tour all see the same job.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/blame.py."""

from __future__ import annotations

from engine.data.stats import bracketed, wilson

LABEL = "Check the blame"



def slot(run: str, step: int) -> str:
    return f"blame|{run}|{int(step)}"



# `blame --examples` choices the button offers, and what each costs and buys
EXAMPLES = {
    "failing": "failing training examples",
    "val": "failing validation examples",
}

EXAMPLES_HELP = (
    "Training: the step's failing training examples. The update call saw the "
    "back-propagated ones, so a proposed edit is counted only on the others (fixed or "
    "not, those it saw are no evidence), and with few examples the intervals stay wide. "
    "Validation: examples the update call never saw, so each node's proposed edit is "
    "tested out of sample; each failing one first needs a backward pass of its own, so "
    "the check takes longer.")



def interval_text(flips: object, probed: object) -> str:
    """A probe count's 90% Wilson interval as blame prints it ("[0.60, 1.00]"), or "–" when
    nothing was probed."""
    n = int(probed) if isinstance(probed, int | float) and probed == probed else 0
    if n <= 0:
        return "–"
    return bracketed(wilson(int(flips or 0), n))



def blame_cell(blame: object, probes: object, leaked: object = None,
               in_sample: object = None) -> str:
    """The Examples table's blame column: which nodes' probes raised the example's score
    (as `engine blame` credits them), or which of the two empty cases it is; gains that
    leaked the target or came from an edit the update call wrote after seeing this
    example are named apart, never as blame."""
    count = int(probes) if isinstance(probes, int | float) and probes == probes else 0
    if count == 0:
        return "not probed"
    parts = [blame] if isinstance(blame, str) and blame else [
        f"probed ({count}), nothing fixed it"]
    if isinstance(leaked, str) and leaked:
        parts.append(f"leaked the target: {leaked}")
    if isinstance(in_sample, str) and in_sample:
        parts.append(f"in-sample edit: {in_sample}")
    return " · ".join(parts)



APPLIED_KEY = "_blame_seen"  # blame jobs whose end a page has already acted on


NO_EDIT = "no edit to probe"  # the node's update left its prompt as it was


def unprobed_edit(edited: bool) -> str:
    """A node's edit with no probe, in one wording on every page: "no edit to probe" when
    its update left the prompt as it was (there is nothing to run), else "not probed"."""
    return "not probed" if edited else NO_EDIT
