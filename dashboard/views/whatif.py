"""The node inspector's "What if" panel and "Fork from here" button.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/whatif.py."""

from __future__ import annotations

import pandas as pd

KINDS = {"output": "Edit the output", "gradient": "Follow the gradient",
         "edit": "Apply a prompt"}

SHOWN_PROBES = 5



def prompt_after(history: pd.DataFrame, node: str, step: int) -> str:
    """The node's prompt in force after `step`: its latest accepted version up to then."""
    rows = history[(history["node_id"] == node) & (history["step"].fillna(0) <= step)]
    kept = rows[rows["accepted"].fillna(False).astype(bool) | (rows["version"] == 0)]
    return str(kept.sort_values("version").iloc[-1]["prompt"]) if not kept.empty else ""



def flip_label(before: object, after: object, in_sample: bool = False) -> str:
    """'fixed' / 'broken' / 'unchanged' from two scores (1 is correct). `in_sample`: an
    edit probe on an example the step's update call saw, whose flip is no credit (blame
    shows it apart)."""
    b, a = _score(before), _score(after)
    if b is None or a is None:
        return "not scored"
    if b < 1 <= a and in_sample:
        return "fixed in-sample: the update call saw this example, so no credit"
    if b < 1 <= a:
        return "fixed: the example now passes"
    if a < 1 <= b:
        return "broken: the example now fails"
    return "score changed" if a != b else "unchanged: the answer did not flip"



def _score(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if pd.isna(number) else number
