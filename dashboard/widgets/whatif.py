"""The node inspector's "What if" panel and "Fork from here" button.

Both start engine processes through `dashboard.jobs` (`python -m engine probe ...`,
`python -m engine run --fork ...`); the engine writes the run log, the page only reads
the `probes` and `probe_outputs` rows back."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboard import data, jobs, probe_data
from dashboard.state import Selection
from dashboard.views.text import fmt, md
from dashboard.views.whatif import KINDS, SHOWN_PROBES, flip_label, prompt_after
from dashboard.widgets import job_watch
from dashboard.widgets.text import show_text
from dashboard.widgets.validation import fork_validation


def whatif_panel(sel: Selection, view: dict[str, pd.DataFrame], is_function: bool) -> None:
    """Choose an intervention on (example, node), start the probe, show its results."""
    act = view["activation"]
    output = str(act.iloc[0]["output_text"] or "") if not act.empty else ""
    proposal = view["update"]
    proposed = (str(proposal.iloc[0]["new_prompt"] or "") if not proposal.empty else "")
    kinds = ["output"] if is_function else list(KINDS)
    slot = f"{sel.run}|{sel.step}|{sel.example}|{sel.node}"
    kind = st.radio("Intervention", kinds, format_func=KINDS.get, horizontal=True,
                    key=f"whatif_kind|{slot}")
    text: str | None = None
    if kind == "output":
        text = st.text_area("Replace this node's output with", value=output, height=120,
                            key=f"whatif_output|{slot}")
        st.caption("Its descendants re-run on the new text; the loss scores the new answer.")
    elif kind == "gradient":
        st.caption("The optimizer model rewrites this node's output the way the gradient it "
                   "received says, then its descendants re-run: does following the gradient "
                   "fix the answer?")
    else:
        source = st.radio("Prompt", ["proposed", "mine"], horizontal=True,
                          format_func={"proposed": "the step's proposed edit",
                                       "mine": "a prompt I write"}.get,
                          key=f"whatif_source|{slot}")
        if source == "proposed" and not proposed:
            st.caption("No edit was proposed for this node at this step: write one instead.")
        if source == "mine":
            history = data.prompt_history(sel.db, sel.run)
            text = st.text_area("Prompt for this node alone (others unchanged)",
                                value=proposed or prompt_after(history, sel.node, sel.step),
                                height=120, key=f"whatif_prompt|{slot}")
    disabled = kind == "edit" and text is None and not proposed
    if st.button("Run the probe", key=f"whatif_run|{slot}", disabled=disabled,
                 type="primary"):
        job = jobs.start_probe(jobs.ProbeSpec(run_id=sel.run, db=sel.db, step=sel.step,
                                              node=sel.node, kind=kind, example=sel.example,
                                              text=text))
        st.session_state["_whatif_job"] = job.log
        st.success(f"Probe started: {' '.join(job.command[2:])}")
    if _running(sel):
        _live_results(sel)
    else:
        probe_results(sel)
        _last_failure(sel)



def _running(sel: Selection) -> dict[str, list]:
    """The running jobs that will write probes of this node: its own probes, and blame
    jobs of the run (which probe every node). Another node's probe is not this one's."""
    live = [j for j in jobs.probe_jobs(sel.db, sel.run) if jobs.poll(j)]
    found = {"probe": [j for j in live if j.kind == "probe" and _node_of(j) == sel.node],
             "blame": [j for j in live if j.kind == "blame"]}
    return {kind: js for kind, js in found.items() if js}



def _node_of(job: jobs.Job) -> str | None:
    command = job.command
    return command[command.index("--node") + 1] if "--node" in command[:-1] else None



@st.fragment(run_every=1.5)
def _live_results(sel: Selection) -> None:
    """Poll while a job that probes this node runs; rerun the page once it has ended."""
    running = _running(sel)
    if not running:
        st.rerun(scope="app")
    if "probe" in running:
        st.info(":material/hourglass_top: probe running: results appear here when the "
                "engine has written them")
    else:
        st.info(":material/hourglass_top: blame is running on this run: its probes of this "
                "node appear here when it ends")
    probe_results(sel)



def _last_failure(sel: Selection) -> None:
    """The error line of the newest probe job, when it failed (e.g. `error: ...`)."""
    done = jobs.probe_jobs(sel.db, sel.run)
    if done and done[0].returncode not in (0, None):
        tail = jobs.log_tail(done[0], lines=4)
        st.error(f"The last probe ended with status {done[0].returncode}.")
        st.code(tail, language=None, wrap_lines=True)



def probe_results(sel: Selection) -> None:
    """The newest probes of this node on this example: intervention, re-run downstream
    outputs, score before and after."""
    rows = probe_data.probes(sel.db, sel.run, sel.step, node_id=sel.node)
    rows = rows[rows["example_id"] == sel.example] if not rows.empty else rows
    if rows.empty:
        st.caption("No probe of this node on this example yet.")
        return
    seen = set(probe_data.sampled(sel.db, sel.run, sel.step))  # the update call's examples
    for row in list(rows.to_dict("records"))[::-1][:SHOWN_PROBES]:
        with st.container(border=True):
            verdict = flip_label(row.get("before_score"), row.get("after_score"),
                                 row["kind"] == "edit" and row["example_id"] in seen)
            color = "orange" if "in-sample" in verdict else "green" \
                if verdict.startswith("fixed") else (
                "red" if verdict.startswith("broken") else "gray")
            st.markdown(f"**{md(KINDS.get(row['kind'], row['kind']))}** · score "
                        f"{fmt(row.get('before_score'), '.2f')} → "
                        f"{fmt(row.get('after_score'), '.2f')} · :{color}-badge[{verdict}]")
            if row.get("error") and not pd.isna(row["error"]):
                st.error(f"error: {row['error']}")
            if bool(row.get("leaks_target")) and not pd.isna(row.get("leaks_target")):
                st.warning("The intervention contains the expected answer verbatim: a flip "
                           "here is a leak, not credit.")
            show_text("intervention", row.get("intervention"))
            left, right = st.columns(2)
            with left:
                show_text("before", row.get("before_output"), expanded=True)
            with right:
                show_text("after", row.get("after_output"), expanded=True)
            outputs = probe_data.probe_outputs(sel.db, row["probe_id"])
            for out in outputs.to_dict("records"):
                # the intervened node's own new text is the change, not a re-run
                label = (f"{out['node_id']} (changed by the probe)"
                         if out["node_id"] == row.get("node_id") else
                         f"re-run {out['node_id']}")
                show_text(label, out.get("output_text"))



def fork_panel(sel: Selection, view: dict[str, pd.DataFrame], is_function: bool,
               graph_name: str) -> None:
    """An editable prompt for this node and a button that starts a fork of the run
    from this step (`python -m engine run --fork`)."""
    slot = f"{sel.run}|{sel.step}|{sel.node}"
    prompts: dict[str, str] = {}
    if not is_function:
        history = data.prompt_history(sel.db, sel.run)
        current = prompt_after(history, sel.node, sel.step)
        text = st.text_area(f"Prompt of {sel.node} in the fork", value=current, height=120,
                            key=f"fork_prompt|{slot}")
        if text.strip() and text != current:
            prompts[sel.node] = text
    # 0 is taken as typed (a minimum of 1 would keep the old value behind a red range
    # error and start a one-step fork anyway): the button then says why it cannot start
    steps = st.number_input("Steps to run", min_value=0, max_value=20, value=1,
                            key=f"fork_steps|{slot}")
    watch = f"fork|{sel.run}"
    listed = job_watch.follow(watch)
    if listed and listed[0].returncode == 0:
        fork = listed[0].run_id
        fork_validation(sel.db, sel.run, fork, int(sel.step),
                        labels=("this run", f"fork {md(fork)}"))
        st.page_link("screens/compare.py", label=f"Compare {fork} with this run",
                     icon=":material/compare_arrows:",
                     query_params={"run": fork, "other": sel.run, "step": str(sel.step)})
    if any(job.returncode is None for job in listed):
        return
    if not steps:
        st.caption("A fork runs at least one step: set Steps to run to 1 or more.")
    if st.button("Fork from here", key=f"fork_run|{slot}", disabled=not steps):
        job = jobs.start_fork(jobs.ForkSpec(run_id=sel.run, db=sel.db, step=sel.step,
                                            prompts=prompts, steps=int(steps)),
                              graph_name=graph_name, method=sel.method or "semantic")
        job_watch.remember(watch, job)
        st.rerun()
