"""The sidebar's live follow: while the selected run is running, the step picker follows
the newest step until the user picks one (pins it); a fragment polls the run log and the
job's log, shows the phase and calls done against calls expected, and reruns the app
when a step lands. Only the fragment refreshes every two seconds, so no panel is drawn
twice while a run is followed."""

from __future__ import annotations

import json

import streamlit as st

from dashboard import data, jobs, links
from dashboard.live import follow_step, live_progress

FOLLOW_KEY = "_follow"  # run id -> following (bool), this session
TOGGLE_KEY = "follow_newest"


def _state() -> dict[str, bool]:
    return st.session_state.setdefault(FOLLOW_KEY, {})


def following(run: str, status: str) -> bool:
    """Whether the pages follow this run's newest step. A running run is followed from
    the first look, unless the link pins a step (`step=` without `follow=1`)."""
    if status != "running":
        return False
    state = _state()
    url_step = links.from_url("step")  # a step the address brought (a link), not ours
    if run not in state or url_step is not None:
        state[run] = url_step is None or links.flag(st.query_params.get("follow", "0"))
    return state[run]


def pin(run: str) -> None:
    """The step picker's callback: a step chosen by hand stops the following."""
    _state()[run] = False
    st.session_state[TOGGLE_KEY] = False


def _toggled(run: str) -> None:
    _state()[run] = bool(st.session_state.get(TOGGLE_KEY))


def follow_newest(run: str, status: str, step_ids: list[int]) -> bool:
    """Before the step picker is drawn: move it to the newest step while following, and
    draw the Follow toggle. Returns whether the view follows."""
    follow = following(run, status)
    if status == "running":
        st.session_state[TOGGLE_KEY] = follow
        st.toggle("Follow the newest step", key=TOGGLE_KEY, on_change=_toggled, args=(run,),
                  help="On while the run is running; picking a step pins it")
    if follow:
        st.session_state["step"] = follow_step(step_ids, st.session_state.get("step"), True)
    return follow


def planned_steps(db: str, run: str) -> int | None:
    """The number of optimization steps the run was started with (its logged config; a
    fork's own steps)."""
    record = data.run(db, run) or {}
    try:
        config = json.loads(record.get("config") or "{}")
    except (TypeError, ValueError):
        return None
    steps = config.get("steps") if isinstance(config, dict) else None
    # a fork's config counts from step 0; its own steps are those after its start
    return int(steps) - data.starting_step(db, run) if isinstance(steps, int | float) else None


def live_line(db: str, run: str) -> str:
    """Steps written, and from the job's log the phase and calls of the step underway."""
    written = data.steps_done(db, run)
    job = jobs.find(db, run)
    progress = live_progress(job.progress_file if job else None)
    return progress.line(written, planned_steps(db, run), data.baseline_done(db, run))


@st.fragment(run_every=2.0)
def live_panel(db: str, run: str, seen: tuple) -> None:
    """While the selected run is running: its progress, refreshed every two seconds; the
    whole app reruns when the run log changes (one transaction per step)."""
    if data.stamp(db) != seen:
        st.rerun(scope="app")
    st.caption(f":material/sync: live · {live_line(db, run)}")
