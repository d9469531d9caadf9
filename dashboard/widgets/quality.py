"""Gradients that carry no signal: an empty reply, a single word, or a reply that mostly
repeats the backward prompt it was given. A small model (the embedded ones) writes
many of these, and a page that shows a gradient says so beside it rather than presenting
it as advice."""

from __future__ import annotations

import streamlit as st

from dashboard.views.quality import NOISE_NOTE, degenerate, prompt_text


def mark(text: object, messages_json: object = None) -> bool:
    """Under a shown gradient: a warning naming why it is degenerate. True when it was."""
    why = degenerate(text, prompt_text(messages_json))
    if why is None:
        return False
    st.warning(f"Degenerate gradient ({why}). {NOISE_NOTE}", icon=":material/blur_on:")
    return True
