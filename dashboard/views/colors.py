"""Node colours for a chosen per-step quantity, shared by the pyvis graph and the node chart."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dashboard.views.blame import NO_EDIT
from dashboard.views.text import chars
from engine.probes.verdict import NodeFact

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


def color_nodes(rows: list[dict], quantity: str,
                facts: list[NodeFact] | None = None) -> Coloring:
    """Colours and short captions per node from `reader.node_step_stats` rows; "blame"
    from the verdict's per-node `facts` instead (`blame_coloring`)."""
    colors: dict[str, str] = {}
    captions: dict[str, str] = {}
    if quantity == "blame":
        if facts is None:
            raise ValueError("blame colours come from the verdict's facts (logged_blame)")
        return blame_coloring(facts)
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


BLAMED = reds(1.0)  # the node the verdict names
TIED = "#6a1b9a"  # every node the verdict ties on: one colour, none above the others
EVIDENCE = {"gradient": "∇ fixes", "edit": "edit fixes"}
LEGEND_EVIDENCE = {
    "gradient": "following its gradient turned k correct",
    "edit": "its proposed prompt, run alone, turned k correct",
}


def blame_caption(fact: NodeFact) -> str:
    """A node's label line under "blame": the count the verdict weighed for it, and what
    the verdict says of it ("blamed", "tie"); "" when it was not compared."""
    count = f"{fact.flips}/{fact.counted}"
    if fact.standing in ("blamed", "tied"):
        return f"{'blamed' if fact.standing == 'blamed' else 'tie'} · " \
               f"{EVIDENCE[fact.kind]} {count}"
    if fact.standing == "weighed":
        return f"{EVIDENCE[fact.kind]} {count}"
    if fact.standing == "unchanged":  # compared as 0 of n, as the verdict does
        return NO_EDIT
    if fact.standing == "copied":
        return "edit copied examples"
    return ""


def blame_coloring(facts: list[NodeFact]) -> Coloring:
    """Colours and labels per node from the verdict's own facts (engine.probes.verdict
    `weighed`, via `logged_blame`): the node it names deep red, every node it ties on the
    one tie colour, the others a rose as pale as the share of failing examples their
    count fixed (never as deep as a named node), and each label the very count the
    verdict weighed, of the probes it weighed."""
    compared = [f for f in facts if f.standing not in ("copied", "not probed")]
    colors: dict[str, str] = {}
    captions: dict[str, str] = {}
    for fact in facts:
        if fact.standing == "copied" and not compared:
            continue
        caption = blame_caption(fact)
        if caption:
            captions[fact.node] = caption
        if fact.standing == "blamed":
            colors[fact.node] = BLAMED
        elif fact.standing == "tied":
            colors[fact.node] = TIED
        elif fact.standing in ("weighed", "unchanged"):
            colors[fact.node] = reds(0.5 * (fact.share or 0.0))
    if not compared:
        return Coloring(colors, captions, "grey: not probed yet: check the blame to colour "
                                          "the nodes by what the probes fix")
    kind = compared[0].kind
    parts = [f"{EVIDENCE[kind]} k/n: of n failing examples probed at this node, "
             f"{LEGEND_EVIDENCE[kind]} (the counts the verdict weighs)"]
    if any(f.standing == "blamed" for f in facts):
        parts.append("deep red: the node the probes blame")
    if any(f.standing == "tied" for f in facts):
        parts.append("purple: a tie, the fault lies in one or more of these nodes")
    parts.append("pale to mid rose: the share fixed, not named")
    if any(f.standing == "unchanged" for f in facts):
        parts.append("unchanged: its update left the prompt as it was, so its edit fixes none")
    parts.append("grey: not compared")
    return Coloring(colors, captions, " · ".join(parts))
