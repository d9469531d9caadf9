"""Validation scores as the pages state a conclusion from them: each score with the number
of examples behind it and its 95% interval (dashboard.data.Score), and whether a change
between two of them is more than those examples can tell apart."""

from __future__ import annotations

import streamlit as st

from dashboard import data
from dashboard.views.validation import change_sentence


def fork_validation(db: str, parent: str, fork: str, step: int,
                    labels: tuple[str, str] = ("this run", "fork")) -> None:
    """The parent's and the fork's validation at the step the fork starts from (the fork's
    re-measured with its edited prompts), then the conclusion, with n and intervals."""
    mine, theirs = data.validation_at(db, parent, step), data.validation_at(db, fork, step)
    st.markdown(f"Validation at step {step}: {labels[0]} {mine.text()}; {labels[1]} "
                f"{theirs.text()}.")
    verdict, sentence = change_sentence(mine, theirs)
    if verdict:
        (st.success if verdict == "rose" else st.info)(sentence)
