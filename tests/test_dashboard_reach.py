"""Blame one click away and background work followed where it was started, under AppTest
on the engine-built run log (support/dashboard_log.py): the Graph, Examples and inspector
pages each start `engine blame` from a button and show it running, then its end; the
Examples blame column tells "not probed" from "probed, nothing fixed it"; a rejected
step's validation rows are labelled as the gate's candidate; the Graph page's colour and
flows choices are in the address; the Examples filters survive a visit to another page;
a job's duration is measured to its end, not to when a page noticed it.

Processes are never started: `jobs.launch` is replaced by a recorder whose jobs are
"running" (their pid is this test's own process) until the test ends them."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import jobs
from tests.support.dashboard_log import build_run_log, like_a_live_server

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    built = build_run_log(tmp_path_factory.mktemp("reach"))
    with duckdb.connect(str(built.db)) as con:  # q01 flipped by hint_a; q02 probed, unmoved
        con.execute("INSERT INTO probes (probe_id, run_id, step, example_id, node_id, kind, "
                    "before_score, after_score, created_at) VALUES "
                    "('p1', ?, 1, 'q01', 'hint_a', 'gradient', 0.0, 1.0, 0), "
                    "('p2', ?, 1, 'q02', 'hint_b', 'gradient', 0.0, 0.0, 0)",
                    [built.semantic, built.semantic])
    return built


@pytest.fixture
def started(monkeypatch, tmp_path):
    """Jobs the pages asked to start: recorded, saved, and running until ended."""
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    launched: list[jobs.Job] = []

    def launch(cmd, run_id, db, steps, name, kind="run"):
        job = jobs.Job(run_id, db, os.getpid(), str(jobs.jobs_dir(db) / f"{name}.log"), cmd,
                       time.time(), steps, kind=kind)
        Path(job.log).write_text("$ engine\nprobing 3 of 8 examples\n")
        jobs._save(job)
        launched.append(job)
        return job

    monkeypatch.setattr(jobs, "launch", launch)
    return launched


def end(job: jobs.Job, code: int = 0) -> None:
    job.returncode, job.ended_at = code, time.time()
    jobs._save(job)


@pytest.fixture
def open_page(log, monkeypatch):
    def run(page: str, db: Path | None = None, **query) -> AppTest:
        monkeypatch.setenv("SEMBACK_DB", str(db or log.db))
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update({k: str(v) for k, v in query.items()})
        at.run()
        at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    with like_a_live_server():
        yield run


def texts(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error",
                                  "success") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts).replace("\\", "")


@pytest.mark.parametrize(("page", "key"), [("graph", "graph_blame"),
                                           ("examples", "examples_blame"),
                                           ("inspect", "inspect_blame")])
def test_one_click_checks_the_blame_and_the_page_follows_it(open_page, log, started, page,
                                                           key):
    at = open_page(page, run=log.semantic, step=1, example=log.example, node="hint_a")
    at.button(key=key).click().run()
    (job,) = started
    assert job.kind == "blame"
    assert job.command[2:] == ["engine", "blame", log.semantic, "--db", str(log.db),
                               "--step", "1"]
    body = texts(at)
    assert f"blame {log.semantic} running" in body and "probing 3 of 8 examples" in body
    assert not [b for b in at.button if b.key == key]  # no second start while it runs
    end(job)
    at.run()
    assert f"blame {log.semantic} finished in" in texts(at)
    assert [b for b in at.button if b.key == key]  # and it can be checked again


@pytest.mark.parametrize(("page", "key"), [("graph", "graph_blame"),
                                           ("examples", "examples_blame"),
                                           ("inspect", "inspect_blame")])
def test_the_blame_button_can_probe_the_validation_examples(open_page, log, started, page,
                                                           key, tmp_path):
    """The button offers the failing validation examples (the ones the update call never
    saw, where each node's edit is tested out of sample) beside the training ones, each
    labelled with its split's size as the run log holds it, and starts what was chosen."""
    db = tmp_path / "sizes.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:  # one validation example fewer than training ones
        con.execute("DELETE FROM examples WHERE run_id = ? AND example_id = (SELECT "
                    "max(example_id) FROM examples WHERE run_id = ? AND split = 'val')",
                    [log.semantic, log.semantic])
        sizes = dict(con.execute("SELECT split, count(DISTINCT example_id) FROM examples "
                                 "WHERE run_id = ? GROUP BY split", [log.semantic]).fetchall())
    assert sizes["val"] == sizes["train"] - 1
    at = open_page(page, db=db, run=log.semantic, step=1, example=log.example, node="hint_a")
    choice = at.radio(key=f"{key}_examples")
    assert choice.value == "failing"  # blame's default, as on the command line
    assert list(choice.options) == [
        f"failing training examples (of {sizes['train']})",
        f"failing validation examples (of {sizes['val']})"]
    assert "never saw" in choice.help
    choice.set_value("val").run()
    at.button(key=key).click().run()
    (job,) = started
    assert job.command[2:] == ["engine", "blame", log.semantic, "--db", str(db),
                               "--step", "1", "--examples", "val"]
    assert f"blame {log.semantic} running" in texts(at)
    assert "s so far · on validation examples" in texts(at)
    end(job)
    at.run()
    assert "s · on validation examples" in texts(at)  # the finished line says which
    assert at.radio(key=f"{key}_examples").value == "val"  # the choice outlived the job


def test_a_run_without_validation_examples_is_offered_no_choice(open_page, log, started,
                                                                tmp_path):
    db = tmp_path / "noval.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM examples WHERE run_id = ? AND split = 'val'", [log.semantic])
    at = open_page("graph", db=db, run=log.semantic, step=1)
    assert not [r for r in at.radio if r.key == "graph_blame_examples"]
    at.button(key="graph_blame").click().run()
    (job,) = started
    assert job.command[-2:] == ["--step", "1"]


def test_a_failed_blame_leaves_its_error_line(open_page, log, started):
    at = open_page("graph", run=log.semantic, step=1)
    at.button(key="graph_blame").click().run()
    (job,) = started
    Path(job.log).write_text("$ engine\nerror: run 'x' has no step 9\n")
    end(job, 2)
    at.run()
    assert any("ended with status 2" in e.value and "error: run 'x' has no step 9"
               in e.value.replace("\\", "") for e in at.error)


def test_the_graph_page_offers_a_button_not_a_command_line(open_page, log):
    at = open_page("graph", run=log.textgrad, step=1)
    assert "python -m engine blame" not in texts(at)
    assert at.button(key="graph_blame").label == "Check the blame"
    # what it would cost, said before it starts: the line blame itself prints first
    from engine.probes.estimate import estimate_from_log

    said = estimate_from_log(log.db, log.textgrad, 1, "failing")
    assert said.startswith("blame: up to ") and " model calls" in said
    assert any(c.value.startswith(said.removeprefix("blame: ")[:40]) for c in at.caption)


def test_graph_colour_and_flows_are_kept_in_the_address(open_page, log):
    at = open_page("graph", run=log.semantic, step=1, example=log.example, node="hint_a")
    at.radio(key="color").set_value("edit").run()
    at.session_state["flows"] = "all"
    at.run()
    assert at.query_params["color"] == "edit" and at.query_params["flows"] == "all"
    copied = open_page("graph", run=log.semantic, step=1, example=log.example, node="hint_a",
                       color="edit", flows="all")  # the copied link, in a new session
    assert copied.radio(key="color").value == "edit"
    assert copied.session_state["flows"] == "all"
    assert any("edit accepted" in n for n in node_labels(copied))


def node_labels(at: AppTest) -> list[str]:
    import json

    (component,) = list(at.get("component_instance"))
    return [n["label"] for n in json.loads(component.proto.json_args)["spec"]["nodes"]]


def test_examples_blame_column_says_which_empty_case_it_is(open_page, log):
    at = open_page("examples", run=log.semantic, step=1)
    table = next(d.value for d in at.dataframe if "blame" in d.value.columns)
    blame = dict(zip(table["example_id"], table["blame"]))
    assert blame["q01"] == "hint_a +1.00"
    assert blame["q02"] == "probed (1), nothing fixed it"
    others = {b for e, b in blame.items() if e not in ("q01", "q02")}
    assert others == {"not probed"}
    assert list(table.columns).index("blame") <= 3  # on screen, beside the score
    assert not (table.astype(str) == "None").any().any()  # no literal None cell


def test_examples_filters_survive_a_visit_to_another_page(open_page, log):
    at = open_page("examples", run=log.semantic, step=1)
    at.toggle(key="failing").set_value(True).run()
    at.text_input(key="q").input("larger").run()
    at.switch_page("screens/graph.py").run()
    for key in ("failing", "q"):  # the sidebar's page links carry no page options
        at.query_params.pop(key, None)
    at.switch_page("screens/examples.py").run()
    assert at.toggle(key="failing").value is True
    assert at.text_input(key="q").value == "larger"


def test_a_rejected_step_labels_its_validation_rows_as_the_candidate(open_page, log,
                                                                     tmp_path):
    db = tmp_path / "rejected.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE steps SET accepted = false, val_score = 0.25 WHERE run_id = ? "
                    "AND step = 1", [log.semantic])
        con.execute("UPDATE updates SET accepted = false WHERE run_id = ? AND step = 1",
                    [log.semantic])
    at = open_page("examples", db=db, run=log.semantic, step=1)
    table = next(d.value for d in at.dataframe if "blame" in d.value.columns)
    assert set(table["split"]) == {"train", "val (gate's candidate)"}
    assert any("rejected candidate's predictions" in w.value and "0.250" in w.value
               for w in at.warning)
    accepted = open_page("examples", run=log.semantic, step=1)  # unplanted: plain val
    table = next(d.value for d in accepted.dataframe if "blame" in d.value.columns)
    assert set(table["split"]) == {"train", "val"}


def test_a_job_lasts_until_its_log_was_last_written_not_until_a_page_polled(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    db = str(tmp_path / "runs.duckdb")
    log_file = jobs.jobs_dir(db) / "blame-x.log"
    log_file.write_text("$ engine blame\ndone\n")
    began = time.time() - 400  # started 400 s ago, its log last written 380 s ago
    os.utime(log_file, (began + 20, began + 20))
    job = jobs.Job("r", db, 999_999_990, str(log_file), [], began, 0, kind="blame")
    jobs._save(job)
    (found,) = jobs.list_jobs(db, kinds=("blame",))  # noticed only now
    assert found.returncode == -1 and round(found.seconds) == 20
    assert round(jobs.load(found.record).seconds) == 20  # and the record keeps it


def test_the_inspector_marks_a_degenerate_gradient(open_page, log, tmp_path):
    db = tmp_path / "noise.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE gradients SET content = '' WHERE run_id = ? AND step = 1 AND "
                    "example_id = ? AND node_id = 'hint_a' AND kind = 'gradient'",
                    [log.semantic, log.example])
    at = open_page("inspect", db=db, run=log.semantic, step=1, example=log.example,
                   node="hint_a")
    assert any(w.value.startswith("Degenerate gradient (empty)") and "often noise" in w.value
               for w in at.warning)
    clean = open_page("inspect", run=log.semantic, step=1, example=log.example, node="hint_a")
    assert not any("Degenerate" in w.value for w in clean.warning)


def test_the_graph_colours_by_blame_once_the_blame_it_started_ends(open_page, log, started):
    at = open_page("graph", run=log.textgrad, step=1)
    assert at.radio(key="color").value == "grad_chars"  # no probes yet
    at.button(key="graph_blame").click().run()
    end(started[0])
    at.run()
    assert at.radio(key="color").value == "blame"
    at.radio(key="color").set_value("edit").run()  # a choice made afterwards stays
    at.run()
    assert at.radio(key="color").value == "edit"


def test_a_nodes_gradient_length_reads_the_same_on_its_label_and_in_the_table(open_page,
                                                                            log, tmp_path):
    db = tmp_path / "half.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:  # a mean of 82.5 characters: rounding decides
        con.execute("""UPDATE gradients SET content = repeat('x', CASE WHEN example_id =
            (SELECT min(example_id) FROM gradients WHERE run_id = ? AND step = 1 AND
             kind = 'aggregate' AND node_id = 'hint_b') THEN 82 ELSE 83 END)
            WHERE run_id = ? AND step = 1 AND kind = 'aggregate' AND node_id = 'hint_b'""",
                    [log.textgrad, log.textgrad])
    at = open_page("graph", db=db, run=log.textgrad, step=1, color="grad_chars")
    table = next(d.value for d in at.dataframe if "grad_chars" in d.value.columns)
    shown = dict(zip(table["node_id"], table["grad_chars"]))
    labels = {label.split(" · ")[0]: label for label in node_labels(at)}
    for node, value in shown.items():
        assert f"∇ {value} chars" in labels[node], (labels[node], value)


def test_prompt_history_counts_one_proposal_as_one(open_page, log, tmp_path):
    db = tmp_path / "one.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM updates WHERE run_id = ? AND node_id = 'hint_b' AND step > 1",
                    [log.semantic])
    # hint_b: its step-1 edit was kept (hint_a's was dropped: the gain did not need it)
    at = open_page("history", db=db, run=log.semantic, step=1, node="hint_b")
    body = texts(at)
    assert "the starting prompt, 1 proposal (1 accepted)" in body and "1 proposals" not in body


def test_a_finished_demo_leads_on_with_a_failing_backpropagated_example(open_page, log,
                                                                       monkeypatch,
                                                                       tmp_path):
    from dashboard.state import DEMO_RUN_KEY

    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    job = jobs.Job(log.demo, str(log.db), os.getpid(), str(jobs.jobs_dir(log.db) / "d.log"),
                   [], time.time(), 1, kind="run")
    Path(job.log).write_text("$ engine run demo.yaml\n")
    jobs._save(job)
    with duckdb.connect(str(log.db), read_only=True) as con:
        step = con.execute("SELECT max(step) FROM updates WHERE run_id = ? AND "
                           "new_prompt <> old_prompt", [log.demo]).fetchone()[0]
        worth = {r[0] for r in con.execute("""SELECT l.example_id FROM losses l WHERE
            l.run_id = ? AND l.step = ? AND l.score < 1 AND l.example_id IN (SELECT
            example_id FROM gradients WHERE run_id = ? AND step = ? AND kind = 'gradient')""",
                                           [log.demo, step, log.demo, step]).fetchall()}
        passing = con.execute("SELECT min(example_id) FROM losses WHERE run_id = ? AND "
                              "step = ? AND score >= 1", [log.demo, step]).fetchone()[0]
    at = open_page("runs", run=log.demo, step=step, example=passing)  # while it runs
    at.session_state[DEMO_RUN_KEY] = log.demo
    end(job)
    at.run()
    assert at.session_state["run"] == log.demo and at.session_state["step"] == step
    assert at.session_state["example"] in worth
    assert any("The demo finished" in s.value for s in at.success)
    links = {p.proto.page: p.proto.query_string for p in at.get("page_link")}
    for page in ("learn", "graph"):
        assert f"example={at.session_state['example']}" in links[page]


def test_the_graph_node_table_has_no_none_cells(open_page, log):
    at = open_page("graph", run=log.semantic, step=1)  # probes at hint_a and hint_b only
    table = next(d.value for d in at.dataframe if "grad_chars" in d.value.columns)
    assert not table.isna().any().any()
    assert dict(zip(table["node_id"], table["probed"]))["final"] == 0
