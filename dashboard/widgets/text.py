"""Safe text display shared by the pages.

Model-produced text is shown with `st.code` (plain text) or, for diffs, as HTML built by
`dashboard.views.diff`, which escapes every piece; never through Markdown, which would
follow links and load images from a reply."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard.views.diff import diff_html, side_by_side_html
from dashboard.views.text import COLLAPSE_AT


def show_text(label: str, text: object, *, collapse_at: int = COLLAPSE_AT,
              expanded: bool = False) -> None:
    """Show a text as plain text; long ones collapsed behind an expander."""
    value = "" if text is None or (isinstance(text, float) and pd.isna(text)) else str(text)
    if not value:
        st.caption(f"{label}: (empty)")
        return
    if len(value) <= collapse_at:
        st.caption(label)
        st.code(value, language=None, wrap_lines=True)
        return
    with st.expander(f"{label} · {len(value):,} characters", expanded=expanded):
        st.code(value, language=None, wrap_lines=True)



def show_messages(label: str, messages_json: object, *, expanded: bool = False) -> None:
    """Chat-style rendering of a call's messages (the JSON list of {role, content})."""
    try:
        messages = json.loads(messages_json) if isinstance(messages_json, str) else []
    except ValueError:
        messages = []
    if not messages:
        st.caption(f"{label}: not recorded")
        return
    total = sum(len(str(m.get("content", ""))) for m in messages)
    with st.expander(f"{label} · {len(messages)} messages, {total:,} characters",
                     expanded=expanded):
        for message in messages:
            role = str(message.get("role", "user"))
            with st.chat_message("assistant" if role == "assistant" else
                                 "user" if role == "user" else "ai",
                                 avatar=":material/settings:" if role == "system" else None):
                st.caption(role)
                st.code(str(message.get("content", "")), language=None, wrap_lines=True)



def show_diff(old: str, new: str, *, only_changes: bool = False) -> None:
    st.html(diff_html(old or "", new or "", only_changes=only_changes))



def show_side_by_side(old: str, new: str, *, labels: tuple[str, str] = ("before", "after"),
                      only_changes: bool = False, inline: bool = False) -> None:
    """A before | after diff in two columns (removed words red on the left, added green
    on the right), or the inline diff when `inline`."""
    if inline:
        show_diff(old, new, only_changes=only_changes)
        return
    left_html, right_html = side_by_side_html(old or "", new or "", only_changes=only_changes)
    left, right = st.columns(2)
    with left:
        st.caption(labels[0])
        st.html(left_html)
    with right:
        st.caption(labels[1])
        st.html(right_html)
