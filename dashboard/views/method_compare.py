"""Comparing the backward methods on the same traces, from the Learn tour and the Graph
page: a button starts `python -m engine blame RUN --step S --method ... --json` in the
background, its progress shows live, and its JSON report becomes, per node, each method's
gradient efficacy (flips over probed failing examples, with the 90% interval) and one
sentence of what the evidence says. Both pages read the numbers from `comparison_rows`,
so the two cannot disagree. A finished comparison of the step is shown without re-running.

Its pure parts, computed from run-log rows and testable without Streamlit; the
Streamlit pieces that draw it (and start its jobs) are dashboard/widgets/method_compare.py."""

from __future__ import annotations

import pandas as pd

LABEL = "Compare the methods on these traces"



def slot(run: str, step: int) -> str:
    return f"compare|{run}|{int(step)}"



def efficacy(flips: int, probed: int, interval) -> str:
    """'2/3 [25%, 92%]': flips over probed, with the report's 90% interval."""
    low, high = (float(interval[0]), float(interval[1])) if interval else (0.0, 1.0)
    return f"{int(flips)}/{int(probed)} [{low:.0%}, {high:.0%}]"



def comparison_rows(report: dict | None) -> pd.DataFrame:
    """One row per (node, method) of the report's `methods`: flips, probed, the interval
    and the cell both pages show ('flips/probed [low, high]')."""
    rows = [{"node": str(r["node"]), "method": str(r["method"]), "flips": int(r["flips"]),
             "probed": int(r["probed"]), "low": float(r["interval"][0]),
             "high": float(r["interval"][1]),
             "efficacy": efficacy(r["flips"], r["probed"], r["interval"])}
            for r in (report or {}).get("methods") or []]
    return pd.DataFrame(rows, columns=["node", "method", "flips", "probed", "low", "high",
                                       "efficacy"])



def edge_rows(report: dict | None) -> pd.DataFrame:
    """The report's per-edge rows (`edges`, when the engine wrote them), as a table."""
    rows = [{"method": str(r["method"]), "edge": f"{r['source']} → {r['target']}",
             "efficacy": efficacy(r["flips"], r["probed"], r["interval"])}
            for r in (report or {}).get("edges") or []]
    return pd.DataFrame(rows, columns=["method", "edge", "efficacy"])



def by_node(rows: pd.DataFrame) -> pd.DataFrame:
    """node × method table of the efficacy cells."""
    if rows.empty:
        return pd.DataFrame(columns=["node"])
    order = list(dict.fromkeys(rows["method"]))
    table = rows.pivot(index="node", columns="method", values="efficacy")
    nodes = list(dict.fromkeys(rows["node"]))
    return table.reindex(index=nodes, columns=order).reset_index()



def verdict(rows: pd.DataFrame, node: str) -> str:
    """One plain sentence: which method's gradients fixed more failing examples at `node`,
    or that the 90% intervals overlap so the evidence cannot rank them."""
    mine = rows[rows["node"] == node]
    if mine.empty:
        return ""
    shares = mine.assign(share=[f / p if p else 0.0 for f, p in zip(mine["flips"],
                                                                     mine["probed"])])
    best = shares.sort_values("share", ascending=False, kind="stable").iloc[0]
    others = shares[shares["method"] != best["method"]]
    beaten = others[others["high"] < best["low"]]
    counts = ", ".join(f"{m} {f}/{p}" for m, f, p in
                       zip(shares["method"], shares["flips"], shares["probed"]))
    if not others.empty and len(beaten) == len(others):
        return (f"At {node}, {best['method']}'s gradients fixed more failing examples "
                f"({counts}); its 90% interval lies above the others'.")
    n = ", ".join(sorted({str(p) for p in shares["probed"]}))
    return (f"At {node} the 90% intervals overlap ({counts}; n = {n}): the evidence cannot "
            "rank the methods yet.")
