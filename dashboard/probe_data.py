"""Cached reads of the counterfactual probes and of live progress, for the
pages: the same stamp-keyed caching as `dashboard.data` (pages write no SQL)."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from dashboard.data import CACHE_OPTIONS, Stamp, stamp
from engine.runlog import reader


@st.cache_data(**CACHE_OPTIONS)
def _probes(db: str, run_id: str, step: int | None, example_id: str | None,
            node_id: str | None, version: Stamp) -> pd.DataFrame:
    return reader.probe_rows(db, run_id, step, example_id, node_id)


def probes(db: str, run_id: str, step: int | None = None, example_id: str | None = None,
           node_id: str | None = None) -> pd.DataFrame:
    """Probe rows, oldest first (empty for a log without probes)."""
    return _probes(db, run_id, None if step is None else int(step), example_id, node_id,
                   stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _probe_outputs(db: str, probe_id: str, version: Stamp) -> pd.DataFrame:
    return reader.probe_outputs(db, probe_id)


def probe_outputs(db: str, probe_id: str) -> pd.DataFrame:
    return _probe_outputs(db, probe_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _edited(db: str, run_id: str, step: int, version: Stamp) -> frozenset[str]:
    from engine.probes.verdict import proposal_kind
    from engine.runlog.probing import chosen_updates

    rows = chosen_updates(reader.step_updates(db, run_id, step).to_dict("records"))
    return frozenset(r["node_id"] for r in rows if proposal_kind(
        (r.get("old_prompt") or "", r.get("new_prompt") or "",
         r.get("reject_reason") if isinstance(r.get("reject_reason"), str) else "")
    ) == "proposed")


def edited(db: str, run_id: str, step: int) -> frozenset[str]:
    """The nodes whose update at the step proposed an edit blame can run (the kept or
    best candidate's, changed, not a copy of training examples)."""
    return _edited(db, run_id, int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _sampled(db: str, run_id: str, step: int, version: Stamp) -> list[str]:
    from engine.runlog.probing import sampled_examples

    return sampled_examples(db, run_id, step)


def sampled(db: str, run_id: str, step: int) -> list[str]:
    """The examples the step back-propagated (its update call saw them): an edit probe's
    flip on one is in-sample, no credit (blame shows them apart)."""
    return _sampled(db, run_id, int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _node_blame(db: str, run_id: str, step: int, version: Stamp) -> pd.DataFrame:
    return reader.node_blame(db, run_id, step)


def node_blame(db: str, run_id: str, step: int) -> pd.DataFrame:
    """Per node: failing examples probed, flips by following the gradient (or a replaced
    output), flips by the node's edit alone (see reader.node_blame)."""
    return _node_blame(db, run_id, int(step), stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _step_calls(db: str, run_id: str, step: int, version: Stamp) -> pd.DataFrame:
    return reader.step_calls_by_purpose(db, run_id, step)


def step_calls(db: str, run_id: str, step: int) -> dict[str, int]:
    """Calls per purpose (forward, loss, backward, update, ...) written for one step."""
    frame = _step_calls(db, run_id, int(step), stamp(db))
    return {str(p): int(c) for p, c in zip(frame["purpose"], frame["calls"])}


@st.cache_data(**CACHE_OPTIONS)
def _train_texts(db: str, run_id: str, version: Stamp) -> tuple[str, ...]:
    frame = reader.split_fields(db, run_id, "train")
    texts: list[str] = []
    for raw in frame["fields"]:
        try:
            fields = json.loads(raw) if isinstance(raw, str) else dict(raw or {})
        except (TypeError, ValueError):
            continue
        texts += [str(v) for v in fields.values() if isinstance(v, str)]
    return tuple(texts)


MIN_COPY_CHARS = 24  # a shorter shared string is a phrase, not a copied example


def copied_examples(db: str, run_id: str, prompt: str) -> list[str]:
    """Training-example texts (at least MIN_COPY_CHARS long, whitespace-normalised) that
    appear verbatim in `prompt`: for runs logged before updates.reject_reason."""
    flat = " ".join(str(prompt or "").split()).lower()
    found = []
    for text in _train_texts(db, run_id, stamp(db)):
        norm = " ".join(text.split()).lower()
        if len(norm) >= MIN_COPY_CHARS and norm in flat:
            found.append(text)
    return found


@st.cache_data(**CACHE_OPTIONS)
def _function_nodes(db: str, run_id: str, version: Stamp) -> dict[str, tuple[str, str]]:
    import yaml

    from engine.core.functions import FUNCTIONS

    record = reader.run_record(db, run_id) or {}
    try:
        spec = yaml.safe_load(record.get("graph_yaml") or "") or {}
    except yaml.YAMLError:
        return {}
    found = {}
    for node in spec.get("nodes") or []:
        if isinstance(node, dict) and node.get("kind") == "function":
            name = str(node.get("function") or "")
            doc = (FUNCTIONS[name].__doc__ or "") if name in FUNCTIONS else ""
            found[str(node.get("id"))] = (name, str(node.get("description") or doc).strip())
    return found


def function_node(db: str, run_id: str, node_id: str) -> tuple[str, str] | None:
    """(function name, description) of a function node, from the run's logged graph."""
    return _function_nodes(db, run_id, stamp(db)).get(node_id)


COPY_REASON = "copies training examples"


def copies_training(db: str, run_id: str, update: dict) -> list[str]:
    """Why a proposal is flagged for copying training examples: the engine's reason, or
    the training texts found verbatim in its new prompt (older runs); [] when clean."""
    reason = update.get("reject_reason")
    found = copied_examples(db, run_id, str(update.get("new_prompt") or ""))
    if isinstance(reason, str) and COPY_REASON in reason and not found:
        return [reason]
    return found


@st.cache_data(**CACHE_OPTIONS)
def _edit_origin(db: str, run_id: str, step: int, node_id: str, version: Stamp) -> str | None:
    from engine.runlog.probing import proposal_origin

    return proposal_origin(db, run_id, step, node_id)


def edit_origin(db: str, run_id: str, step: int, node_id: str) -> str | None:
    """Where the edit blame probes for a node came from, when it is not the kept
    candidate's (engine.runlog.probing.proposal_origin); None otherwise."""
    return _edit_origin(db, run_id, int(step), node_id, stamp(db))


@st.cache_data(**CACHE_OPTIONS)
def _blame_estimate(db: str, run_id: str, step: int, examples: str, version: Stamp) -> str:
    from engine.probes.estimate import estimate_from_log

    try:
        return estimate_from_log(db, run_id, step, examples)
    except Exception:  # noqa: BLE001 - an estimate is a courtesy: the button still works
        return ""


def blame_estimate(db: str, run_id: str, step: int, examples: str) -> str:
    """What blame on the step's `examples` would cost at most, before it starts (the line
    `blame` prints first), from the run log alone."""
    return _blame_estimate(db, run_id, int(step), examples, stamp(db))
