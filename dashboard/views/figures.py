"""Plotly figures: score curves, the clickable node chart, usage per node and phase."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dashboard.views.colors import NO_DATA
from engine.data.stats import Z95, score_interval

PHASES = ("forward", "loss", "backward", "update")
PHASE_COLORS = {"forward": "#42a5f5", "loss": "#ab47bc", "backward": "#ff7043",
                "update": "#66bb6a"}


def _layout(fig: go.Figure, title: str, height: int = 340) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=40, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.2))
    return fig


def score_curves(steps: pd.DataFrame, label: str = "", val_n: int = 0) -> go.Figure:
    """Train and validation score per step; accepted steps marked on the validation line;
    with `val_n`, the validation examples, each validation score's 95% interval."""
    fig = go.Figure()
    add_score_traces(fig, steps, label, val_n=val_n)
    fig.update_yaxes(title="score", rangemode="tozero")
    fig.update_xaxes(title="step", dtick=1)
    return _layout(fig, "Scores per step")


def validation_bars(scores: pd.Series, n: int) -> dict | None:
    """Error bars for validation scores measured on `n` examples: each score's Wilson 95%
    interval (engine.data.stats.score_interval, as `run`'s summary prints it); None
    without examples."""
    bounds = [score_interval(None if pd.isna(v) else float(v), n, Z95) for v in scores]
    if n <= 0 or not any(bounds):
        return None
    return dict(type="data", symmetric=False, thickness=1.2, width=5,
                array=[b[1] - v if b else 0.0 for b, v in zip(bounds, scores)],
                arrayminus=[v - b[0] if b else 0.0 for b, v in zip(bounds, scores)])


TRAIN_NAME = "train (scored before each step's update)"


def train_points(steps: pd.DataFrame) -> tuple[list[int], list[float], list[str]]:
    """Each step's train score placed at the prompts it measured: a step scores training
    at its start, before its update, so step k's score is of the prompts after step k-1;
    the run's first step (step 0, or a fork's start that scored its own prompts) measured
    its own. One point per prompt state (the first measurement); the prompts the last step
    kept have none. Returns x, y and hover texts."""
    points: dict[int, tuple[float, str]] = {}
    scored = steps["train_scored"] if "train_scored" in steps else [True] * len(steps)
    for i, (step, score, own) in enumerate(zip(steps["step"], steps["train_score"], scored)):
        at = int(step) if i == 0 and own else int(step) - 1
        if pd.isna(score) or at in points or at < 0:
            continue
        points[at] = (float(score), f"train {score:.3f}: the prompts after step {at}"
                      + ("" if at == step else f", scored at step {int(step)} before its "
                                               "update"))
    xs = sorted(points)
    return xs, [points[x][0] for x in xs], [points[x][1] for x in xs]


def add_score_traces(fig: go.Figure, steps: pd.DataFrame, label: str = "",
                     dash: str | None = None, colors: tuple[str, str] = ("#90caf9", "#1565c0"),
                     val_n: int = 0) -> None:
    """Train (light, dotted, each point at the prompts it measured: train_points) and
    validation (dark) lines plus stars on accepted steps; with `val_n`, the validation
    examples, the validation scores' 95% intervals as error bars, and n and the interval
    in their hover text."""
    prefix = f"{label} " if label else ""
    train_color, val_color = colors
    train_x, train_y, train_hover = train_points(steps)
    fig.add_trace(go.Scatter(x=train_x, y=train_y, mode="lines+markers",
                             name=f"{prefix}{TRAIN_NAME}", hovertext=train_hover,
                             hoverinfo="text", line=dict(dash="dot", color=train_color)))
    bars = validation_bars(steps["val_score"], val_n)
    hover = None
    if bars is not None:
        hover = [f"step {s}: {v:.3f} on {val_n} examples, 95% interval "
                 f"[{v - lo:.2f}, {v + hi:.2f}]" if v == v else f"step {s}: not measured"
                 for s, v, lo, hi in zip(steps["step"], steps["val_score"],
                                         bars["arrayminus"], bars["array"])]
    fig.add_trace(go.Scatter(x=steps["step"], y=steps["val_score"], mode="lines+markers",
                             name=f"{prefix}validation", line=dict(dash=dash, color=val_color),
                             error_y=bars, hovertext=hover,
                             hoverinfo="text" if hover else None))
    # a star where the gate accepted an edit: a fork's starting step carries prompts set
    # by hand (steps.accepted is true there), which no gate accepted
    edited = (steps["accepted_edits"].fillna(0) > 0 if "accepted_edits" in steps
              else steps["accepted"].fillna(False).astype(bool))
    accepted = steps[edited]
    fig.add_trace(go.Scatter(
        x=accepted["step"], y=accepted["val_score"], mode="markers",
        name=f"{prefix}accepted edit",
        marker=dict(symbol="star", size=16, color=val_color, line=dict(width=1, color="#222"))))


def compare_curves(a: pd.DataFrame, b: pd.DataFrame, a_label: str, b_label: str,
                   a_val_n: int = 0, b_val_n: int = 0) -> go.Figure:
    """Both runs' score curves (B dashed), each validation score with its 95% interval
    when its run's validation examples are given."""
    fig = go.Figure()
    add_score_traces(fig, a, a_label, val_n=a_val_n)
    add_score_traces(fig, b, b_label, dash="dash", colors=("#ffcc80", "#e65100"),
                     val_n=b_val_n)
    fig.update_xaxes(title="step", dtick=1)
    fig.update_yaxes(title="score", rangemode="tozero")
    return _layout(fig, "Scores per step, both runs", height=380)


def usage_by(totals: pd.DataFrame, by: str, value: str) -> go.Figure:
    """Stacked bars of `value` (calls, tokens or cost_usd) per `by` (node_id or step),
    one colour per phase."""
    fig = go.Figure()
    for phase in PHASES:
        part = totals[totals["purpose"] == phase]
        if part.empty:
            continue
        grouped = part.groupby(by, as_index=False)[value].sum()
        x = grouped[by].replace("", "(no node)") if by == "node_id" else grouped[by]
        fig.add_trace(go.Bar(x=x, y=grouped[value], name=phase,
                             marker_color=PHASE_COLORS[phase]))
    fig.update_layout(barmode="stack")
    fig.update_xaxes(title=by.replace("_id", ""), type="category")
    fig.update_yaxes(title=value.replace("_usd", " (USD)"))
    return _layout(fig, f"{value.replace('_usd', '')} per {by.replace('_id', '')} and phase")


def usage_by_phase(totals: pd.DataFrame) -> go.Figure:
    grouped = totals.groupby("purpose", as_index=False)[["calls", "tokens", "cost_usd"]].sum()
    grouped["order"] = grouped["purpose"].map({p: i for i, p in enumerate(PHASES)})
    grouped = grouped.sort_values("order")
    fig = go.Figure(go.Bar(x=grouped["purpose"], y=grouped["tokens"],
                           marker_color=[PHASE_COLORS.get(p, NO_DATA) for p in grouped["purpose"]],
                           customdata=grouped[["calls", "cost_usd"]].fillna(0).to_numpy(),
                           hovertemplate="%{x}: %{y} tokens, %{customdata[0]} calls, "
                                         "$%{customdata[1]:.4f}<extra></extra>"))
    fig.update_yaxes(title="tokens")
    return _layout(fig, "Tokens per phase")
