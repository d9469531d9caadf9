"""Links that hold: the address bar always carries the whole view.

Every script run writes all of the state's query parameters (run, step, example, node
and the page's options), not only those that changed, so a copied address reopens the
same view even after newer runs exist. A parameter the user (or a link) changed since
the last write wins over the session's value; a parameter naming something that does
not exist produces a visible warning and the nearest valid view, never silently
another run.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

import streamlit as st

WRITTEN_KEY = "_url_written"  # the query parameters this session wrote last
WARNINGS_KEY = "_link_warnings"  # warnings about the address, shown above the page
# Page options as last chosen, outside the widgets' own state: Streamlit drops a widget's
# value when a run does not draw it (another page), and a filter must survive a visit to
# another page.
OPTIONS_KEY = "_page_options"


def _written() -> dict[str, str]:
    return st.session_state.setdefault(WRITTEN_KEY, {})


def from_url(key: str) -> str | None:
    """The URL's value for `key` when it changed since this session last wrote it (a
    deep link, a page link, or an edited address), else None."""
    value = st.query_params.get(key)
    if value is None or value == _written().get(key):
        return None
    return value


def warn(message: str) -> None:
    st.session_state.setdefault(WARNINGS_KEY, []).append(message)


def choose(key: str, options: list, default: Any, *, cast: Callable = str,
           what: str = "", nearest: Callable[[Any], Any] | None = None) -> Any:
    """Set st.session_state[key] (before its picker is drawn): the URL's new value when it
    names a valid option; else the session's value when still valid; else `default`.
    A URL value that names nothing valid adds a warning (`what` names the kind of thing)
    and falls back to nearest(value) when given, else to `default`."""
    wanted = from_url(key)
    if wanted is not None:
        try:
            value = cast(wanted)
        except (TypeError, ValueError):
            value = None
        if value in options:
            st.session_state[key] = value
            return value
        fallback = nearest(value) if nearest and value is not None else default
        warn(f"The link names {what or key} `{wanted}`, which does not exist here; "
             f"showing {what or key} `{fallback}` instead.")
        st.session_state[key] = fallback
        return fallback
    if st.session_state.get(key) not in options:
        st.session_state[key] = default
    return st.session_state[key]


def nearest_number(options: list[int]) -> Callable[[Any], Any]:
    """The option closest to a number (ties: the lower one)."""
    return lambda value: min(options, key=lambda o: (abs(o - value), o)) if options else None


def write(params: dict[str, Any]) -> None:
    """Write these query parameters now (None removes one) and remember them."""
    written = _written()
    for key, value in params.items():
        if value is None:
            if key in st.query_params:
                del st.query_params[key]
            written.pop(key, None)
        else:
            text = str(value)
            # A page link to the page it is on hands the script its new parameters but
            # leaves the browser's address as it was: one this session has not written
            # yet is written again, so the address (and Copy link) follows
            if st.query_params.get(key) != text or written.get(key) != text:
                st.query_params[key] = text
            written[key] = text


def flag(text: str) -> bool:
    """A boolean page option as written in the address (`1`/`0`)."""
    return str(text).lower() in ("1", "true", "yes", "on")


def page_option(key: str, default: Any, options: list | None = None, *,
                cast: Callable = str) -> Any:
    """A page option kept in the address bar (a filter, a search, a tab), set in
    st.session_state[key] before its widget is drawn: the URL's new value when valid,
    else the session's, else `default`; written back to the address every run."""
    wanted = from_url(key)
    if wanted is not None:
        try:
            value = cast(wanted)
        except (TypeError, ValueError):
            value = None
        if value is None or (options is not None and value not in options):
            warn(f"The link's `{key}={wanted}` is not a valid option here; showing "
                 f"`{default}` instead.")
            value = default
        st.session_state[key] = value
    else:
        kept = st.session_state.setdefault(OPTIONS_KEY, {})
        if key not in st.session_state and key in kept:  # back from another page
            st.session_state[key] = kept[key]
        if key not in st.session_state or (options is not None
                                           and st.session_state[key] not in options):
            st.session_state[key] = default
    value = st.session_state[key]
    st.session_state.setdefault(OPTIONS_KEY, {})[key] = value
    write({key: int(value) if isinstance(value, bool) else value})
    return value


def show_warnings() -> None:
    """The address's warnings for this script run (then forgotten)."""
    for message in st.session_state.pop(WARNINGS_KEY, []):
        st.warning(message, icon=":material/link_off:")


COPY_HTML = """<div style="font-family:sans-serif;font-size:14px">
<button id="copy" style="padding:4px 10px;border:1px solid #888;border-radius:6px;
 background:#fff;color:#111;cursor:pointer">Copy link</button>
<span id="done" style="margin-left:6px;color:#1a6b2a"></span>
<input id="url" readonly style="display:none;width:95%;margin-top:4px">
</div>
<script>
const button = document.getElementById("copy");
button.addEventListener("click", async () => {
  const url = window.parent.location.href;  // read at click time: the whole state
  const done = document.getElementById("done");
  try {
    await navigator.clipboard.writeText(url);
    done.textContent = "copied";
  } catch (error) {  // no clipboard permission: show the address, selected
    const field = document.getElementById("url");
    field.value = url; field.style.display = "block"; field.select();
    done.textContent = "press Ctrl+C";
  }
});
</script>"""


def copy_link_button(label: str = "Copy link") -> None:
    """A small button that copies the page's address (read in the browser when clicked,
    so it includes every parameter written during the run)."""
    st.iframe(COPY_HTML.replace("Copy link", html.escape(label)), height=64)
