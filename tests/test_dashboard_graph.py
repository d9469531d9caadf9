"""The one graph drawing and the probe / fork commands the dashboard
starts: pure functions, no Streamlit server."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from dashboard import jobs
from dashboard.views import graph_model as gh
from dashboard.views.colors import (
    BLAMED,
    EDIT_COLORS,
    TIED,
    blues,
    color_nodes,
    red_green,
    reds,
)
from dashboard.views.graph_component import FOLDER, clicked
from dashboard.views.graph_spec import (
    GRADIENT_LABEL,
    contrast,
    graph_spec,
    luminance,
    placed_boxes,
    text_color,
)
from engine.probes.verdict import logged_blame

XSS = "<img src=x onerror=alert(1)>"
TINY = gh.GraphModel(order=("hint_a", "hint_b", "final"),
                     inputs=(("hint_a", ("question",)), ("hint_b", ("question",)),
                             ("final", ("question", "hint_a", "hint_b"))),
                     fields=("question",), output="final")


def wide_graph(n: int, seed: int) -> gh.GraphModel:
    """n nodes: a few layers of long-named nodes, each reading 1-3 earlier ones."""
    import random

    rng = random.Random(seed)
    names = [f"node_{i}_{'x' * rng.randint(0, 14)}" for i in range(n)]
    inputs = []
    for i, name in enumerate(names[:-1]):
        earlier = names[:i]
        reads = rng.sample(earlier, k=min(len(earlier), rng.randint(0, 3))) or ["text"]
        inputs.append((name, tuple(reads)))
    inputs.append((names[-1], tuple(names[:-1][-3:]) or ("text",)))
    return gh.GraphModel(order=tuple(names), inputs=tuple(inputs), fields=("text",),
                         output=names[-1], functions=tuple(names[1::7]))


def overlaps(a, b) -> bool:
    (ax, ay, aw, ah), (bx, by, bw, bh) = a, b
    return abs(ax - bx) * 2 < aw + bw and abs(ay - by) * 2 < ah + bh


@settings(max_examples=40, deadline=None)
@given(n=hs.integers(min_value=1, max_value=30), seed=hs.integers(0, 10_000))
def test_no_two_boxes_overlap_up_to_30_nodes(n, seed):
    model = wide_graph(n, seed)
    captions = tuple((node, "fixes 12/12") for node in model.order)
    boxes = placed_boxes(model, gh.Decoration(captions=captions))
    assert len(boxes) == n + 2  # the nodes, one field, the loss
    for (a, box_a), (b, box_b) in itertools.combinations(boxes.items(), 2):
        assert not overlaps(box_a, box_b), (a, b)


def test_boxes_are_wide_enough_for_their_labels_and_layers_run_left_to_right():
    deco = gh.Decoration(captions=(("hint_a", "∇ 8200 chars"),))
    spec = graph_spec(TINY, deco)
    boxes = placed_boxes(TINY, deco)
    label = next(n["label"] for n in spec["nodes"] if n["id"] == "hint_a")
    assert label == "hint_a · ∇ 8200 chars"  # one line: no clipped descenders
    assert boxes["hint_a"][2] >= len(label) * 16 * 0.6  # monospace 16 px, at least
    x = {name: box[0] for name, box in boxes.items()}
    assert x[gh.FIELD_PREFIX + "question"] < x["hint_a"] == x["hint_b"] < x["final"] \
        < x[gh.LOSS_ID]


def test_text_colour_meets_wcag_aa_on_every_fill_the_pages_use():
    fills = [f(t / 10) for f in (red_green, blues, reds) for t in range(11)]
    fills += list(EDIT_COLORS.values()) + ["#d9d9d9", "#f3f3f3", "#ffe0e0", "#1565c0"]
    for fill in fills:
        assert contrast(fill, text_color(fill)) >= 4.5, fill
    assert text_color("#1565c0") == "#ffffff" and text_color("#ffd54f") == "#000000"
    assert contrast(GRADIENT_LABEL, "#ffffff") >= 4.5  # edge labels on the white canvas


def test_spec_carries_kinds_selection_tooltips_and_labelled_gradient_edges():
    model = gh.GraphModel(order=("extract", "answer"), inputs=(("extract", ("q",)),
                                                              ("answer", ("q", "extract"))),
                          fields=("q",), output="answer", functions=("extract",))
    deco = gh.Decoration(tooltips=(("answer", f"output: {XSS}"),), highlight="answer",
                         flows=(("loss", "answer", 1, 31.0), ("answer", "extract", 2, 120.4)))
    spec = graph_spec(model, deco)
    nodes = {n["id"]: n for n in spec["nodes"]}
    assert nodes["extract"]["kind"] == "function" and nodes["extract"]["label"] == "ƒ extract"
    assert nodes["answer"]["kind"] == "llm" and nodes["answer"]["selected"]
    assert not nodes["extract"]["selected"] and spec["selected"] == "answer"
    assert XSS in nodes["answer"]["tooltip"]  # plain text: the component sets textContent
    gradients = [e for e in spec["edges"] if e["kind"] == "gradient"]
    assert [(e["from"], e["to"], e["label"]) for e in gradients] == [
        (gh.LOSS_ID, "answer", "1× ∇ 31 chars"), ("answer", "extract", "2× ∇ 120 chars")]


def test_the_component_is_served_locally_and_never_parses_model_text_as_html():
    page = (FOLDER / "index.html").read_text()
    assert '<script src="./vis-network.min.js">' in page
    assert "http://" not in page and "https://" not in page.replace(
        "https://visjs", "")  # no CDN
    assert "innerHTML" not in page and "textContent = text;" in page
    assert "streamlit:setComponentValue" in page
    script = (FOLDER / "vis-network.min.js").read_text()
    assert "@license" in script[:2000] and "MIT" in script[:2000]


def test_a_click_value_names_the_node():
    assert clicked({"node": "final", "clicks": 3}) == "final"
    assert clicked(None) is None and clicked({"clicks": 1}) is None
    assert clicked({"node": 7}) is None


def _counts(node: str, probed: int, flips: int, edit_probed: int = 0, edit_flips: int = 0):
    return {"node_id": node, "probed": probed, "flips": flips, "leaks": 0,
            "edit_probed": edit_probed, "edit_flips": edit_flips}


def _edited(*nodes: str) -> list[dict]:
    return [{"node_id": n, "old_prompt": "old", "new_prompt": f"new {n}", "reject_reason": None}
            for n in nodes]


def test_blame_colours_and_labels_are_the_verdicts_own_counts():
    """The drawing colours and labels each node from the verdict's facts
    (logged_blame), so it cannot say "fixes 0/24" of a node the banner ties on."""
    # the gradient probes decide: a is named, b and c weighed; d was not probed
    found = logged_blame([_counts("a", 6, 6), _counts("b", 6, 0), _counts("c", 6, 0)],
                         _edited("a", "b", "c"), ["a", "b", "c", "d"])
    assert found.verdict.node == "a" and found.evidence == "gradient"
    coloring = color_nodes([], "blame", found.facts)
    assert coloring.captions == {"a": "blamed · ∇ fixes 6/6", "b": "∇ fixes 0/6",
                                 "c": "∇ fixes 0/6"}
    assert coloring.colors == {"a": BLAMED, "b": reds(0.0), "c": reds(0.0)}  # d: grey
    assert "deep red" in coloring.legend and "following its gradient" in coloring.legend
    # the issue's case: no gradient fixes any example, two nodes' edits each fix some
    tie = logged_blame([_counts("note", 24, 0, 24, 17), _counts("thing", 24, 0, 24, 11),
                        _counts("answer", 24, 0, 24, 0)], _edited("note", "thing", "answer"),
                       ["note", "thing", "answer"])
    assert tie.verdict.tied == ["note", "thing"] and tie.evidence == "edit"
    coloring = color_nodes([], "blame", tie.facts)
    assert coloring.captions == {"note": "tie · edit fixes 17/24",
                                 "thing": "tie · edit fixes 11/24", "answer": "edit fixes 0/24"}
    assert coloring.colors["note"] == coloring.colors["thing"] == TIED  # a tie, drawn as one
    assert coloring.colors["answer"] == reds(0.0)
    assert "purple: a tie" in coloring.legend and "run alone" in coloring.legend
    for fill in (BLAMED, TIED, reds(0.5)):  # the palest named colour is still paler
        assert contrast(fill, text_color(fill)) >= 4.5
    assert luminance(reds(0.5)) > luminance(BLAMED)
    # an update that left the prompt as it was is compared as 0 of n; no probe: grey
    kept = logged_blame([_counts("note", 8, 0, 8, 8)], _edited("note"),
                        ["note", "thing", "answer"])
    coloring = color_nodes([], "blame", kept.facts)
    assert coloring.captions == {"note": "blamed · edit fixes 8/8",
                                 "thing": "no edit to probe",
                                 "answer": "no edit to probe"}
    nothing = color_nodes([], "blame", logged_blame([], _edited("note"),
                                                    ["note", "thing"]).facts)
    assert (nothing.colors, nothing.captions) == ({}, {}) and "not probed" in nothing.legend
    with pytest.raises(ValueError):
        color_nodes([], "blame")  # only from the verdict's facts


def test_a_caption_that_changes_moves_no_box_and_stays_inside_the_frame():
    """A live update that swaps "∇ 82 chars" for "tie · edit fixes 17/24" keeps
    every box where it was (the component keeps its view), and the frame it was fitted to
    still holds the longer labels."""
    model = gh.GraphModel(order=("note", "thing", "answer"),
                          inputs=(("note", ("text",)), ("thing", ("text",)),
                                  ("answer", ("note", "thing"))),
                          fields=("text",), output="answer")
    before = gh.Decoration(captions=(("note", "∇ 81 chars"), ("thing", "∇ 82 chars")))
    after = gh.Decoration(captions=(("note", "tie · edit fixes 17/24"),
                                    ("thing", "tie · edit fixes 11/24"),
                                    ("answer", "edit fixes 0/24")))
    old, new = graph_spec(model, before), graph_spec(model, after)
    assert old["frame"] == new["frame"] and old["height"] == new["height"]
    assert [(n["id"], n["x"], n["y"]) for n in old["nodes"]] == \
        [(n["id"], n["x"], n["y"]) for n in new["nodes"]]
    left, top, right, bottom = new["frame"]
    for name, (x, y, w, h) in placed_boxes(model, after).items():
        assert left <= x - w / 2 and x + w / 2 <= right and top <= y - h / 2 \
            and y + h / 2 <= bottom, name


# --- commands the dashboard starts ------------------------------------------------------------


def test_probe_commands_follow_the_pinned_cli(tmp_path):
    db = str(tmp_path / "runs.duckdb")
    base = [sys.executable, "-m", "engine", "probe", "r1", "--db", db, "--step", "1",
            "--node", "hint_a"]
    spec = jobs.ProbeSpec("r1", db, 1, "hint_a", "gradient", example="q01")
    assert jobs.probe_command(spec) == [*base, "--example", "q01", "--gradient", "--json"]
    spec = jobs.ProbeSpec("r1", db, 1, "hint_a", "output", example="q01", text="x")
    assert jobs.probe_command(spec, Path("/t/o.txt")) == [
        *base, "--example", "q01", "--output", "@/t/o.txt", "--json"]
    spec = jobs.ProbeSpec("r1", db, 1, "hint_a", "edit", example="q01")
    assert jobs.probe_command(spec) == [*base, "--edit", "proposed", "--examples", "q01",
                                        "--json"]
    spec = jobs.ProbeSpec("r1", db, 1, "hint_a", "edit", examples="val", text="P")
    assert jobs.probe_command(spec, Path("/t/p.txt"))[-4:] == [
        "@/t/p.txt", "--examples", "val", "--json"]
    assert jobs.blame_command("r1", db, 2) == [sys.executable, "-m", "engine", "blame", "r1",
                                               "--db", db, "--step", "2"]


def test_start_probe_writes_the_text_file_and_records_a_probe_job(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    started = []
    monkeypatch.setattr(jobs.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or
                        type("P", (), {"pid": 999_999_999, "poll": lambda self: 0})())
    db = str(tmp_path / "runs.duckdb")
    job = jobs.start_probe(jobs.ProbeSpec("r1", db, 1, "hint_a", "output", example="q01",
                                          text="The numbers are 3 and 9."))
    cmd = started[0]
    at = cmd.index("--output") + 1
    assert Path(cmd[at][1:]).read_text() == "The numbers are 3 and 9."
    assert job.kind == "probe" and job.run_id == "r1"
    assert jobs.list_jobs(db) == []  # probes stay off the Runs page's list of runs
    assert [j.log for j in jobs.probe_jobs(db, "r1")] == [job.log]


def test_fork_command_sets_the_hand_edited_prompt(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    started = []
    monkeypatch.setattr(jobs.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or
                        type("P", (), {"pid": 999_999_998, "poll": lambda self: 0})())
    db = str(tmp_path / "runs.duckdb")
    job = jobs.start_fork(jobs.ForkSpec("r1", db, 1, {"final": "Answer with a number."},
                                        steps=2), graph_name="tiny")
    cmd = started[0]
    assert cmd[2:9] == ["engine", "run", "--fork", "r1", "--from-step", "1", "--db"]
    assert cmd[cmd.index("--steps") + 1] == "2"
    node, file = cmd[cmd.index("--set-prompt") + 1].split("=@")
    assert node == "final" and Path(file).read_text() == "Answer with a number."
    assert cmd[cmd.index("--run-id") + 1] == job.run_id and job.run_id.startswith("tiny-")
    assert job.kind == "fork" and [j.run_id for j in jobs.list_jobs(db)] == [job.run_id]


def test_a_node_with_no_edit_reads_alike_on_every_page():
    """One fact, one wording: a node whose update left its prompt as it was has no edit to
    probe on the drawing, the node card and the Learn tables; an edit not yet run is
    'not probed'."""
    from dashboard.views.blame import unprobed_edit

    assert unprobed_edit(False) == "no edit to probe"
    assert unprobed_edit(True) == "not probed"
    kept = logged_blame([_counts("note", 8, 0, 8, 8)], _edited("note"), ["note", "thing"])
    assert color_nodes([], "blame", kept.facts).captions["thing"] == unprobed_edit(False)
