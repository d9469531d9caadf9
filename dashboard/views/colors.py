"""Node colours for a chosen per-step quantity, shared by the pyvis graph and the node chart."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dashboard.views.text import chars

QUANTITIES = {
    "blame": "Blame from probes",
    "grad_chars": "Gradient length (mean characters)",
    "edit": "Edit accepted or rejected",
}
EDIT_COLORS = {"accepted": "#66bb6a", "rejected": "#ef5350", "unchanged": "#ffd54f"}
NO_DATA = "#d9d9d9"


@dataclass(frozen=True)
class Coloring:
    colors: dict[str, str]
    captions: dict[str, str]
    legend: str


def _blend(c1: tuple[int, int, int], c2: tuple[int, int, int], t: float) -> str:
    r, g, b = (round(a + (b - a) * t) for a, b in zip(c1, c2))
    return f"#{r:02x}{g:02x}{b:02x}"


def red_green(share: float) -> str:
    """0 -> green, 0.5 -> amber, 1 -> red."""
    share = min(max(share, 0.0), 1.0)
    green, amber, red = (102, 187, 106), (255, 202, 40), (239, 83, 80)
    return _blend(green, amber, share * 2) if share <= 0.5 else _blend(amber, red,
                                                                       (share - 0.5) * 2)


def reds(t: float) -> str:
    """0 -> pale rose (probed, not blamed), 1 -> deep red (blamed)."""
    return _blend((255, 235, 238), (183, 28, 28), min(max(t, 0.0), 1.0))


def blues(t: float) -> str:
    """0 -> pale blue, 1 -> deep blue."""
    return _blend((227, 242, 253), (21, 101, 192), min(max(t, 0.0), 1.0))


def _missing(value: object) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def color_nodes(rows: list[dict], quantity: str) -> Coloring:
    """Colours and short captions per node from `reader.node_step_stats` rows."""
    colors: dict[str, str] = {}
    captions: dict[str, str] = {}
    if quantity == "blame":
        return _blame(rows)
    if quantity == "fail_share":
        for r in rows:
            v = r.get("fail_share")
            if not _missing(v):
                colors[r["node_id"]] = red_green(float(v))
                captions[r["node_id"]] = f"{float(v):.0%} failing"
        return Coloring(colors, captions, "green: no failing example · red: all failing")
    if quantity == "grad_chars":
        values = {r["node_id"]: float(r["grad_chars"]) for r in rows
                  if not _missing(r.get("grad_chars"))}
        top = max(values.values(), default=0.0) or 1.0
        for node, v in values.items():
            colors[node] = blues(v / top)
            captions[node] = f"∇ {chars(v)}"
        return Coloring(colors, captions, "darker: longer aggregated gradient · grey: none")
    if quantity == "edit":
        for r in rows:
            edit = r.get("edit")
            if isinstance(edit, str) and edit in EDIT_COLORS:
                colors[r["node_id"]] = EDIT_COLORS[edit]
                captions[r["node_id"]] = f"edit {edit}"
        return Coloring(colors, captions,
                        "green: edit accepted · red: rejected by the gate · yellow: prompt "
                        "kept · grey: no update")
    raise ValueError(f"unknown quantity {quantity!r}")


def _blame(rows: list[dict]) -> Coloring:
    """Per node, from the probes: the share of probed failing examples that following the
    node's gradient (or replacing its output) turned correct. Red: the probes blame it."""
    colors: dict[str, str] = {}
    captions: dict[str, str] = {}
    for r in rows:
        probed = r.get("probed")
        if _missing(probed) or not probed:
            continue
        flips = 0 if _missing(r.get("flips")) else int(r["flips"])
        colors[r["node_id"]] = reds(flips / int(probed))
        captions[r["node_id"]] = f"fixes {flips}/{int(probed)}"
    return Coloring(colors, captions,
                    "fixes k/n: of n failing examples probed at this node, following its "
                    "gradient turned k correct · deeper red: the probes blame this node more · "
                    "grey: not probed yet")
