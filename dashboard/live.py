"""Live follow: which step a page shows while a run is running, and where the run is (step,
phase, calls done against calls expected), read from the typed progress events the engine
process writes. No Streamlit here, so it is tested without it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.runs.progress import read_progress


@dataclass(frozen=True)
class LiveProgress:
    """Where a running run is, as a page shows it. phase None: between steps, or not known
    yet."""

    step: int | None
    phase: str | None
    calls_done: int
    calls_expected: int
    calls_total: int | None

    def line(self, steps_written: int, steps_total: int | None, baseline: bool = False
             ) -> str:
        """One human line: '1 of 5 steps written · now step 2: backward, 12 of 40 calls'.
        Steps count optimization steps (step 0, the baseline, is not one: `baseline` says
        it is written; see dashboard.data.steps_done)."""
        parts = [steps_line(steps_written, steps_total, baseline)]
        if self.step is not None and self.phase:
            calls = (f"{self.calls_done} of {_count(self.calls_expected, 'call')}" if
                     self.calls_expected else _count(self.calls_done, "call"))
            parts.append(f"now step {self.step}: {self.phase}, {calls}")
        elif self.calls_total is not None:
            parts.append(f"{_count(self.calls_total, 'call')} so far")
        return " · ".join(parts)


def live_progress(progress_file: str | Path | None) -> LiveProgress:
    """Where the run is, from the typed progress events its process writes
    (`engine.runs.progress.ProgressFile`)."""
    latest, finished, calls = read_progress(progress_file) if progress_file else (None,) * 3
    if latest is not None:
        return LiveProgress(latest.step, latest.phase, latest.calls_done, latest.calls_expected,
                            latest.calls_total)
    if finished is not None:
        return LiveProgress(finished + 1, None, 0, 0, calls)
    return LiveProgress(None, None, 0, 0, None)


def follow_step(step_ids: list[int], current: int | None, following: bool) -> int | None:
    """The step a page shows: the newest one while following a running run, else the
    current choice while it is still valid, else the newest."""
    if not step_ids:
        return None
    if following or current not in step_ids:
        return max(step_ids)
    return current



def _count(n: int, word: str) -> str:
    """'1 call', '2 calls'."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def steps_line(written: int, total: int | None, baseline: bool = False) -> str:
    """'1 of 2 steps written': optimization steps written of those planned; before the
    first, 'baseline written · 0 of 2 steps' once the baseline (step 0) is logged."""
    plural = "" if total == 1 else "s"
    counted = f"{written} of {total if total is not None else '?'} step{plural}"
    return f"baseline written · {counted}" if baseline and written == 0 else \
        f"{counted} written"
