"""Live follow (issue 11, item 5): which step a page shows while a run is running, and
where the run is (step, phase, calls done against calls expected). Pure functions, so
they are tested without Streamlit."""

from __future__ import annotations

import re
from dataclasses import dataclass

PHASES = ("forward", "loss", "backward", "update", "gate", "test")
# The engine's plain progress lines in a job's log (`engine.events.Progress` printed by
# the CLI when its output is a file), e.g. "step 1 backward: 12/40 calls (96 in all)".
_PROGRESS = re.compile(
    r"^step (?P<step>\d+) (?P<phase>" + "|".join(PHASES) + r")\b[^\d\n]*"
    r"(?P<done>\d+)\s*(?:/|of)\s*(?P<expected>\d+) calls(?:\D+(?P<total>\d+) in all)?",
    re.M)
_STEP_DONE = re.compile(r"^step (?P<step>\d+) done\b.*?(?:(?P<total>\d+) calls so far)?$",
                        re.M)


@dataclass(frozen=True)
class Progress:
    """Where a running run is. phase None: not known from the log (yet)."""

    step: int | None
    phase: str | None
    calls_done: int
    calls_expected: int
    calls_total: int | None

    def line(self, steps_written: int, steps_total: int | None) -> str:
        """One human line: '1 of 5 steps written · now step 2: backward, 12 of 40 calls'.
        Steps count optimization steps (step 0, the baseline, is not one), as the Runs
        table's steps column does (see dashboard.data.steps_done)."""
        parts = [steps_line(steps_written, steps_total)]
        if self.step is not None and self.phase:
            calls = (f"{self.calls_done} of {self.calls_expected} calls" if
                     self.calls_expected else f"{self.calls_done} calls")
            parts.append(f"now step {self.step}: {self.phase}, {calls}")
        elif self.calls_total is not None:
            parts.append(f"{self.calls_total} calls so far")
        return " · ".join(parts)


def parse_progress(log: str) -> Progress:
    """The newest progress the engine printed into a job's log."""
    text = "\n".join(row.rsplit("\r", 1)[-1] for row in log.splitlines())
    last = None
    for match in _PROGRESS.finditer(text):
        last = match
    done = None
    for match in _STEP_DONE.finditer(text):
        done = match
    if last is not None and (done is None or last.start() > done.start()):
        total = last.group("total")
        return Progress(int(last.group("step")), last.group("phase"), int(last.group("done")),
                        int(last.group("expected")), int(total) if total else None)
    if done is not None:
        total = done.group("total")
        return Progress(int(done.group("step")) + 1, None, 0, 0, int(total) if total else None)
    return Progress(None, None, 0, 0, None)


def follow_step(step_ids: list[int], current: int | None, following: bool) -> int | None:
    """The step a page shows: the newest one while following a running run, else the
    current choice while it is still valid, else the newest."""
    if not step_ids:
        return None
    if following or current not in step_ids:
        return max(step_ids)
    return current



def steps_line(written: int, total: int | None) -> str:
    """'1 of 2 steps written': optimization steps written of those planned."""
    plural = "" if total == 1 else "s"
    return f"{written} of {total if total is not None else '?'} step{plural} written"
