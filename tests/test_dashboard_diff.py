"""Compare's "Why do they differ?" and the Compare fixes under AppTest: a fork with one
hand-edited middle prompt beside its parent (tests/support/diff_script.py). Graded answers decide
disagreement (raw-text differences shown apart), the prompt diff runs parent -> fork, the
paired step is one both runs back-propagated (or the page says there is none), and the
diff button explains the selected example by the edited node, read back from the log."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from tests.support.dashboard_log import like_a_live_server
from tests.support.diff_script import CHAIN, forked

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
EDIT = "Plan the sum CAREFULLY."


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    db = forked(tmp_path_factory.mktemp("diff"), CHAIN, {"plan": EDIT})
    with duckdb.connect(str(db)) as con:
        scored = con.execute(
            "SELECT a.example_id, a.split FROM losses a JOIN losses b "
            "USING (split, example_id, step) WHERE a.run_id = 'child' AND b.run_id = "
            "'parent' AND a.score <> b.score ORDER BY a.example_id").fetchall()
        differing = [e for e, split in scored if split == "val"]
        same = con.execute(
            "SELECT a.example_id, a.prediction FROM losses a JOIN losses b "
            "USING (split, example_id, step) WHERE a.run_id = 'child' AND b.run_id = "
            "'parent' AND a.split = 'val' AND a.score = b.score ORDER BY a.example_id"
        ).fetchall()
        # planted: the parent's reply to one agreeing example keeps a stray closing tag
        con.execute("UPDATE losses SET prediction = prediction || '\n</output>' WHERE "
                    "run_id = 'parent' AND example_id = ?", [same[0][0]])
    return db, differing, same[0][0], {e for e, _ in scored}


@pytest.fixture
def open_page(log, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", str(log[0]))

    def run(**query) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=90)
        at.query_params.update({k: str(v) for k, v in query.items()})
        at.run()
        at.switch_page("screens/compare.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    with like_a_live_server():
        yield run


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "title", "subheader", "info",
                                  "warning", "error", "success") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts).replace("\\", "")


def frame(at: AppTest, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def test_disagreement_is_on_graded_answers_and_scores(open_page, log):
    db, _, raw_only, differing = log
    at = open_page(run="child", other="parent", step=0)
    rows = frame(at, "A answer").set_index("example")
    assert set(rows.index[rows["disagree"]]) == differing
    assert not rows.loc[raw_only, "disagree"] and rows.loc[raw_only, "raw text differs"]
    assert rows.loc[raw_only, "A answer"] == rows.loc[raw_only, "B answer"]
    assert all(rows.loc[e, "disagree"] for e in differing)
    shown = texts(at)
    assert "differ only in raw text" in shown
    # neither run back-propagated at step 0 (a fork with no step of its own): it says so
    assert "no step in common where both runs back-propagated" in shown


def test_prompt_diff_runs_parent_to_fork(open_page):
    at = open_page(run="child", other="parent", step=0)
    html = [e.proto.body for e in at.get("html")]
    plan = next(h for h in html if "CAREFULLY" in h)
    # the fork's new word is added (green <ins>), not struck out
    assert "<ins" in plan and "CAREFULLY" in plan.split("<ins", 1)[1]
    assert "B (parent) → A (fork)" in texts(at)


def test_why_do_they_differ_runs_the_diff_and_explains_by_the_edited_node(open_page, log):
    db, differing, _, _ = log
    example = differing[0]
    at = open_page(run="child", other="parent", step=0, pair=example)
    shown = texts(at)
    assert f"Why do they differ? · example {example} · step 0" in shown
    assert "**plan** :orange-badge[source change] · prompt differs" in shown
    assert "**final** :gray-badge[downstream] · its inputs differ" in shown
    at.button(key="why_one").click().run()
    assert not at.exception
    shown = texts(at)
    assert f"Example {example} scores 1.000 in A and 0.000 in B: explained by **plan**" \
        in shown
    assert re.search(r"Last diff: \d+ calls? \(\d+ to the model\), [\d,]+ tokens", shown)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT explained_by FROM diffs WHERE example_id = ?",
                           [example]).fetchall() == [('["plan"]',)]
    # the verdict is read back from the log: a fresh page (a link) shows it again
    again = open_page(run="child", other="parent", step=0, pair=example)
    assert "explained by **plan**" in texts(again)
    again.button(key="why_all").click().run()
    table = frame(again, "explained by")
    assert set(table["example"]) == set(differing)
    assert set(table["explained by"]) == {"plan"}


def test_runs_on_two_models_are_not_patched_into_each_other(monkeypatch, tmp_path):
    """Two runs of one backend on two models: every LLM node whose output differs is a
    source change ('model differs'), and the diff says it patches nothing across them."""
    from tests.support.diff_script import on_two_models

    db = on_two_models(tmp_path)
    example = next(e for e, a, b in duckdb.connect(str(db), read_only=True).execute(
        "SELECT a.example_id, a.score, b.score FROM losses a JOIN losses b USING (split, "
        "example_id, step) WHERE a.run_id = 'careful' AND b.run_id = 'plain' AND a.split "
        "= 'val' ORDER BY a.example_id").fetchall() if a != b)
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", str(db))
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=90)
        at.query_params.update(run="careful", other="plain", step="0", pair=example)
        at.run()
        at.switch_page("screens/compare.py").run()
        shown = texts(at)
        assert "**plan** :orange-badge[source change] · model differs: not patched" in shown
        assert "**final** :orange-badge[source change] · model differs; its inputs differ" \
            in shown
        at.button(key="why_one").click().run()
        assert not at.exception
        shown = texts(at)
    assert f"Example {example}: not explained: the two runs use different models" in shown
    assert "explained by" not in shown and "within the bound" not in shown


@pytest.fixture(scope="module")
def gsm(tmp_path_factory):
    """GSM8K, scripted, seed 0 with 24 examples: step 1's edits pass the gate, and of
    them the gain needs hint_b's only (the others are dropped)."""
    from tests.support.graphs import SHARED_DATASETS, run_engine

    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"benchmark data sets not found at {SHARED_DATASETS}")
    db = tmp_path_factory.mktemp("gsm") / "gsm.duckdb"
    run_engine(Path(__file__).resolve().parents[1] / "sample_graphs" / "gsm8k.yaml", db,
               steps=1, train=24, val=24, seed=0, run_id="gsm",
               data_dir=str(SHARED_DATASETS))
    return db


def test_prompt_history_shows_what_an_accepted_edit_changed(gsm, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", str(gsm))
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=90)
        at.query_params.update({"run": "gsm", "node": "hint_b"})
        at.run()
        at.switch_page("screens/history.py").run()
        at.button(key="changed_hint_b_1").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with duckdb.connect(str(gsm), read_only=True) as con:
        truth = con.execute(
            "SELECT a.example_id, b.score, a.score FROM losses a JOIN losses b "
            "USING (run_id, split, example_id) WHERE run_id = 'gsm' AND split = 'val' AND "
            "a.step = 1 AND b.step = 0 AND a.score <> b.score").fetchall()
    table = frame(at, "explained by")
    # the step's gate pass scored validation with the accepted prompts: the examples it
    # flipped are those whose logged scores differ between step 0 and step 1
    assert sorted(zip(table["example"], table["after step 0"], table["after step 1"])) == \
        sorted(truth)
    assert all(e != "not explained within the bound" for e in table["explained by"])
    assert "What it changed:" in texts(at)


def test_the_compare_drawing_words_a_node_as_the_line_under_it_does():
    """One fact, one description: a node whose output is the same on both sides though its
    prompt differs is drawn as such, not as a bare 'unchanged'."""
    from dashboard.views.diff import change_caption

    assert change_caption("unchanged", "same output (prompt differs)", False) == \
        "same output (prompt differs)"
    assert change_caption("source", "prompt differs", False) == "source"
    assert change_caption("downstream", "its inputs differ", True) == "explains"
