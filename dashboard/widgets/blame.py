"""Checking the blame in one click, from any page that shows a step: a button starts
`python -m engine blame RUN --step S [--examples val]` in the background (follow the
gradient at every LLM node, and run each node's proposed edit alone, on every failing
example of the chosen split), its progress shows live, and the page rereads the probes
when it ends. One slot per (run, step), so the Graph page, the Examples page, the
inspector and the Learn tour all see the same job."""

from __future__ import annotations

import streamlit as st

from dashboard import data, jobs, probe_data
from dashboard.views.blame import APPLIED_KEY, EXAMPLES, EXAMPLES_HELP, LABEL, interval_text, slot
from dashboard.views.text import code
from dashboard.widgets import job_watch
from engine.probes.verdict import logged_verdict


def _running_elsewhere(db: str, run: str) -> list[jobs.Job]:
    """Running blame jobs of this run started from another page or another session."""
    return [j for j in jobs.probe_jobs(db, run) if j.kind == "blame" and j.returncode is None]



def examples_choice(db: str, run: str, *, key: str) -> str:
    """Which examples the blame button probes: a choice between the step's failing training
    and validation examples, each labelled with its split's size; "failing" when the run
    has no validation split."""
    sizes = data.split_sizes(db, run)
    offered = [name for name, split in (("failing", "train"), ("val", "val"))
               if sizes.get(split)]
    if len(offered) < 2:
        return "failing"
    counts = {"failing": sizes["train"], "val": sizes["val"]}
    # kept apart from the widget's own state, which Streamlit drops while a job runs and
    # the choice is not drawn
    kept = f"_{key}_examples_kept"
    chosen = st.radio("Examples to probe", offered, key=f"{key}_examples", horizontal=True,
                      index=offered.index(st.session_state.get(kept, "failing")),
                      format_func=lambda c: f"{EXAMPLES[c]} (of {counts[c]})",
                      help=EXAMPLES_HELP) or "failing"
    st.session_state[kept] = chosen
    return chosen



def blame_button(db: str, run: str, step: int, *, key: str, label: str = LABEL,
                 primary: bool = False) -> bool:
    """The choice of examples and the button, or the live progress of the blame job it
    started; True while one runs."""
    watched = job_watch.follow(slot(run, step), extra=lambda: _running_elsewhere(db, run))
    if any(job.returncode is None for job in watched):
        return True
    examples = examples_choice(db, run, key=key)
    flag = None if examples == "failing" else examples  # `failing` is blame's default
    command = f"python -m engine blame {run} --step {step}" + (f" --examples {flag}"
                                                                if flag else "")
    estimate = probe_data.blame_estimate(db, run, step, examples)
    if estimate:
        st.caption(estimate.removeprefix("blame: ").replace("--exhaustive", "exhaustive "
                                                             "blame (the command line)"))
    if st.button(label, key=key, type="primary" if primary else "secondary",
                 icon=":material/troubleshoot:",
                 help=f"Follow the gradient at every node, and run each node's proposed "
                 f"edit alone, on every {EXAMPLES[examples][:-1]} of step {step} "
                 f"({command}), in the background"):
        job = jobs.start_blame(run, db, step, flag)
        job_watch.remember(slot(run, step), job)
        st.rerun()
    return False



def show_verdict(db: str, run: str, step: int, counts: list[dict], llm: list[str]) -> None:
    """What `engine blame`'s rule names from every probe logged at the step (`counts`: the
    rows of probe_data.node_blame; `llm`: the graph's LLM nodes): one node, a tie, or no
    node and why. The Learn tour's blame stage and the Graph page show this same sentence."""
    found, evidence = logged_verdict(counts, data.updates(db, run, step).to_dict("records"),
                                     llm)
    if found.node:
        by = "its gradient" if evidence == "gradient" else "its proposed prompt"
        row = next((r for r in counts if r["node_id"] == found.node), {})
        flips, probed = (row.get("flips"), row.get("probed")) if evidence == "gradient" \
            else (row.get("edit_flips"), row.get("edit_probed"))
        # the counts the verdict rests on: a node's label counts gradient fixes only
        rests = (f" ({'gradient' if evidence == 'gradient' else 'edit alone'}: "
                 f"{int(flips or 0)}/{int(probed or 0)}, 90% {interval_text(flips, probed)})")
        origin = probe_data.edit_origin(db, run, step, found.node) \
            if evidence == "edit" else None
        st.success(f"The probes blame {code(found.node)}: following {by} fixes failing "
                   f"examples, and its 90% interval lies above every other node's{rests}."
                   + (f" The prompt probed is from {origin}." if origin else ""))
    elif found.tied:
        st.warning(f"The probes tie on {' and '.join(code(n) for n in found.tied)}: "
                   f"{found.reason}.")
    else:
        st.info(f"The probes name no node yet: {found.reason}.")



def just_finished(run: str, step: int) -> bool:
    """True once, on the first page run after a blame job of (run, step) that this session
    started ended well: the Graph page then switches its colours to the new blame."""
    seen = st.session_state.setdefault(APPLIED_KEY, set())
    done = [job.log for job in job_watch.watched(slot(run, step)) if job.returncode == 0]
    fresh = [log for log in done if log not in seen]
    seen.update(fresh)
    return bool(fresh)
