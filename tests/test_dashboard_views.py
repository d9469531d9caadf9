"""The dashboard's pure functions: escaping, layered layout, word diff, colours, the
step-through order, figures, and background jobs."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from dashboard import jobs
from dashboard.views import graph_model as gh
from dashboard.views.colors import color_nodes, red_green
from dashboard.views.diff import diff_html, word_diff
from dashboard.views.figures import compare_curves, score_curves
from dashboard.views.walk import walk

XSS = "<img src=x onerror=alert(1)>"

DIAMOND = gh.GraphModel(
    order=("sum", "difference", "larger", "compare"),
    inputs=(("sum", ("numbers",)), ("difference", ("numbers",)), ("larger", ("numbers",)),
            ("compare", ("sum", "difference", "larger"))),
    fields=("numbers",), output="compare")
CHAIN = gh.GraphModel(order=("extract", "convert", "answer"),
                      inputs=(("extract", ("text",)), ("convert", ("extract",)),
                              ("answer", ("convert", "extract"))),
                      fields=("text",), output="answer")


# --- layout --------------------------------------------------------------------------------


def test_layers_run_left_to_right_along_every_edge():
    for model in (DIAMOND, CHAIN):
        pos = gh.layered_positions(model)
        for node, inputs in model.inputs:
            for source in inputs:
                src = gh.FIELD_PREFIX + source if source in model.fields else source
                assert pos[src][0] < pos[node][0], (src, node)
        assert pos[gh.LOSS_ID][0] > pos[model.output][0]
        assert {x for x, _ in [pos[gh.FIELD_PREFIX + f] for f in model.fields]} == {0}


def test_nodes_of_one_layer_are_spread_and_centred():
    pos = gh.layered_positions(DIAMOND)
    ys = sorted(pos[n][1] for n in ("sum", "difference", "larger"))
    assert len({pos[n][0] for n in ("sum", "difference", "larger")}) == 1
    assert len(set(ys)) == 3 and ys[0] == -ys[2]
    assert pos["compare"][1] == 0  # the barycentre of its three inputs
    chain = gh.layered_positions(CHAIN)
    assert chain["extract"][0] < chain["convert"][0] < chain["answer"][0]


def test_graph_model_from_an_engine_graph():
    from engine.core.graph import parse_graph

    graph = parse_graph("""
name: g
input_fields: [q, unused]
target_field: a
nodes:
  - {id: h, prompt: Think., inputs: [q]}
  - {id: f, prompt: Answer., inputs: [q, h], output: true}
""")
    model = gh.GraphModel.from_graph(graph)
    assert model.order == ("h", "f") and model.output == "f"
    assert model.fields == ("q",)  # fields no node reads are not drawn
    assert model.predecessors("f") == ["h"] and model.successors("h") == ["f"]


# --- diff ------------------------------------------------------------------------------------


def test_word_diff_reports_added_and_removed_words():
    diff = word_diff("Answer Yes or No.", "Answer Yes or No. Decide if the review is positive.")
    assert diff.added == ["Decide", "if", "the", "review", "is", "positive."]
    assert diff.removed == [] and diff.changed
    swap = word_diff("Write one word about the text.", "Write one feeling about the text.")
    assert swap.added == ["feeling"] and swap.removed == ["word"]
    assert not word_diff("same text", "same text").changed


def test_diff_html_colours_and_escapes():
    page = diff_html("Keep this.", f"Keep this. {XSS} and <b>bold</b>")
    assert "<ins" in page and "background:#d4f8d4" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page
    removed = diff_html("old words here", "new words here")
    assert re.search(r"<del[^>]*>old</del>", removed) and re.search(r"<ins[^>]*>new</ins>",
                                                                      removed)


def test_diff_keeps_line_breaks_and_can_hide_unchanged_text():
    assert "line one\nline two\n" in diff_html("line one\nline two\nend", "line one\nline two\nend!")
    long = " ".join(f"w{i}" for i in range(200))
    short = diff_html(long, long + " extra", only_changes=True)
    assert "w100" not in short and "extra" in short and "…" in short
    assert "(empty)" in diff_html("", "")


# --- colours, walk, figures ---------------------------------------------------------------


def test_colours_per_quantity():
    rows = [{"node_id": "a", "fail_share": 0.0, "grad_chars": 100.0, "edit": "accepted"},
            {"node_id": "b", "fail_share": 1.0, "grad_chars": 400.0, "edit": "rejected"},
            {"node_id": "c", "fail_share": None, "grad_chars": float("nan"), "edit": None}]
    fail = color_nodes(rows, "fail_share")
    assert fail.colors["a"] == red_green(0.0) != fail.colors["b"] == red_green(1.0)
    assert "c" not in fail.colors and fail.captions["b"] == "100% failing"
    grad = color_nodes(rows, "grad_chars")
    assert grad.captions["b"] == "∇ 400 chars" and "c" not in grad.colors
    edit = color_nodes(rows, "edit")
    assert edit.captions == {"a": "edit accepted", "b": "edit rejected"}
    with pytest.raises(ValueError):
        color_nodes(rows, "nonsense")


def test_walk_goes_forward_then_loss_then_backward_then_update():
    stops = walk(list(DIAMOND.order), DIAMOND.output)
    assert [(s.phase, s.node_id) for s in stops] == [
        ("forward", "sum"), ("forward", "difference"), ("forward", "larger"),
        ("forward", "compare"), ("loss", "compare"), ("backward", "compare"),
        ("backward", "larger"), ("backward", "difference"), ("backward", "sum"),
        ("update", None)]
    assert stops[4].highlighted == gh.LOSS_ID and stops[1].highlighted == "difference"


def test_score_curves_mark_accepted_steps():
    import pandas as pd

    steps = pd.DataFrame({"step": [0, 1, 2], "train_score": [0.2, 0.4, 0.5],
                          "val_score": [0.1, 0.3, 0.3], "accepted": [False, True, False]})
    fig = score_curves(steps)
    stars = next(t for t in fig.data if t.name == "accepted edit")
    assert list(stars.x) == [1] and list(stars.y) == [0.3]
    # a fork from step 1: its start carries a prompt set by hand (accepted, no edit the
    # gate accepted), then step 2 accepts one
    fork = pd.DataFrame({"step": [1, 2], "train_score": [0.4, 0.6], "val_score": [0.5, 0.7],
                         "accepted": [True, True], "accepted_edits": [0, 1]})
    stars = next(t for t in compare_curves(steps, fork, "A", "B").data
                 if t.name == "B accepted edit")
    assert list(stars.x) == [2]


# --- jobs --------------------------------------------------------------------------------


def test_build_command_maps_the_form_onto_cli_flags():
    spec = jobs.RunSpec(graph="g.yaml", db="x.duckdb", method="textgrad", backend="scripted",
                        model="m", steps=3, train=4, val=5, test=0, seed=7, run_id="r1")
    cmd = jobs.build_command(spec)
    assert cmd[:5] == [sys.executable, "-m", "engine", "run", "g.yaml"]
    pairs = dict(zip(cmd[5::2], cmd[6::2]))
    assert pairs == {"--db": "x.duckdb", "--method": "textgrad", "--backend": "scripted",
                     "--steps": "3", "--seed": "7", "--model": "m", "--train": "4",
                     "--val": "5", "--test": "0", "--run-id": "r1"}
    from engine.cli import build_parser

    args = build_parser().parse_args(cmd[3:])  # the engine accepts every flag
    assert (args.method, args.backend, args.train, args.test) == ("textgrad", "scripted", 4, 0)


def test_the_forms_estimate_error_names_the_forms_field(tmp_path, monkeypatch):
    monkeypatch.delenv("SEMBACK_DATA_DIR", raising=False)
    graph = jobs.ROOT / "sample_graphs" / "gsm8k.yaml"  # a named dataset: needs a data dir
    ok, lines = jobs.estimate(jobs.RunSpec(graph=str(graph), db=str(tmp_path / "r.duckdb"),
                                           backend="scripted", steps=1))
    assert not ok and len(lines) == 1 and lines[0].startswith("error:")
    assert "the form's Data directory field" in lines[0], lines
    assert "--data-dir" not in lines[0] and "SEMBACK_DATA_DIR" not in lines[0]


def test_a_job_runs_the_engine_to_completion(tmp_path, monkeypatch):
    from tests.support.dashboard_log import write_data

    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    graph = write_data(tmp_path / "g")
    db = tmp_path / "runs.duckdb"
    job = jobs.start(jobs.RunSpec(graph=str(graph), db=str(db), backend="scripted", steps=1,
                                  train=4, val=4, test=0))
    assert jobs.wait(job, 60), jobs.log_tail(job)
    assert job.returncode == 0, jobs.log_tail(job)
    from engine.runlog import reader

    runs = reader.list_runs(db)
    assert list(runs["run_id"]) == [job.run_id] and runs["status"][0] == "finished"
    listed = jobs.list_jobs(db)
    assert [j.run_id for j in listed] == [job.run_id] and listed[0].returncode == 0


def test_stop_sends_sigterm(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    script = ("import signal, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *a: (print('got SIGTERM'), sys.exit(3)))\n"
              "print('ready' + '!', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(jobs, "build_command", lambda spec: [sys.executable, "-c", script])
    graph = tmp_path / "g.yaml"
    graph.write_text("name: g\ninput_fields: [q]\ntarget_field: a\nnodes:\n"
                     "  - {id: f, prompt: Answer., inputs: [q], output: true}\n")
    job = jobs.start(jobs.RunSpec(graph=str(graph), db=str(tmp_path / "r.duckdb")))
    deadline = time.monotonic() + 20
    while "ready!" not in jobs.log_tail(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert jobs.poll(job)
    jobs.stop(job)
    assert jobs.wait(job, 20)
    assert job.returncode == 3 and "got SIGTERM" in jobs.log_tail(job)
    record = json.loads(Path(job.record).read_text())
    assert record["stopped"] is True and record["returncode"] == 3
    jobs.forget(job)
    assert jobs.list_jobs(tmp_path / "r.duckdb") == []


def test_a_bad_graph_is_refused_before_starting(tmp_path, monkeypatch):
    from engine.core.graph import GraphError

    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nnodes: []\n")
    with pytest.raises(GraphError):
        jobs.start(jobs.RunSpec(graph=str(bad), db=str(tmp_path / "r.duckdb")))
    assert jobs.list_jobs(tmp_path / "r.duckdb") == []


def test_degenerate_gradients_are_named_and_real_ones_are_not():
    from dashboard.views.quality import degenerate

    prompt = ("You are helping improve a pipeline. Explain how the output of mood should "
              "change so that the final answer is right. Do not mention specific examples, "
              "numbers or answers above.")
    assert degenerate("", prompt) == "empty"
    assert degenerate("  \n", prompt) == "empty"
    assert degenerate("M", prompt) == "one word"
    assert degenerate("Yes.", prompt) == "one word"
    assert degenerate("Do not mention specific examples, numbers or answers above.",
                      prompt) == "echoes the prompt"
    real = ("mood said 'good' for a complaint about a broken zip; it should name the "
            "feeling the reviewer states, here disappointment.")
    assert degenerate(real, prompt) is None
    assert degenerate("Too vague.", prompt) is None  # two words of its own: kept


def test_gradient_lengths_round_half_up_everywhere():
    from dashboard.views.text import chars

    assert chars(82.5) == "83 chars" and chars(65.5) == "66 chars"
    assert chars(65.49) == "65 chars" and chars(None) == "0 chars"


def test_counts_agree_with_their_noun():
    from dashboard.views.text import plural

    assert plural(1, "proposal") == "1 proposal" and plural(2, "proposal") == "2 proposals"
    assert plural(0, "prompt edit") == "0 prompt edits"


def test_a_validation_change_says_whether_its_examples_can_tell_it_apart():
    from dashboard.data import Score
    from dashboard.views.validation import change_sentence

    verdict, said = change_sentence(Score(0.0, 24), Score(1.0, 24))
    assert verdict == "rose" and said == (
        "Validation rose (0.000 → 1.000) on 24 examples; 95% intervals 0.00–0.14 and "
        "0.86–1.00, which do not overlap.")
    verdict, said = change_sentence(Score(0.5, 4), Score(0.75, 4))  # the Learn tour's size
    assert verdict == "rose" and said.endswith(
        "which overlap: these examples cannot tell the two apart.")
    assert change_sentence(Score(0.5, 8), Score(0.25, 9))[1].startswith(
        "Validation fell (0.500 → 0.250) on 8 and 9 examples")
    assert change_sentence(Score(None, 0), Score(1.0, 4))[0] == ""
