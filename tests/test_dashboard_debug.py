"""The dashboard's debugging pages under AppTest: Examples (rows,
filters, search, blame, trace), Prompt history, Compare per example, links that hold
(full state in the address, warnings on bad links), and the Runs page's test score,
notes, tags and export. The run log is the engine-built one of support/dashboard_log.py,
with a few rows planted so every column has something to show."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from tests.support.dashboard_log import ADDED_WORDS, build_run_log, like_a_live_server

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
TIMEOUT = 60
MARKER = "zebra-marker"  # planted in one gradient, to be found by the search
REASON = "copies training examples into the prompt"
FALLBACK = "no <output> tag; used the whole reply"


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    built = build_run_log(tmp_path_factory.mktemp("debug"))
    with duckdb.connect(str(built.db)) as con:
        sem = built.semantic
        con.execute("UPDATE gradients SET content = content || ' ' || ? WHERE run_id = ? "
                    "AND step = 1 AND example_id = 'q09' AND node_id = 'hint_a'",
                    [MARKER, sem])
        con.execute("UPDATE node_outputs SET parse_error = ? WHERE run_id = ? AND step = 1 "
                    "AND example_id = 'q08' AND node_id = 'final'", [FALLBACK, sem])
        con.execute("INSERT INTO probes (probe_id, run_id, step, example_id, node_id, kind, "
                    "before_score, after_score, created_at) VALUES "
                    "('p1', ?, 1, 'q01', 'hint_a', 'gradient', 0.0, 1.0, 0), "
                    "('p2', ?, 1, 'q01', 'hint_b', 'gradient', 0.0, 0.0, 0)", [sem, sem])
        con.execute("UPDATE updates SET reject_reason = ?, val_alone = 0.5 WHERE run_id = ? "
                    "AND step = 2 AND node_id = 'hint_a'", [REASON, sem])
        con.execute("INSERT INTO metrics VALUES (?, NULL, 'test_score', 0.625)", [sem])
        # planted: q02's final call at step 1 was answered from the reply cache
        con.execute("UPDATE llm_calls SET cache_hit = true, latency_ms = 0 WHERE run_id = ? "
                    "AND step = 1 AND example_id = 'q02' AND node_id = 'final' AND "
                    "purpose = 'forward'", [sem])
        # planted: q01's final call at step 1 waited 250 ms for a turn before the model
        con.execute("UPDATE llm_calls SET queued_ms = 250, latency_ms = latency_ms + 250 "
                    "WHERE run_id = ? AND step = 1 AND example_id = 'q01' AND "
                    "node_id = 'final' AND purpose = 'forward'", [sem])
        # q01 fails at steps 0 and 1; planted: it passes at step 2, after step 1's edits
        con.execute("UPDATE losses SET score = 1.0, prediction = '12' WHERE run_id = ? "
                    "AND step = 2 AND example_id = 'q01'", [sem])
        con.execute("UPDATE runs SET parent_run_id = ?, fork_step = 1 WHERE run_id = ?",
                    [sem, built.gtbp])
        # textgrad did not back-propagate q01 at step 1: the pair Compare shows by
        # default is then q09, the example both runs back-propagated
        con.execute("DELETE FROM gradients WHERE run_id = ? AND step = 1 AND "
                    "example_id = 'q01'", [built.textgrad])
    return built


@pytest.fixture
def open_page(log, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", str(log.db))

    def run(page: str | None = None, **query) -> AppTest:
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
        at.query_params.update({k: str(v) for k, v in query.items()})
        at.run()
        if page:
            at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    with like_a_live_server():
        yield run


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "code", "title", "subheader",
                                  "info", "warning", "error") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts).replace("\\", "")


def frame(at: AppTest, column: str):
    """The first dataframe shown that has `column`."""
    return next(d.value for d in at.dataframe if column in d.value.columns)


# --- Examples ----------------------------------------------------------------------------


def truth(log, sql: str) -> set[str]:
    """Example ids at step 1 of the semantic run, straight from the run log."""
    with duckdb.connect(str(log.db), read_only=True) as con:
        return {r[0] for r in con.execute(sql, [log.semantic]).fetchall()}


FAILING = ("SELECT example_id FROM losses WHERE run_id = ? AND step = 1 AND "
           "(error IS NOT NULL OR coalesce(score, 0) < 1)")
FLIPPED = ("SELECT a.example_id FROM losses a JOIN losses b USING (run_id, split, example_id) "
           "WHERE a.run_id = ? AND a.step = 1 AND b.step = 0 "
           "AND (a.score < 1) <> (b.score < 1)")


def test_examples_rows_show_prediction_target_score_flips_and_blame(open_page, log):
    at = open_page("examples", run=log.semantic, step=1)
    rows = frame(at, "prediction").set_index("example_id")
    with duckdb.connect(str(log.db), read_only=True) as con:
        losses = con.execute("SELECT example_id, prediction, target, score FROM losses "
                             "WHERE run_id = ? AND step = 1", [log.semantic]).df()
    assert len(rows) == len(losses) == 8 and set(rows["split"]) == {"train", "val"}
    for r in losses.itertuples():
        assert (rows.loc[r.example_id, "prediction"], rows.loc[r.example_id, "target"],
                rows.loc[r.example_id, "score"]) == (r.prediction, r.target, r.score)
    assert rows.loc["q01", "input"] == "Which is larger, 12 or 5?"  # input fields only
    assert rows.loc["q01", "gradients"] == 3
    assert rows.loc["q01", "blame"] == "hint_a +1.00"  # only the probe that flipped it
    assert set(rows.index[rows["flipped"] != ""]) == truth(log, FLIPPED)
    assert rows.loc["q08", "fallbacks"] == 1
    assert "8 examples match at step 1" in texts(at)


@pytest.mark.parametrize(("query", "expected"), [
    ({"failing": "1"}, FAILING),
    ({"flipped": "1"}, FLIPPED),
    ({"errored": "1"}, {"q08"}),
    ({"split": "val", "failing": "1"}, FAILING + " AND split = 'val'"),
    ({"q": MARKER}, {"q09"}),  # text of a gradient
    ({"q": "12 OR 5"}, {"q01"}),  # text of an input, case-insensitive
])
def test_examples_filters_and_search(open_page, log, query, expected):
    at = open_page("examples", run=log.semantic, step=1, **query)
    wanted = truth(log, expected) if isinstance(expected, str) else expected
    assert wanted and set(frame(at, "prediction")["example_id"]) == wanted
    for key, value in query.items():
        assert at.query_params[key] == value


def test_examples_filter_toggle_is_written_to_the_address(open_page, log):
    at = open_page("examples", run=log.semantic, step=1)
    at.toggle(key="failing").set_value(True).run()
    assert set(frame(at, "prediction")["score"]) == {0.0}
    params = {k: at.query_params[k] for k in ("run", "step", "example", "node", "failing")}
    assert params == {"run": log.semantic, "step": "1", "example": log.example,
                      "node": "final", "failing": "1"}


def test_examples_trace_lists_every_call_with_its_numbers(open_page, log):
    at = open_page("examples", run=log.semantic, step=1, example="q01", view="trace")
    trace = frame(at, "phase")
    assert list(trace["phase"]) == ["forward"] * 3 + ["backward"] + ["update"] * 3
    assert list(trace["node"][:3]) == ["hint_a", "hint_b", "final"]
    assert (trace["tokens in"] > 0).all() and trace["latency (ms)"].notna().all()
    # latency is the model's time on the call; the wait for a turn is its own column
    with duckdb.connect(str(log.db), read_only=True) as con:
        logged = con.execute(
            "SELECT round(latency_ms - queued_ms, 1), round(queued_ms, 1) FROM llm_calls "
            "WHERE run_id = ? AND step = 1", [log.semantic]).fetchall()
    shown = list(zip(trace["latency (ms)"], trace["waited (ms)"], strict=True))
    assert set(shown) <= set(logged) and 250.0 in set(trace["waited (ms)"])
    assert "250 ms waiting summed (for a turn, a retry or an identical call's reply)" in texts(at)
    assert "Trace of example q01 at step 1" in texts(at)
    assert any("Which is larger, 12 or 5?" in c.value for c in at.code)  # messages shown


# --- Prompt history ----------------------------------------------------------------------


def test_history_timeline_verdicts_scores_reasons_and_flips(open_page, log):
    at = open_page("history", run=log.semantic, node="hint_a")
    timeline = frame(at, "verdict")
    assert list(timeline["step"]) == [1, 2]
    # step 1's kept candidate did not need hint_a's edit (its output is canned): dropped
    assert list(timeline["verdict"]) == ["dropped", "rejected"]
    assert timeline["reason"].iloc[0].startswith("dropped from the kept candidate: ")
    assert timeline["edit alone"].iloc[1] == 0.5
    # each score after with its 95% interval on the run's validation examples
    from engine.data.stats import bracketed, score_interval

    with duckdb.connect(str(log.db), read_only=True) as con:
        n_val = con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND split = 'val'",
                            [log.semantic]).fetchone()[0]
    assert list(timeline["after 95%"]) == [bracketed(score_interval(v, n_val))
                                           for v in timeline["validation after"]]
    assert any(f"on {n_val} examples" in e.proto.label for e in at.expander)
    assert timeline["reason"].iloc[1] == REASON
    assert any(REASON in w.value for w in at.warning)  # copying training data: a caveat
    assert ADDED_WORDS.split()[0] in "".join(h.proto.body for h in at.get("html"))
    assert at.query_params["node"] == "hint_a"
    # an edit the step kept (hint_b's) lists the examples that flipped with it
    kept = open_page("history", run=log.semantic, node="hint_b")
    assert list(frame(kept, "verdict")["verdict"]) == ["accepted", "rejected"]
    flips = frame(kept, "score before").set_index("example")
    assert flips.loc["q01", "flipped"] == "fixed"


# --- Compare -----------------------------------------------------------------------------


def test_compare_per_example_rows_disagree_filter_and_paired_prompts(open_page, log):
    at = open_page("compare", run=log.semantic, other=log.textgrad, step=1)
    rows = frame(at, "A prediction").set_index("example")
    # each side with the prompts in effect after step 1 (both runs kept an edit there):
    # validation as step 1's gate scored it, training as step 2 scored it at its start
    with duckdb.connect(str(log.db), read_only=True) as con:
        pairs = con.execute(
            "SELECT a.example_id, a.prediction, a.score, b.prediction, b.score FROM losses a "
            "JOIN losses b USING (split, example_id, step) WHERE step = CASE split "
            "WHEN 'train' THEN 2 ELSE 1 END AND a.run_id = ? AND b.run_id = ?",
            [log.semantic, log.textgrad]).fetchall()
    assert len(rows) == len(pairs) == 8
    for example, pa, sa, pb, sb in pairs:
        assert tuple(rows.loc[example, ["A prediction", "A score", "B prediction",
                                        "B score"]]) == (pa, sa, pb, sb)
    assert not rows.loc["q01", "both back-propagated"]
    assert bool(rows.loc["q09", "both back-propagated"])
    disagree = {e for e, pa, sa, pb, sb in pairs if pa != pb or (sa < 1) != (sb < 1)}
    at.toggle(key="disagree").set_value(True).run()
    assert set(frame(at, "A prediction")["example"]) == disagree
    shown = texts(at)
    # the default pair is an example both runs back-propagated: both gradients and both
    # backward prompts, side by side
    assert "example q09 · step 1" in shown
    assert "A gradient (semantic)" in shown and "B gradient (textgrad)" in shown
    assert "A backward prompt" in shown and "B backward prompt" in shown
    assert "no gradient" not in shown


def test_compare_pairs_the_example_the_link_names(open_page, log):
    at = open_page("compare", run=log.semantic, other=log.textgrad, step=1, pair="q01")
    shown = texts(at)
    assert "example q01 · step 1" in shown
    assert "B did not back-propagate example q01 at step 1" in shown


def test_compare_opens_a_fork_beside_its_parent(open_page, log):
    at = open_page("compare", run=log.gtbp, step=1)
    assert at.selectbox(key="other").value == log.semantic


def test_compare_pairs_only_runs_of_the_same_graph_unasked(open_page, log):
    at = open_page("compare", run=log.semantic, step=1)  # same graph and seed
    assert at.selectbox(key="other").value in (log.textgrad, log.gtbp)
    at = open_page("compare", run=log.demo, step=1)  # the only run of its graph
    assert at.selectbox(key="other").value is None
    assert "No other run of graph **demo** in this run log" in texts(at)


# --- links that hold ---------------------------------------------------------------------


def test_every_run_writes_the_full_state(open_page, log):
    at = open_page("graph", run=log.semantic)
    step = str(at.selectbox(key="step").value)
    assert {k: at.query_params[k] for k in ("run", "step", "example", "node")} == {
        "run": log.semantic, "step": step, "example": at.selectbox(key="example").value,
        "node": "final"}
    at.selectbox(key="node").select("hint_b").run()
    assert at.query_params["run"] == log.semantic and at.query_params["node"] == "hint_b"
    copy = [e for e in at.sidebar if getattr(e, "type", "") == "iframe"]
    assert "navigator.clipboard.writeText" in copy[0].proto.srcdoc


def test_a_link_to_an_unknown_run_warns_and_shows_no_other_run(open_page, log):
    at = open_page("graph", run="no-such-run")
    warnings = " ".join(w.value for w in at.warning)
    assert "no-such-run" in warnings and "not in this run log" in warnings
    assert not any(s.key == "run" for s in at.selectbox)  # no run shown in its place
    assert any(b.label.startswith("Open the newest run") for b in at.button)
    assert "No run selected" in texts(at)
    at.selectbox(key="run_instead").select(log.textgrad).run()  # picking one opens it
    assert at.selectbox(key="run").value == log.textgrad
    assert at.query_params["run"] == log.textgrad and not at.warning


@pytest.mark.parametrize(("param", "value", "shown"), [
    ("step", "99", "`2`"), ("example", "nope", "`q01`"), ("node", "nope", "`final`")])
def test_a_link_to_an_unknown_step_example_or_node_warns(open_page, log, param, value,
                                                         shown):
    query = {"run": log.semantic, "step": 1, param: value}
    at = open_page(None, **query)  # the first page a deep link opens shows the warning
    warning = " ".join(w.value for w in at.warning)
    assert f"`{value}`" in warning and "does not exist" in warning and shown in warning


# --- Runs page ---------------------------------------------------------------------------


def test_runs_page_test_score_export_and_notes(open_page, log):
    at = open_page(run=log.semantic)
    table = frame(at, "test").set_index("run")
    assert table.loc[log.semantic, "test"] == 0.625
    assert "test score **0.625**" in "\n".join(c.value for c in at.caption)
    assert any(b.proto.label.startswith("Download JSON") for b in at.get("download_button"))
    area = next(a for a in at.text_area if a.label == "Notes")
    area.input("baseline for the paper")
    next(t for t in at.text_input if t.label.startswith("Tags")).input("paper, baseline")
    at.button(key=f"FormSubmitter:notes_{log.semantic}-Save notes and tags").click().run()
    with duckdb.connect(str(log.db), read_only=True) as con:
        notes, tags = con.execute("SELECT notes, tags FROM runs WHERE run_id = ?",
                                  [log.semantic]).fetchone()
    assert notes == "baseline for the paper" and json.loads(tags) == ["baseline", "paper"]


def test_export_bytes_json_parquet_and_otel(log):
    import io
    import zipfile

    from dashboard.views.run_panel import export_bytes

    document = json.loads(export_bytes(str(log.db), log.semantic, "JSON"))
    assert document["run_id"] == log.semantic and document["tables"]["losses"]
    names = zipfile.ZipFile(io.BytesIO(export_bytes(str(log.db), log.semantic,
                                                    "Parquet (zip)"))).namelist()
    assert "losses.parquet" in names and "llm_calls.parquet" in names
    otel = export_bytes(str(log.db), log.semantic, "OpenTelemetry (JSON lines)")
    assert b"gen_ai.request.model" in otel


def test_set_notes_rejects_an_unknown_run(log, tmp_path):
    from engine.runlog.schema import RunLogError
    from engine.runlog.writer import set_notes

    db = tmp_path / "notes.duckdb"
    shutil.copy(log.db, db)
    set_notes(db, log.textgrad, "", [" a ", "", "a", "b"])
    with duckdb.connect(str(db), read_only=True) as con:
        row = con.execute("SELECT notes, tags FROM runs WHERE run_id = ?",
                          [log.textgrad]).fetchone()
    assert row[0] is None and json.loads(row[1]) == ["a", "b"]
    with pytest.raises(RunLogError, match="no run"):
        set_notes(db, "nope", "x", [])


def test_history_labels_each_of_a_steps_candidates(log, tmp_path):
    """--proposals 2: the timeline and the cards say which candidate each row of a step
    is ("2 of 2"); a step with one candidate names none. hint_b: an edit step 1 kept."""
    from tests.support.dashboard_log import open_page as open_on
    from tests.support.dashboard_log import with_second_candidate

    db = with_second_candidate(log.db, tmp_path / "candidates.duckdb", log.semantic,
                               " Second draw.", "candidate 2 scored 0 on validation")
    at = open_on(db, "screens/history.py", run=log.semantic, node="hint_b")
    timeline = frame(at, "verdict")
    assert list(timeline["step"]) == [1, 1, 2]
    assert list(timeline["candidate"].fillna("-")) == ["1 of 2", "2 of 2", "-"]
    assert list(timeline["verdict"])[:2] == ["accepted", "rejected"]
    titles = [e.label for e in at.expander]
    assert any(t.startswith("step 1 · candidate 2 of 2 · rejected") for t in titles)
    assert any(t.startswith("step 1 · candidate 1 of 2 · accepted") for t in titles)
    assert any(t.startswith("step 2 · ") and "candidate" not in t for t in titles)
    # flips follow the kept candidate's edit only: a rejected one never ran
    from engine.runlog.debug import node_history

    flips = node_history(db, log.semantic, "hint_b")["flips"]
    fixed = list(timeline["fixed after"])
    assert fixed[0] == ((flips["step"] == 1) & (flips["flipped"] == "fixed")).sum() > 0
    assert all(v is None or v != v for v in fixed[1:]), fixed
    # blame's edit probes test the kept candidate's edit (and a lone step's only one)
    assert list(timeline["blame probes"]) == ["this edit", "", "this edit"]
    probed = "of this step's candidates, the edit blame's edit probes run"
    assert texts(at).count(probed) == 1
    one = open_on(log.db, "screens/history.py", run=log.semantic, node="hint_b")
    assert "candidate" not in frame(one, "verdict").columns
    assert "blame probes" not in frame(one, "verdict").columns
    assert probed not in texts(one)
    # the kept set left hint_b as it was: blame probes the changed, rejected second's edit
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE updates SET accepted = false, new_prompt = old_prompt WHERE "
                    "run_id = ? AND step = 1 AND node_id = 'hint_b' AND candidate = 0",
                    [log.semantic])
    again = frame(open_on(db, "screens/history.py", run=log.semantic, node="hint_b"),
                  "verdict")
    assert list(again["blame probes"]) == ["", "this edit", "this edit"]


def test_the_inspector_shows_a_cached_call_as_cached_not_as_0_ms(open_page, log):
    metrics = {m.label: m.value for m in open_page(
        "inspect", run=log.semantic, step=1, example="q02", node="final").metric}
    assert metrics["latency"] == "cached" and metrics["cache hit"] == "yes"
    metrics = {m.label: m.value for m in open_page(
        "inspect", run=log.semantic, step=1, example="q01", node="final").metric}
    assert metrics["latency"].endswith(" ms") and metrics["cache hit"] == "no"


def test_history_counts_an_accepted_edits_validation_flips_in_a_one_step_run(log, tmp_path):
    """A run that ends after its one accepted step: validation rose from 1 to 3 of 4 in the
    step's gate pass, so the edit fixed 2 validation examples; the page said "No example
    changed pass/fail" (it looked only at a next step the run never had)."""
    from tests.support.dashboard_log import open_page as open_on

    db = tmp_path / "one-step.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        for table in ("losses", "steps", "updates", "node_outputs"):
            con.execute(f"DELETE FROM {table} WHERE run_id = ? AND step = 2", [log.semantic])
    at = open_on(db, "screens/history.py", run=log.semantic, node="hint_b")  # kept at 1
    timeline = frame(at, "verdict")
    assert list(timeline["step"]) == [1] and list(timeline["verdict"]) == ["accepted"]
    assert list(timeline["fixed after"]) == [2] and list(timeline["broke after"]) == [0]
    shown = texts(at)
    assert "No example changed pass/fail" not in shown
    assert "validation in this step's gate pass" in shown
    # no step 2 was ever trained: the page says so, and links to a step that exists
    assert "no later step trained with it" in shown and "step 2" not in shown
    assert [link.label for link in at.get("page_link")
            if "in Examples" in link.label] == ["Open step 1 in Examples, flipped only"]
