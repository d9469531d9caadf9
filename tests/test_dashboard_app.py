"""Every dashboard page under Streamlit's AppTest, on a run log built by the real engine
(see support/dashboard_log.py), driven through query parameters (deep links) and the
sidebar pickers. Assertions are on content: numbers, gradient texts, diff words."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest
from streamlit.testing.v1.element_tree import UnknownElement

from engine.core.graph import load_graph
from engine.runs.settings import DEFAULTS
from tests.support.dashboard_log import (
    ADDED_WORDS,
    HINT_A_OUTPUT,
    XSS,
    build_run_log,
    like_a_live_server,
)

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"
TIMEOUT = 60


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return build_run_log(tmp_path_factory.mktemp("dashboard"))


@pytest.fixture
def open_page(log, monkeypatch, tmp_path):
    """open_page(page, db=None, **query) -> AppTest showing that page."""
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    with like_a_live_server():
        yield _opener(log, monkeypatch)


def _opener(log, monkeypatch):

    def run(page: str | None = None, db: Path | None = None, **query) -> AppTest:
        monkeypatch.setenv("SEMBACK_DB", str(db or log.db))
        at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
        at.query_params.update({k: str(v) for k, v in query.items()})
        at.run()
        if page:
            at.switch_page(f"screens/{page}.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    return run


def test_a_deep_link_works_on_a_fresh_server(log, monkeypatch):
    """Without the shim: the first request of a fresh server runs the page file alone;
    its guard reruns the app through st.navigation, so the sidebar and the page appear."""
    monkeypatch.setenv("SEMBACK_DB", str(log.db))
    at = AppTest.from_file(str(APP), default_timeout=TIMEOUT)
    at.query_params.update(run=log.semantic, step="1", example=log.example, node="hint_a")
    at.run()
    at.switch_page("screens/inspect.py").run()
    assert not at.exception
    assert at.title[0].value == "Node hint_a"
    assert at.selectbox(key="run").value == log.semantic


def new_run_form(at: AppTest):
    """The New-run form (the Runs page also has the selected run's notes form)."""
    return next(f for f in at.get("form") if "Graph" in {s.label for s in f.selectbox})


def texts(at: AppTest) -> str:
    """Every text the page shows (markdown, captions, code blocks, plain text, metrics)."""
    parts = [e.value for kind in ("markdown", "caption", "code", "text", "title", "subheader",
                                  "header", "info", "warning", "success", "error")
             for e in getattr(at, kind)]
    parts += [f"{m.label}={m.value}" for m in at.metric]
    return re.sub(r"\\(.)", r"\1", "\n".join(str(p) for p in parts))  # undo Markdown escapes


def unknown(at: AppTest, kind: str) -> list:
    """Elements of one unknown kind in the main area (the sidebar holds the Copy link
    button's iframe)."""
    found: list = []

    def walk(node) -> None:
        for child in getattr(node, "children", {}).values():
            if isinstance(child, UnknownElement) and child.type == kind:
                found.append(child.proto)
            walk(child)

    sidebar = at.sidebar
    for child in at._tree.children.values():
        if child is not sidebar:
            walk(child)
    return found


def values(array) -> list:
    """A plotly JSON array: a plain list, or a typed array {dtype, bdata}."""
    if isinstance(array, dict) and "bdata" in array:
        import numpy as np

        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def html_blocks(at: AppTest) -> str:
    return "\n".join(h.proto.body for h in at.get("html"))


def code_blocks(at: AppTest) -> list[str]:
    return [c.value for c in at.code]


# --- Runs ------------------------------------------------------------------------------------


def test_runs_table_shows_the_numbers_in_the_run_log(open_page, log):
    at = open_page()
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value.set_index("run")
    assert set(table.index) == {log.semantic, log.textgrad, log.demo, log.gtbp}
    with duckdb.connect(str(log.db), read_only=True) as con:
        # what was spent (model calls, their tokens), cache hits apart
        truth = dict(con.execute(
            "SELECT run_id, [count(*) FILTER (WHERE NOT cache_hit), coalesce(sum(prompt_tokens "
            "+ completion_tokens) FILTER (WHERE NOT cache_hit), 0), count(*) FILTER (WHERE "
            "cache_hit)] FROM llm_calls GROUP BY run_id").fetchall())
        best = dict(con.execute("SELECT run_id, max(val_score) FROM steps GROUP BY run_id"
                                ).fetchall())
    for run_id, (calls, tokens, hits) in truth.items():
        assert table.loc[run_id, "calls"] == calls
        assert table.loc[run_id, "tokens"] == tokens
        assert table.loc[run_id, "cache hits"] == hits
        assert table.loc[run_id, "best validation"] == pytest.approx(best[run_id])
    assert table.loc[log.semantic, "method"] == "semantic"
    assert table.loc[log.textgrad, "status"] == "finished"
    assert table.loc[log.semantic, "steps"] == 2
    assert table.loc[log.semantic, "models"] == "scripted"


def test_the_selected_run_shows_tokens_and_cost_per_step_and_phase(open_page, log):
    at = open_page("runs", run=log.semantic)
    assert at.title[0].value == "Runs"
    costs = next(d.value for d in at.dataframe if "cache hits (free)" in d.value.columns)
    with duckdb.connect(str(log.db), read_only=True) as con:
        calls = con.execute(
            "SELECT c.step, c.purpose, e.split, c.cache_hit FROM llm_calls c LEFT JOIN "
            "(SELECT DISTINCT example_id, split FROM examples WHERE run_id = ?) e "
            "USING (example_id) WHERE c.run_id = ?", [log.semantic, log.semantic]).fetchall()
    # the progress line's phases: validation calls after a step's updates are the gate,
    # test examples' calls the test
    updated = {step for step, purpose, _, _ in calls if purpose == "update"}
    counts: dict = {}
    for step, purpose, split, hit in calls:
        phase = purpose if purpose not in ("forward", "loss") else (
            "test" if split == "test" else "gate" if split == "val" and step in updated
            else purpose)
        counts.setdefault((step, phase), [0, 0])[bool(hit)] += 1
    assert {(s, "gate") for s in updated} <= set(counts)
    shown = {(r[0], r[1]): [r[2], r[3]] for r in costs[
        ["step", "phase", "model calls", "cache hits (free)"]].itertuples(index=False)}
    assert shown == counts
    truth = [(s, p, *c) for (s, p), c in counts.items()]
    line = [m.value for m in at.markdown if m.value.startswith("**Cost**")]
    spent, hits = sum(t[2] for t in truth), sum(t[3] for t in truth)
    assert line and f"{spent:,} model calls" in line[0] and f"{hits:,} cache hits" in line[0]


def test_new_run_form_shows_the_estimate_before_start(open_page, log, started):
    at = open_page()
    form = new_run_form(at)
    uploads = {u.label: u for u in form.file_uploader}
    uploads["Graph file (YAML)"].upload("tiny.yaml", log.graph.read_bytes(), "text/yaml")
    uploads["Dataset (JSONL, optional)"].upload(
        "tiny.jsonl", log.graph.with_name("tiny.jsonl").read_bytes(), "application/jsonl")
    {s.label: s for s in form.selectbox}["Backend"].select("scripted")
    {n.label: n for n in form.number_input}["Steps"].set_value(2)
    at.button(key="FormSubmitter:new_run-Estimate cost").click().run()
    assert not at.exception and started == []  # nothing started
    assert at.info and at.info[0].value.startswith("estimate: ~")
    # the breakdown by phase; per-node gates are off by default, so no phase for them
    assert "validation candidate" in at.code[0].value
    assert "per-node gates" not in at.code[0].value


def test_runs_filter_and_sort(open_page, log):
    at = open_page()
    at.multiselect(key="runs_method").select("textgrad").run()
    assert list(at.dataframe[0].value["run"]) == [log.textgrad]
    at.multiselect(key="runs_method").unselect("textgrad").run()
    at.text_input(key="runs_filter").input("tiny").run()
    assert set(at.dataframe[0].value["run"]) == {log.semantic, log.textgrad, log.gtbp}
    at.text_input(key="runs_filter").input("").run()
    at.selectbox(key="runs_sort").select("calls").run()
    at.toggle(key="runs_desc").set_value(False).run()
    calls = list(at.dataframe[0].value["calls"])
    assert calls == sorted(calls) and len(calls) == 4


@pytest.fixture
def started(monkeypatch, tmp_path) -> list:
    """Specs the pages asked `jobs.start` to run; nothing is started."""
    from dashboard import jobs

    specs: list = []
    monkeypatch.setattr(jobs, "start", lambda spec: specs.append(spec) or jobs.Job(
        "r", spec.db, 1, str(tmp_path / "r.log"), [], 0.0, spec.steps, returncode=0))
    return specs


def test_empty_run_log_offers_the_demo(open_page, tmp_path, started):
    at = open_page(db=tmp_path / "empty.duckdb")
    assert "has no runs yet" in texts(at)
    at.button(key="run_demo").click().run()
    assert len(started) == 1
    spec = started[0]
    assert Path(spec.graph).name == "demo.yaml" and spec.backend == "local"
    assert spec.db == str(tmp_path / "empty.duckdb")


def test_new_run_form_builds_the_engine_command(open_page, log, started):
    from dashboard import jobs

    at = open_page()
    form = new_run_form(at)
    selects = {s.label: s for s in form.selectbox}
    numbers = {n.label: n for n in form.number_input}
    uploads = {u.label: u for u in form.file_uploader}
    uploads["Graph file (YAML)"].upload("tiny.yaml", log.graph.read_bytes(), "text/yaml")
    data_file = log.graph.with_name("tiny.jsonl")
    uploads["Dataset (JSONL, optional)"].upload("tiny.jsonl", data_file.read_bytes(),
                                                "application/jsonl")
    selects["Backend"].select("scripted")
    at.selectbox(key="new_run_method").select("textgrad")
    numbers["Steps"].set_value(3)
    numbers["Train examples"].set_value(6)
    numbers["Seed"].set_value(5)
    at.button(key="FormSubmitter:new_run-Start run").click().run()
    assert len(started) == 1
    spec = started[0]
    assert (spec.method, spec.backend, spec.steps, spec.train, spec.seed) == (
        "textgrad", "scripted", 3, 6, 5)
    assert spec.val is None and Path(spec.graph).read_text() == log.graph.read_text()
    assert Path(spec.dataset).read_bytes() == data_file.read_bytes()
    cmd = jobs.build_command(spec)
    assert cmd[cmd.index("--method") + 1] == "textgrad" and "--val" not in cmd
    assert "--option" not in cmd  # gtbp's schedule only goes with gtbp


def test_new_run_forms_steps_default_to_the_graphs_own(open_page, log, started):
    """demo.yaml says `steps: 1`: Start without touching Steps runs 1 step, not run's 4;
    a graph without the setting takes run's default."""
    at = open_page()
    steps = {n.label: n for n in new_run_form(at).number_input}["Steps"]
    assert steps.value is None  # shown as "graph's default"
    at.button(key="FormSubmitter:new_run-Start run").click().run()
    assert Path(started[0].graph).name == "demo.yaml" and started[0].steps == 1
    at = open_page()
    uploads = {u.label: u for u in new_run_form(at).file_uploader}
    uploads["Graph file (YAML)"].upload("tiny.yaml", log.graph.read_bytes(), "text/yaml")
    at.button(key="FormSubmitter:new_run-Start run").click().run()
    assert started[1].steps == (load_graph(log.graph).steps or DEFAULTS.steps)


def test_a_run_that_ended_with_an_error_says_why_outside_its_collapsed_log(open_page, log):
    """A wrong model name with Start: the run ends at once; the card says the engine's
    error, not only "ended (exit code 2)" over a collapsed log."""
    import time

    from dashboard import jobs

    db = log.db
    record = jobs.jobs_dir(db) / "bad-model.log"
    record.write_text("starting\nerror: unknown model 'qwen-9b': choose one of "
                      "qwen2.5-coder-0.5b, ... or a GGUF file's path\n")
    jobs._save(jobs.Job("bad-model", str(db), 999_999_992, str(record),
                        ["python", "-m", "engine", "run"], time.time(), 4, returncode=2))
    at = open_page()
    assert "ended (exit code 2)" in texts(at)
    assert [e.value for e in at.error] == [
        "error: unknown model 'qwen-9b': choose one of qwen2.5-coder-0.5b, ... or a GGUF "
        "file's path"]


def test_new_run_form_offers_installed_models_and_names_the_install_of_others(
        open_page, started, monkeypatch):
    from dashboard import jobs
    from engine.llm import models

    def listing():
        return [models.ModelListing(name, name != "qwen2.5-coder-1.5b", None, None, None,
                                    "Apache-2.0") for name in models.MODELS]

    monkeypatch.setattr(models, "list_models", listing)
    at = open_page()
    model = {s.label: s for s in new_run_form(at).selectbox}["Model"]
    assert model.options == ["qwen2.5-coder-0.5b", "smollm2-135m"]  # the default first
    assert "Not installed (local models): qwen2.5-coder-1.5b: `python -m engine models " \
           "install qwen2.5-coder-1.5b`" in texts(at)
    model.select("smollm2-135m")
    at.button(key="FormSubmitter:new_run-Start run").click().run()
    cmd = jobs.build_command(started[0])
    assert cmd[cmd.index("--model") + 1] == "smollm2-135m"


def test_new_gtbp_run_passes_its_schedule_and_data_dir(open_page, log, started):
    from dashboard import jobs

    at = open_page()
    assert not any(n.label.startswith("gtbp") for n in new_run_form(at).number_input)
    at.selectbox(key="new_run_method").select("gtbp").run()
    form = new_run_form(at)
    numbers = {n.label: n for n in form.number_input}
    numbers["gtbp: initial edit budget m0"].set_value(3)
    numbers["gtbp: budget shrinks every m- steps"].set_value(4)
    {t.label: t for t in form.text_input}["Data directory"].input("/data/sets")
    at.button(key="FormSubmitter:new_run-Start run").click().run()
    (spec,) = started
    cmd = jobs.build_command(spec)
    assert cmd[cmd.index("--method") + 1] == "gtbp"
    assert cmd[cmd.index("--data-dir") + 1] == "/data/sets"
    options = [cmd[i + 1] for i, flag in enumerate(cmd) if flag == "--option"]
    assert options == ["m0=3", "m_plus=2", "m_minus=4"]


def test_a_live_run_refreshes_itself(open_page, log, tmp_path):
    db = tmp_path / "live.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", [log.semantic])
    at = open_page("curves", db=db, run=log.semantic)
    # the run planned 2 steps and wrote both (step 0, the baseline, is not one): as the
    # Runs table's steps column says
    assert ":material/sync: live · 2 of 2 steps written" in texts(at)
    assert "running" in texts(at)


def test_a_live_run_is_followed_until_a_step_is_pinned(open_page, log, tmp_path):
    """While running: the newest step is shown (not the default step with edits), with
    the phase and calls from the job's progress events; a step picked by hand stays."""
    from dashboard import jobs

    db = tmp_path / "live.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET status = 'running' WHERE run_id = ?", [log.semantic])
        con.execute("DELETE FROM steps WHERE run_id = ? AND step = 2", [log.semantic])
    job = jobs.Job(log.semantic, str(db.resolve()), 999_999_997, "", [], 0.0, 2)
    job.log = str(jobs.jobs_dir(db) / f"{log.semantic}.log")
    Path(job.log).write_text("step 2 backward: 3/8 calls (96 in all)\n")  # for people
    events = [{"event": "step_finished", "run_id": log.semantic, "step": 0, "calls_total": 30},
              {"event": "step_finished", "run_id": log.semantic, "step": 1, "calls_total": 70},
              {"event": "progress", "run_id": log.semantic, "step": 2, "phase": "backward",
               "calls_done": 3, "calls_expected": 8, "calls_total": 96}]
    job.progress_file.write_text("".join(json.dumps(e) + "\n" for e in events))
    job.returncode = None
    jobs._save(job)
    at = open_page("graph", db=db, run=log.semantic)
    assert at.selectbox(key="step").value == 1 and at.toggle(key="follow_newest").value
    assert "now step 2: backward, 3 of 8 calls" in texts(at)
    assert at.query_params["follow"] in ("1", ["1"])  # the address keeps the following
    at.selectbox(key="step").select(0).run()  # pin step 0
    assert at.selectbox(key="step").value == 0 and not at.toggle(key="follow_newest").value
    with duckdb.connect(str(db)) as con:  # a new step lands: the pinned view stays
        con.execute("INSERT INTO steps SELECT * REPLACE (2 AS step) FROM steps "
                    "WHERE run_id = ? AND step = 1", [log.semantic])
    at.run()
    assert at.selectbox(key="step").value == 0
    at.toggle(key="follow_newest").set_value(True).run()
    assert at.selectbox(key="step").value == 2
    at.query_params["step"] = "0"  # a link naming a step (e.g. from Examples) pins it
    at.query_params.pop("follow", None)
    at.run()
    assert at.selectbox(key="step").value == 0 and not at.toggle(key="follow_newest").value


def test_an_unreadable_file_is_reported(open_page, tmp_path):
    bad = tmp_path / "not-a-db.duckdb"
    bad.write_text("hello")
    at = open_page(db=bad)
    assert any("Cannot read" in e.value for e in at.error)


# --- Node inspector --------------------------------------------------------------------------


def test_deep_link_opens_the_inspector_with_gradients_prompt_and_diff(open_page, log):
    at = open_page("inspect", run=log.semantic, step=1, example=log.example, node="hint_a")
    assert at.title[0].value == "Node hint_a"
    assert at.selectbox(key="node").value == "hint_a"
    assert at.selectbox(key="example").value == log.example
    codes = code_blocks(at)
    # the node's output is shown as text, payload included, never as HTML
    assert HINT_A_OUTPUT in codes
    # the gradient received from its successor `final`, and the backward prompt that
    # produced it: the successor's other input (the sibling hint_b) is visible in it
    shown = texts(at)
    assert "Gradient from successor final" in shown
    assert any(c.startswith("The input hint_a should") for c in codes)
    backward_prompt = next(c for c in codes if "For each input produced by an earlier step" in c)
    assert '<input name="hint_b">' in backward_prompt and '<input name="hint_a">' in backward_prompt
    # the aggregated gradient and the edit as a word-level diff
    assert "aggregated gradient" in shown
    diff = html_blocks(at)
    for word in ADDED_WORDS.split():
        assert word in diff
    assert "<ins" in diff
    assert "validation before" in shown and "validation after (all edits of the step)" in shown
    # the joint gate's score beside the score of this node's edit alone (per-node gate)
    with duckdb.connect(str(log.db), read_only=True) as con:
        joint, alone = con.execute("SELECT val_after, val_alone FROM updates WHERE run_id = ? "
                                   "AND step = 1 AND node_id = 'hint_a'",
                                   [log.semantic]).fetchone()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["validation after (all edits of the step)"] == f"{joint:.3f}"
    assert metrics["validation with this edit alone"] == (
        "–" if alone is None else f"{alone:.3f}")
    assert "prompt tokens" in shown and "cache hit" in shown
    assert "<img" not in diff


def test_node_picker_switches_the_inspector(open_page, log):
    at = open_page("inspect", run=log.semantic, step=1, example=log.example, node="hint_a")
    at.selectbox(key="node").select("final").run()
    assert at.title[0].value == "Node final"
    assert at.session_state["selected_node"] == "final"
    assert any("Gradient from the loss" in m.value for m in at.markdown)
    assert "The expected output is" in "\n".join(code_blocks(at))
    assert "Target and inferred input (gtbp)" not in texts(at)


def test_gtbp_run_shows_target_beside_output_and_inferred_input(open_page, log):
    at = open_page("inspect", run=log.gtbp, step=1, example=log.example, node="final")
    with duckdb.connect(str(log.db), read_only=True) as con:
        target, output = con.execute(
            "SELECT e.target, a.output_text FROM examples e JOIN node_outputs a "
            "ON a.run_id = e.run_id AND a.example_id = e.example_id WHERE e.run_id = ? "
            "AND e.example_id = ? AND a.step = 1 AND a.node_id = 'final' AND "
            "a.split = 'train'", [log.gtbp, log.example]).fetchone()
        inferred = con.execute(
            "SELECT content FROM gradients WHERE run_id = ? AND step = 1 AND "
            "example_id = ? AND node_id = 'final' AND kind = 'inferred_input'",
            [log.gtbp, log.example]).fetchone()[0]
    shown = texts(at)
    assert "Target and inferred input (gtbp)" in shown
    assert "Target from the loss (output gradient)" in shown
    codes = code_blocks(at)
    assert target in codes and output in codes and inferred in codes
    diff = html_blocks(at)
    assert "semback-diff" in diff and ("<ins" in diff or target == output)
    # hint_a received a target from `final`, with the gtbp call that wrote it
    at.selectbox(key="node").select("hint_a").run()
    assert "Target from successor final" in texts(at)
    assert any("leads to" in c for c in code_blocks(at))


def test_example_and_step_pickers_change_the_view(open_page, log):
    at = open_page("inspect", run=log.semantic, step=1, example=log.example, node="final")
    at.selectbox(key="step").select(0).run()
    assert "step 0" in at.caption[0].value or "step 0" in texts(at)
    assert "No update was proposed for this node at this step." in texts(at)


# --- Graph -----------------------------------------------------------------------------------


def drawing(at: AppTest) -> dict:
    """The spec handed to the graph component (the one drawing)."""
    found = unknown(at, "component_instance")
    assert len(found) == 1, "exactly one graph drawing"
    return json.loads(found[0].json_args)["spec"]


def test_graph_page_draws_the_graph_component_with_the_selection(open_page, log):
    at = open_page("graph", run=log.semantic, step=1, example=log.example, node="hint_a")
    spec = drawing(at)
    nodes = {n["id"]: n for n in spec["nodes"]}
    assert {"hint_a", "hint_b", "final"} <= set(nodes)
    assert spec["selected"] == "hint_a" and nodes["hint_a"]["selected"]
    assert HINT_A_OUTPUT in nodes["hint_a"]["tooltip"]  # plain text, set as textContent
    assert not unknown(at, "plotly_chart")  # no second chart to click: the drawing is it
    gradient = [e for e in spec["edges"] if e["kind"] == "gradient"]
    assert gradient and all("× ∇" in e["label"] for e in gradient)
    assert "Node hint_a" in texts(at)
    assert HINT_A_OUTPUT in code_blocks(at)
    assert "not probed" in texts(at)  # the per-node blame, before any probe
    assert "failing" not in " ".join(at.dataframe[0].value.columns)


def test_graph_selection_follows_the_picker_and_the_colour_choice(open_page, log):
    at = open_page("graph", run=log.semantic, step=1, example=log.example, node="hint_a")
    at.selectbox(key="node").select("final").run()
    assert drawing(at)["selected"] == "final"
    assert "Node final" in texts(at)
    at.radio(key="color").set_value("edit").run()
    assert any("edit accepted" in n["label"] for n in drawing(at)["nodes"])
    at.radio(key="color").set_value("grad_chars").run()
    assert any("chars" in n["label"] for n in drawing(at)["nodes"])


def test_a_click_in_the_drawing_selects_the_node(open_page, log):
    """A click cannot be simulated in AppTest: check the callback's reading of the
    component's value, then give the node picker the value the callback writes."""
    from dashboard.views.graph_component import clicked

    assert clicked({"node": "hint_b", "clicks": 1}) == "hint_b"
    at = open_page("graph", run=log.semantic, step=1, example=log.example, node="hint_a")
    at.session_state["node"] = clicked({"node": "hint_b", "clicks": 1})
    at.run()
    assert "Node hint_b" in texts(at)
    assert drawing(at)["selected"] == "hint_b"
    assert at.session_state["selected_node"] == "hint_b"


# --- Step through ----------------------------------------------------------------------------


def test_step_through_walks_forward_loss_backward_update(open_page, log):
    at = open_page("step", run=log.semantic, step=1, example=log.example, node="final")
    assert "1 / 8: Forward: hint_a" in texts(at)
    assert HINT_A_OUTPUT in code_blocks(at)
    assert drawing(at)["selected"] == "hint_a"  # the walk's node is outlined
    for _ in range(3):
        at.button(key="walk_next").click().run()
    shown = texts(at)
    assert "4 / 8: Loss on final's output" in shown
    assert "score=0.00" in shown and "The expected output is" in "\n".join(code_blocks(at))
    at.button(key="walk_next").click().run()
    assert "5 / 8: Backward: final" in texts(at)
    assert any(c.startswith("The input hint_a should") for c in code_blocks(at))
    assert at.session_state["node"] == "final"  # the sidebar follows the walk
    for _ in range(3):
        at.button(key="walk_next").click().run()
    assert "8 / 8: Update" in texts(at)
    diff = html_blocks(at)
    assert all(word in diff for word in ADDED_WORDS.split())
    at.button(key="walk_prev").click().run()
    assert "7 / 8: Backward: hint_a" in texts(at)


def test_step_through_radio_jumps_to_a_stop(open_page, log):
    at = open_page("step", run=log.semantic, step=1, example=log.example)
    at.radio(key="walk").set_value(6).run()
    assert "7 / 8: Backward: hint_a" in texts(at)
    assert at.session_state["node"] == "hint_a"


# --- Curves, Compare, Learn ---------------------------------------------------------------


def test_curves_show_scores_and_usage(open_page, log):
    at = open_page("curves", run=log.semantic)
    figures = [json.loads(p.spec) for p in unknown(at, "plotly_chart")]
    scores = figures[0]
    val = next(t for t in scores["data"] if t["name"] == "validation")
    with duckdb.connect(str(log.db), read_only=True) as con:
        truth = [r[0] for r in con.execute(
            "SELECT val_score FROM steps WHERE run_id = ? ORDER BY step", [log.semantic]
        ).fetchall()]
        accepted = [r[0] for r in con.execute(
            "SELECT step FROM steps WHERE run_id = ? AND accepted ORDER BY step",
            [log.semantic]).fetchall()]
        forward = con.execute("SELECT sum(prompt_tokens + completion_tokens) FROM llm_calls "
                              "WHERE run_id = ? AND purpose = 'forward'", [log.semantic]
                              ).fetchone()[0]
    assert values(val["y"]) == pytest.approx(truth)
    # each validation score with its 95% interval on the run's validation examples, as
    # `run`'s summary prints it
    from engine.data.stats import score_interval

    with duckdb.connect(str(log.db), read_only=True) as con:
        n_val = con.execute("SELECT count(*) FROM examples WHERE run_id = ? AND split = 'val'",
                            [log.semantic]).fetchone()[0]
    bounds = [score_interval(v, n_val) for v in truth]
    assert n_val > 0
    assert values(val["error_y"]["arrayminus"]) == pytest.approx(
        [v - lo for v, (lo, _) in zip(truth, bounds)])
    assert values(val["error_y"]["array"]) == pytest.approx(
        [hi - v for v, (_, hi) in zip(truth, bounds)])
    low, high = bounds[0]
    assert (f"Validation: initial {truth[0]:.3f} on {n_val} examples (95% interval "
            f"{low:.2f}–{high:.2f})") in texts(at)
    stars = next(t for t in scores["data"] if t["name"] == "accepted edit")
    assert values(stars["x"]) == accepted
    by_node = figures[1]
    assert {t["name"] for t in by_node["data"]} >= {"forward", "backward", "update"}
    per_phase = figures[3]
    phases = dict(zip(values(per_phase["data"][0]["x"]), values(per_phase["data"][0]["y"])))
    assert phases["forward"] == forward
    at.segmented_control(key="curves_measure").set_value("calls").run()
    assert "calls per node" in json.dumps(json.loads(unknown(at, "plotly_chart")[1].spec))


def test_compare_two_runs(open_page, log):
    at = open_page("compare", run=log.semantic, step=1, example=log.example)
    assert at.selectbox(key="other").value == log.textgrad  # same graph and seed
    summary = at.dataframe[0].value
    assert list(summary["method"]) == ["semantic", "textgrad"]
    curves = json.loads(unknown(at, "plotly_chart")[0].spec)
    assert {"A validation", "B validation"} <= {t["name"] for t in curves["data"]}
    assert all(t["error_y"]["array"] for t in curves["data"] if t["name"].endswith("validation"))
    shown = texts(at)
    assert "A gradient (semantic)" in shown and "B gradient (textgrad)" in shown
    assert "Prompts: latest accepted versions" in shown
    assert "semback-diff" in html_blocks(at)


def test_learn_tour_uses_the_demo_run(open_page, log):
    at = open_page("learn", run=log.semantic)
    assert "Showing demo run" in texts(at) and log.demo in texts(at)
    assert at.segmented_control(key="tour").value == "The graph"
    at.button(key="tour_next").click().run()
    assert at.segmented_control(key="tour").value == "Forward pass"
    assert "forward pass" in texts(at)
    at.segmented_control(key="tour").set_value("Semantic gradient").run()
    shown = texts(at)
    assert "What mood received from answer" in shown.replace("\\", "")
    prompts = "\n".join(code_blocks(at))
    assert '<input name="review">' in prompts and '<input name="mood">' in prompts
    at.segmented_control(key="tour").set_value("Update").run()
    assert "semback-diff" in html_blocks(at)


def test_no_page_renders_model_text_as_html(open_page, log):
    for page in ("graph", "step", "inspect", "curves", "compare", "learn"):
        at = open_page(page, run=log.semantic, step=1, example=log.example, node="hint_a")
        assert XSS not in html_blocks(at), page
        for md in at.markdown:
            assert XSS not in md.value or md.proto.allow_html is False, page
