"""Panes showing what happened at one node for one example at one step, reused by the
node inspector, Step through and the Learn tour.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/panes.py."""

from __future__ import annotations

import pandas as pd


def first_row(frame: pd.DataFrame) -> dict | None:
    return None if frame.empty else frame.iloc[0].to_dict()



def number_of(value: object) -> float | None:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return None if pd.isna(number) else number



def candidate_count(updates: pd.DataFrame) -> int:
    """How many candidate prompt sets (--proposals) the update rows come from."""
    if updates.empty or "candidate" not in updates:
        return 1
    return int(updates["candidate"].fillna(0).nunique())
