"""The Learn tour under AppTest: its text
quotes the run's own data, the stage count matches the tabs, the gate shows an accepted
and a rejected proposal, the sibling-blind contrast comes from a paired run, a proposal
that copies training examples carries a caveat, and the blame stage reads the probes."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import jobs
from engine.data.stats import wilson
from tests.support.dashboard_log import (
    REVIEWS,
    build_run_log,
    like_a_live_server,
    open_page,
    responder,
    with_second_candidate,
)

APP = Path(__file__).resolve().parents[1] / "dashboard" / "app.py"


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learn")
    built = build_run_log(folder)
    from engine.llm.scripted import ScriptedBackend
    from engine.runs.execute import RunConfig, execute

    config = RunConfig(graph=str(folder / "demo.yaml"), backend="scripted",
                       method="semantic-nosibling", steps=2, train=4, val=4, test=0, seed=0,
                       db=str(built.db), cache="off", run_id="demo-nosibling")
    result = asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=responder)))
    assert result.status == "finished"
    return built


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", "")


def learn(db: Path, stage: str, **query) -> AppTest:
    return open_page(db, "screens/learn.py", tour=stage, **query)


def text(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "code", "success", "warning", "info",
                                  "title") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts).replace("\\", "")


def finished_job(run_id: str, db: Path, cmd: list[str], kind: str) -> jobs.Job:
    """A job record as `jobs.launch` saves it, for a process that already ended."""
    job = jobs.Job(run_id, str(db), 999_999_990, str(jobs.jobs_dir(db) / f"{kind}-x.log"),
                   cmd, time.time(), 0, returncode=0, kind=kind)
    Path(job.log).write_text("$ engine\n")
    jobs._save(job)
    return job


def demo_example(db: Path, run: str, step: int = 1) -> tuple[str, str, str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("""SELECT l.example_id, l.target, l.prediction FROM losses l
            JOIN gradients g USING (run_id, step, example_id)
            WHERE l.run_id = ? AND l.step = ? ORDER BY l.example_id LIMIT 1""",
                           [run, step]).fetchone()


def test_title_counts_the_tabs_and_the_loss_text_quotes_the_example(log):
    example, target, prediction = demo_example(log.db, log.demo)
    at = learn(log.db, "Loss", run=log.demo, step=1, example=example)
    (tabs,) = [b for b in at.get("button_group") if "Loss" in str(b.proto.options)]
    title = at.title[0].value
    count = int(title.split(" in ")[1].split()[0])
    assert count == len(tabs.proto.options) == 10
    body = text(at)
    assert f"the expected output is “{target}”" in body
    assert f"the graph answered “{prediction}”" in body
    other = "No" if target == "Yes" else "Yes"
    assert f"expected output is “{other}”" not in body


def test_graph_text_names_the_nodes_and_their_prompts(log):
    at = learn(log.db, "The graph", run=log.demo, step=1)
    body = text(at)
    assert "`mood` reads `review`" in body and "`answer` (the output node) reads `review` " \
        "and `mood`" in body
    assert "“Write one word about the text.”" in body
    # the drawing carries two gradient lengths of different scopes: the caption says which
    example = at.session_state["example"]
    assert ("A box's ∇ chars: its aggregated gradient, the mean over the examples "
            "back-propagated at step 1; an arrow's: what one successor sent for example "
            f"{example}") in body


def test_gate_shows_an_accepted_and_a_rejected_proposal(log, tmp_path):
    db = tmp_path / "gate.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:  # one accepted and one rejected, whatever the run had
        con.execute("""INSERT INTO updates (run_id, step, node_id, old_prompt, new_prompt,
            accepted, val_before, val_after, reject_reason) VALUES
            (?, 3, 'answer', 'Answer Yes or No.', 'Say Yes.', false, 0.5, 0.25,
             'validation did not improve'),
            (?, 3, 'mood', 'Write one word about the text.', 'Name the feeling.', true, 0.5,
             0.75, NULL)""", [log.demo, log.demo])
        accepted, rejected = con.execute("""SELECT count(*) FILTER (WHERE accepted),
            count(*) FILTER (WHERE NOT accepted) FROM updates WHERE run_id = ?
            AND new_prompt <> old_prompt""", [log.demo]).fetchone()
    at = learn(db, "The gate", run=log.demo, step=1)
    body = text(at)
    assert f"{accepted} accepted, {rejected} rejected by the gate" in body
    assert "An accepted proposal" in body and "A rejected proposal" in body
    with duckdb.connect(str(db), read_only=True) as con:
        reason = con.execute("""SELECT reject_reason FROM updates WHERE run_id = ? AND NOT
            accepted AND new_prompt <> old_prompt ORDER BY step, node_id LIMIT 1""",
                             [log.demo]).fetchone()[0]
    assert reason in body  # the engine's own reason for the rejection
    assert any("rejected by the validation gate" in m.value for m in at.markdown)


def test_a_proposal_that_copies_a_training_review_carries_a_caveat(log, tmp_path):
    db = tmp_path / "copy.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        train = con.execute("SELECT fields->>'review' FROM examples WHERE run_id = ? AND "
                            "split = 'train' ORDER BY position LIMIT 1", [log.demo]).fetchone()[0]
        con.execute("UPDATE updates SET new_prompt = new_prompt || ' For example: ' || ? "
                    "WHERE run_id = ? AND step = 1", [train, log.demo])
    assert train in dict(REVIEWS) and len(train) >= 24
    at = learn(db, "Update", run=log.demo, step=1)
    warnings = [w.value for w in at.warning]
    assert any("copies training examples" in w and train[:20] in w.replace("\\", "")
               for w in warnings)
    clean = learn(log.db, "Update", run=log.demo, step=1)
    assert not any("copies training examples" in w.value for w in clean.warning)


def test_without_siblings_shows_both_gradients_of_the_same_example(log):
    example, _, _ = demo_example(log.db, log.demo)
    at = learn(log.db, "Without siblings", run=log.demo, step=1, example=example)
    body = text(at)
    assert "demo-nosibling" in body and "semantic-nosibling" in body
    with duckdb.connect(str(log.db), read_only=True) as con:
        grads = dict(con.execute("""SELECT run_id, content FROM gradients WHERE step = 1
            AND example_id = ? AND node_id = 'mood' AND kind = 'gradient'""",
                                 [example]).fetchall())
    for run in (log.demo, "demo-nosibling"):
        if run in grads:
            assert grads[run] in [c.value for c in at.code]


def test_without_a_paired_run_the_stage_offers_to_start_one(log, tmp_path, monkeypatch):
    db = tmp_path / "alone.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM runs WHERE run_id = 'demo-nosibling'")
    specs = []
    monkeypatch.setattr(jobs, "start", lambda spec: specs.append(spec) or finished_job(
        "demo-x", db, [], "run"))
    at = learn(db, "Without siblings", run=log.demo, step=1)
    at.button(key="learn_pair_semantic-nosibling").click().run()
    (spec,) = specs
    assert spec.method == "semantic-nosibling" and spec.seed == 0
    assert spec.graph.endswith("demo.yaml")


def test_a_blame_on_other_examples_is_not_read_as_no_blame(log, tmp_path):
    """After a blame on the validation examples, the table of a training example that no
    probe touched says the step's probes are elsewhere, not "not probed yet"."""
    example, _, _ = demo_example(log.db, log.demo)
    db = tmp_path / "elsewhere.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        for i, other in enumerate(("v-1", "v-2")):
            con.execute("""INSERT INTO probes (probe_id, run_id, step, example_id, node_id,
                kind, intervention, before_output, after_output, before_score, after_score,
                created_at, call_ids, leaks_target) VALUES (?, ?, 1, ?, 'mood', 'edit',
                'x', 'wrong', 'right', 0.0, 1.0, ?, '[]', false)""",
                        [f"e{i}", log.demo, other, float(i)])
    at = learn(db, "Check the blame", run=log.demo, step=1, example=example)
    table = at.dataframe[0].value.set_index("node")
    assert set(table["followed its gradient"]) == {
        "not probed on this example (the step's probes are on 2 other examples: see the "
        "pooled verdict)"}


def test_check_the_blame_reads_the_probes_and_starts_blame(log, tmp_path, monkeypatch):
    example, target, _ = demo_example(log.db, log.demo)
    db = tmp_path / "blame.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        for i, (node, after) in enumerate((("mood", 1.0), ("answer", 0.0))):
            con.execute("""INSERT INTO probes (probe_id, run_id, step, example_id, node_id,
                kind, intervention, before_output, after_output, before_score, after_score,
                created_at, call_ids, leaks_target) VALUES (?, ?, 1, ?, ?, 'gradient', 'x',
                'wrong', ?, 0.0, ?, ?, '[]', false)""",
                        [f"p{i}", log.demo, example, node, target if after else "wrong",
                         after, float(i)])
    commands = []
    monkeypatch.setattr(jobs, "launch", lambda cmd, *a, **k: commands.append(cmd) or
                        finished_job(log.demo, db, cmd, "blame"))
    at = learn(db, "Check the blame", run=log.demo, step=1, example=example)
    table = at.dataframe[0].value.set_index("node")
    assert table.loc["mood", "followed its gradient"].startswith("fixed")
    assert table.loc["answer", "followed its gradient"].startswith("unchanged")
    assert "Following the gradient at `mood` turns example" in text(at)
    at.button(key="learn_blame").click().run()
    assert commands[-1][2:5] == ["engine", "blame", log.demo]
    assert commands[-1][-2:] == ["--step", "1"]


def test_check_the_blame_shows_the_edit_probes_when_every_gradient_fix_leaks(log, tmp_path):
    """The demo's case: following `mood`'s gradient fixes the example only by carrying the
    answer (a leak), while `mood`'s proposed prompt, run alone, fixes it. On an example
    the update call saw, that is not credit; on one it never saw, the page points there."""
    example, target, _ = demo_example(log.db, log.demo)
    db = tmp_path / "leaks.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        for i, (node, kind, after, leak) in enumerate((
                ("mood", "gradient", 1.0, True), ("answer", "gradient", 0.0, False),
                ("mood", "edit", 1.0, False))):
            con.execute("""INSERT INTO probes (probe_id, run_id, step, example_id, node_id,
                kind, intervention, before_output, after_output, before_score, after_score,
                created_at, call_ids, leaks_target) VALUES (?, ?, 1, ?, ?, ?, 'x',
                'wrong', ?, 0.0, ?, ?, '[]', ?)""",
                        [f"q{i}", log.demo, example, node, kind,
                         target if after else "wrong", after, float(i), leak])
    at = learn(db, "Check the blame", run=log.demo, step=1, example=example)
    table = at.dataframe[0].value.set_index("node")
    assert "a leak, not credit" in table.loc["mood", "followed its gradient"]
    assert table.loc["mood", "ran with its proposed prompt"] == (
        "fixed: the example now passes (its update call saw this example: not credit)")
    # answer has an edit at the step, not run on this example
    assert table.loc["answer", "ran with its proposed prompt"] == "not probed"
    shown = text(at)
    assert "No single node's gradient fixes this example when followed alone." in shown
    assert f"blame {log.demo} --step 1 --examples val" in shown
    with duckdb.connect(str(db)) as con:  # now an example the update call never saw
        con.execute("DELETE FROM gradients WHERE run_id = ? AND step = 1 AND example_id = ?",
                    [log.demo, example])
    at = learn(db, "Check the blame", run=log.demo, step=1, example=example)
    assert at.dataframe[0].value.set_index("node").loc[
        "mood", "ran with its proposed prompt"] == "fixed: the example now passes"
    assert ("`mood`'s proposed prompt, run alone, does (an example its update call never "
            "saw): the edit probes point there.") in text(at)


def _edit_probes(con, run: str, flips: dict[str, int], examples: list[str]) -> None:
    """Probes of each node's proposed prompt (its step-1 update, inserted) on `examples`,
    the first `flips[node]` of them fixed."""
    for node, fixed in flips.items():
        prompt = f"the proposal for {node}"
        con.execute("DELETE FROM updates WHERE run_id = ? AND step = 1 AND node_id = ?",
                    [run, node])
        con.execute("INSERT INTO updates (run_id, step, node_id, old_prompt, new_prompt, "
                    "accepted) VALUES (?, 1, ?, 'old', ?, false)", [run, node, prompt])
        for i, example in enumerate(examples):
            con.execute("""INSERT INTO probes (probe_id, run_id, step, example_id, node_id,
                kind, intervention, before_output, after_output, before_score, after_score,
                created_at, call_ids, leaks_target) VALUES (?, ?, 1, ?, ?, 'edit', ?,
                'wrong', 'x', 0.0, ?, 0, '[]', false)""",
                        [f"e-{node}-{example}", run, example, node, prompt,
                         1.0 if i < fixed else 0.0])


def _probed_copy(log, db: Path, flips) -> tuple[Path, list[str]]:
    """A copy of the demo run's log whose step-1 probes are only edit probes on every
    validation example, `flips(n)` of them fixed per node; (the copy, those examples)."""
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        val = [r[0] for r in con.execute(
            "SELECT DISTINCT example_id FROM examples WHERE run_id = ? AND split = 'val' "
            "ORDER BY example_id", [log.demo]).fetchall()]
        con.execute("DELETE FROM probes WHERE run_id = ?", [log.demo])
        _edit_probes(con, log.demo, flips(len(val)), val)
    return db, val


def test_check_the_blame_pools_every_probed_example_with_intervals_and_names_the_node(
        log, tmp_path):
    """After a blame on the validation examples (which the tour's own example is not among),
    the stage shows every probe of the step per node, with 90% intervals, and the node they
    name by blame's own rule; with too few examples it says why no node is named."""
    db, val = _probed_copy(log, tmp_path / "pooled.duckdb", lambda n: {"mood": n, "answer": 0})
    assert len(val) >= 4  # 4/4 against 0/4: 90% intervals apart
    at = learn(db, "Check the blame", run=log.demo, step=1)
    pooled = at.dataframe[1].value.set_index("node")
    n = len(val)
    assert pooled.loc["mood", "fixed by its edit alone"] == f"{n}/{n}"
    assert pooled.loc["answer", "fixed by its edit alone"] == f"0/{n}"
    low, high = wilson(n, n)
    assert pooled.loc["mood", "90% interval "] == f"[{low:.2f}, {high:.2f}]"
    assert ("The probes blame `mood`: following its proposed prompt fixes failing examples, "
            f"and its 90% interval lies above every other node's (edit alone: {n}/{n}, 90% "
            f"[{low:.2f}, {high:.2f}]).") in text(at)
    assert "The prompt probed is from" not in text(at)
    # the step wrote two candidate prompt sets, kept the first, which left `mood` as it
    # was: the edit probed (blame's choice) is the second's, and the verdict says so
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE updates SET candidate = 1, val_after = 0.25 WHERE run_id = ? AND "
                    "step = 1 AND node_id = 'mood'", [log.demo])
        con.execute("INSERT INTO updates (run_id, step, node_id, old_prompt, new_prompt, "
                    "accepted, candidate) VALUES (?, 1, 'mood', 'old', 'old', false, 0)",
                    [log.demo])
    at = learn(db, "Check the blame", run=log.demo, step=1)
    assert ("The probes blame `mood`: following its proposed prompt fixes failing examples"
            in text(at))
    assert ("The prompt probed is from candidate 2 of 2, not kept (its prompt set scored "
            "0.250 on validation).") in text(at)
    with duckdb.connect(str(db)) as con:  # two examples: the intervals overlap
        con.execute("DELETE FROM probes WHERE run_id = ?", [log.demo])
        _edit_probes(con, log.demo, {"mood": 2, "answer": 0}, val[:2])
    at = learn(db, "Check the blame", run=log.demo, step=1)
    assert at.dataframe[1].value.set_index("node").loc["mood", "fixed by its edit alone"] \
        == "2/2"
    shown = text(at)
    assert "The probes name no node yet: insufficient evidence: mood (2/2) and answer (0/2) " \
           "have overlapping 90% intervals" in shown
    assert "The probes blame" not in shown


def graph_page(db: Path, **query) -> AppTest:
    return open_page(db, "screens/graph.py", **query)


def test_about_this_graph_renders_the_descriptions_code_marks(log, tmp_path):
    """demo.yaml's description names nodes as `note`: shown as code, not raw backticks."""
    db = tmp_path / "about.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET graph_yaml = replace(graph_yaml, 'description: Same "
                    "shape', 'description: The node `mood` has the same shape') WHERE run_id = ?",
                    [log.demo])
    at = graph_page(db, run=log.demo, step=1)
    about = [m.value for m in at.markdown if "has the same shape" in m.value]
    assert about == ["The node `mood` has the same shape as sample_graphs/demo.yaml "
                     "(dashboard test copy)."]
    assert not [t for t in at.text if "`mood`" in t.value]


def test_the_graph_page_says_what_the_probes_name_as_the_learn_tour_does(log, tmp_path):
    """The Graph page's counts come with the verdict they add up to: the same sentence as
    the Learn tour's blame stage, for a named node and for no node."""
    db, val = _probed_copy(log, tmp_path / "graph.duckdb", lambda n: {"mood": n, "answer": 0})
    n = len(val)
    low, high = wilson(n, n)
    named = ("The probes blame `mood`: following its proposed prompt fixes failing examples, "
             f"and its 90% interval lies above every other node's (edit alone: {n}/{n}, 90% "
             f"[{low:.2f}, {high:.2f}]).")
    at = graph_page(db, run=log.demo, step=1)
    assert [s.value for s in at.success] == [named]
    assert named in text(learn(db, "Check the blame", run=log.demo, step=1))
    with duckdb.connect(str(db)) as con:  # two examples: the intervals overlap
        con.execute("DELETE FROM probes WHERE run_id = ?", [log.demo])
        _edit_probes(con, log.demo, {"mood": 2, "answer": 0}, val[:2])
    shown = text(graph_page(db, run=log.demo, step=1))
    assert "The probes name no node yet: insufficient evidence: mood (2/2) and answer (0/2) " \
           "have overlapping 90% intervals" in shown and "The probes blame" not in shown
    with duckdb.connect(str(db)) as con:  # no probes at the step: no verdict at all
        con.execute("DELETE FROM probes WHERE run_id = ?", [log.demo])
    shown = text(graph_page(db, run=log.demo, step=1))
    assert "The probes" not in shown and "No probes at step 1 yet" in shown


def test_gate_falls_back_to_another_run_of_the_graph_and_names_it(log, tmp_path):
    db = tmp_path / "gate2.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE updates SET accepted = false WHERE run_id = ?", [log.demo])
        con.execute("""INSERT INTO updates (run_id, step, node_id, old_prompt, new_prompt,
            accepted, val_before, val_after) VALUES ('demo-nosibling', 1, 'mood',
            'Write one word about the text.', 'Name the feeling.', true, 0.25, 0.5)""")
    at = learn(db, "The gate", run=log.demo, step=1)
    body = text(at)
    assert " 0 accepted," in body
    assert "from run demo-nosibling (none in this run)" in body
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE updates SET accepted = false")
    body = text(learn(db, "The gate", run=log.demo, step=1))
    assert "None in this run or any other run of this graph" in body


def plant_fork(db: Path, parent: str, fork: str, val: float) -> None:
    """A fork of `parent` from step 1 as the engine logs one: its runs row (lineage), the
    steps up to 1 with the re-measured validation score, step 1's losses."""
    with duckdb.connect(str(db)) as con:
        con.execute("""INSERT INTO runs SELECT * REPLACE (? AS run_id, ? AS parent_run_id,
            1 AS fork_step, started_at + 1 AS started_at) FROM runs WHERE run_id = ?""",
                    [fork, parent, parent])
        con.execute("""INSERT INTO steps SELECT * REPLACE (? AS run_id, CASE WHEN step = 1
            THEN ? ELSE val_score END AS val_score) FROM steps WHERE run_id = ? AND step <= 1
            """, [fork, val, parent])
        con.execute("INSERT INTO losses SELECT * REPLACE (? AS run_id) FROM losses WHERE "
                    "run_id = ? AND step = 1", [fork, parent])


def test_fix_it_yourself_writes_a_prompt_forks_and_compares(log, tmp_path, monkeypatch):
    db = tmp_path / "fix.duckdb"
    shutil.copy(log.db, db)
    fixed = "Read the review. Reply Yes if it praises the product, else No."
    demo = tmp_path / "demo_fixed_prompts.yaml"  # the demo's hand-fixed prompts
    demo.write_text(f"answer: {fixed}\n")
    monkeypatch.setattr(jobs, "DEMO_FIXED_PROMPTS", demo)
    with duckdb.connect(str(db)) as con:
        val_before, n_val = con.execute("""SELECT s.val_score, (SELECT count(*) FROM losses
            WHERE run_id = s.run_id AND step = 1 AND split = 'val') FROM steps s
            WHERE run_id = ? AND step = 1""", [log.demo]).fetchone()
    commands = []
    monkeypatch.setattr(jobs, "launch", lambda cmd, *a, **k: commands.append(cmd) or
                        finished_job("demo-fork", db, cmd, "fork"))
    at = learn(db, "Fix it yourself", run=log.demo, step=1)
    assert at.selectbox(key="learn_fix_node").value == "answer"
    assert fixed in [c.value for c in at.code]
    assert at.button(key="learn_fork").disabled  # nothing changed yet
    at.button(key="learn_fix_use").click().run()
    key = f"learn_fix_prompt|{log.demo}|1|answer"
    assert at.text_area(key=key).value == fixed
    at.button(key="learn_fork").click().run()
    (cmd,) = commands
    assert cmd[3:8] == ["run", "--fork", log.demo, "--from-step", "1"]
    node, file = cmd[cmd.index("--set-prompt") + 1].split("=@")
    assert node == "answer" and Path(file).read_text() == fixed
    assert "fork demo-fork finished in" in text(at)
    assert "No fork of this run from step 1 yet." in text(at)
    plant_fork(db, log.demo, "demo-fork", 1.0)  # what the engine writes
    at.run()
    body = text(at)
    assert (f"this run {val_before:.3f} on {n_val} examples (95% interval" in body
            and f"fork `demo-fork` with the new prompt 1.000 on {n_val} examples" in body)
    assert any(f"Validation rose ({val_before:.3f} → 1.000)" in s.value for s in at.success)
    (link,) = [p for p in at.get("page_link") if "Compare" in p.proto.label]
    assert "run=demo-fork" in link.proto.query_string
    assert f"other={log.demo}" in link.proto.query_string


def test_fix_it_yourself_without_a_hand_fixed_prompt_asks_for_one(log, monkeypatch):
    monkeypatch.setattr(jobs, "DEMO_FIXED_PROMPTS", Path("/nonexistent/demo_fixed_prompts.yaml"))
    at = learn(log.db, "Fix it yourself", run=log.demo, step=1)
    assert not [b for b in at.button if b.key == "learn_fix_use"]
    assert "Say exactly what the node should produce" in text(at)
    key = f"learn_fix_prompt|{log.demo}|1|answer"
    at.text_area(key=key).input("Reply Yes or No: is the review positive?").run()
    assert not at.button(key="learn_fork").disabled


def test_without_siblings_offers_first_the_comparison_that_can_differ(log, tmp_path):
    db = tmp_path / "order.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM runs WHERE run_id = 'demo-nosibling'")
    example, _, _ = demo_example(log.db, log.demo)
    at = learn(db, "Without siblings", run=log.demo, step=1, example=example)
    pairs = [b for b in at.button if str(b.key).startswith("learn_pair_")]
    # `mood`'s only sibling is the review field: semantic-nosibling would send the same
    # backward prompt, so TextGrad comes first
    assert [b.key for b in pairs] == ["learn_pair_textgrad", "learn_pair_semantic-nosibling"]
    assert "`textgrad` is the comparison that can show a difference" in text(at)


def test_the_gradient_stages_mark_degenerate_gradients_and_say_why(log, tmp_path):
    example, _, _ = demo_example(log.db, log.demo)
    db = tmp_path / "noise.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("UPDATE runs SET backend = 'local', optimizer_model = "
                    "'qwen2.5-coder-1.5b' WHERE run_id = ?", [log.demo])
        con.execute("UPDATE gradients SET content = 'M' WHERE run_id = ? AND step = 1 AND "
                    "example_id = ? AND node_id = 'mood' AND kind = 'gradient'",
                    [log.demo, example])
    at = learn(db, "Semantic gradient", run=log.demo, step=1, example=example)
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("Degenerate gradient (one word)") and "often noise" in w
               and "probes" in w for w in warnings)
    # the embedded model that wrote them, named as the run names it (the demo's Qwen, never
    # a model the run did not use)
    notes = [i.value for i in at.info if "often noise" in i.value]
    assert notes and all("this run's qwen2.5-coder-1.5b" in n and "SmolLM2" not in n
                         for n in notes)
    clean = learn(log.db, "Semantic gradient", run=log.demo, step=1, example=example)
    assert not any("Degenerate" in w.value for w in clean.warning)
    assert not any("often noise" in i.value for i in clean.info)  # a scripted run: no claim


def test_explore_names_the_graph_pages_own_colour_options(log):
    from dashboard.views.colors import QUANTITIES

    body = text(learn(log.db, "Explore", run=log.demo, step=1))
    for label in QUANTITIES.values():
        assert label[0].lower() + label[1:] in body
    assert "failures" not in body


def test_the_edit_alone_score_is_the_same_in_update_gate_and_inspector(log, tmp_path):
    db = tmp_path / "alone.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:  # one changed proposal at step 1, scored alone
        con.execute("UPDATE updates SET accepted = false, val_alone = NULL WHERE run_id = ?",
                    [log.demo])
        con.execute("""UPDATE updates SET new_prompt = 'Name the feeling.', accepted = true,
            val_alone = 0.625 WHERE run_id = ? AND step = 1 AND node_id = 'mood'""",
                    [log.demo])

    def alone(at: AppTest) -> list[str]:
        return [m.value for m in at.metric if m.label.startswith("validation with this edit")]

    assert "0.625" in alone(learn(db, "Update", run=log.demo, step=1))
    assert alone(learn(db, "The gate", run=log.demo, step=1))[0] == "0.625"
    import os

    os.environ["SEMBACK_DB"] = str(db)
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update({"run": log.demo, "step": "1", "node": "mood",
                                "example": demo_example(db, log.demo)[0]})
        at.run()
        at.switch_page("screens/inspect.py").run()
    assert alone(at) == ["0.625"]


def test_on_the_demo_the_sibling_stage_shows_prompts_that_differ_and_counts_them(tmp_path):
    """sample_graphs/demo.yaml (the scripted demo model): `answer` reads `note` and `thing`,
    so the semantic backward prompt for `note` shows `thing`'s output and TextGrad's does
    not; the stage counts, over every example both runs back-propagated, how often the
    prompts and the gradients differ, and the paired-run buttons say what they will show."""
    from engine.runlog.reader import paired_gradients
    from engine.runs.execute import RunConfig, execute

    repo = Path(__file__).resolve().parents[1]
    db = tmp_path / "demo.duckdb"
    for method in ("semantic", "textgrad"):
        config = RunConfig(graph=str(repo / "sample_graphs" / "demo.yaml"), backend="scripted",
                           scripted_responder=f"{repo}/sample_graphs/demo_responder.py:"
                                              "demo_responder",
                           method=method, steps=1, seed=0, db=str(db), run_id=f"d-{method}")
        assert asyncio.run(execute(config)).status == "finished"
    pairs = paired_gradients(str(db), "d-semantic", "d-textgrad", 1, "note")
    assert len(pairs) == 2 and pairs["prompts_differ"].all()
    with duckdb.connect(str(db), read_only=True) as con:
        things = {r[0] for r in con.execute(
            "SELECT output_text FROM node_outputs WHERE run_id = 'd-semantic' AND step = 1 "
            "AND node_id = 'thing' AND example_id IN (SELECT example_id FROM gradients "
            "WHERE run_id = 'd-semantic' AND step = 1 AND node_id = 'note')").fetchall()}
    for _, row in pairs.iterrows():  # the sibling's output is in one prompt, not the other
        assert any(t in row["messages_a"] for t in things)
        assert '<input name=\\"thing\\">' not in row["messages_b"]
    example = pairs["example_id"].iloc[0]
    differ = int(pairs["gradients_differ"].sum())
    at = learn(db, "Without siblings", run="d-semantic", step=1, example=example)
    assert (f"Across the 2 examples both runs back-propagated to `note` at step 1, the "
            f"backward prompts differ on 2 of 2 and the gradients on {differ} of 2") in text(at)
    with duckdb.connect(str(db)) as con:
        con.execute("DELETE FROM runs WHERE run_id = 'd-textgrad'")
    at = learn(db, "Without siblings", run="d-semantic", step=1, example=example)
    labels = {b.key: b.label for b in at.button if str(b.key).startswith("learn_pair_")}
    assert "leaves out `thing`" in labels["learn_pair_textgrad"]
    assert "without `thing`'s output" in labels["learn_pair_semantic-nosibling"]


def test_check_the_blame_says_which_nodes_tie(log, tmp_path, monkeypatch):
    """Two nodes above the rest but not each other (blame's tie): the stage names both and
    says why neither alone is named, not "no node yet"."""
    from engine.probes.verdict import Verdict

    db, _ = _probed_copy(log, tmp_path / "tie.duckdb", lambda n: {"mood": n, "answer": n})
    tie = Verdict(None, "a tie: the 90% intervals of answer and mood (answer 4/4, mood 4/4) "
                        "each lie above every other node's but overlap one another's", None,
                  ["answer", "mood"])
    monkeypatch.setattr("dashboard.widgets.blame.logged_verdict",
                        lambda *a, **k: (tie, "edit"))
    shown = text(learn(db, "Check the blame", run=log.demo, step=1))
    assert "The probes tie on `answer` and `mood`: a tie: the 90% intervals of answer and " \
           "mood (answer 4/4, mood 4/4)" in shown
    assert "The probes name no node yet" not in shown and "The probes blame" not in shown


def test_a_step_with_two_candidates_shows_each_as_its_own_pane(log, tmp_path):
    """--proposals 2: every node's proposal of each candidate, labelled, each with its own
    widgets (two panes of one node and verdict must not share a key)."""
    db = with_second_candidate(log.db, tmp_path / "candidates.duckdb", log.demo,
                               " (second draw)",
                               "candidate 2 scored 0 on validation, candidate 1 scored 1 and was kept")
    with duckdb.connect(str(db)) as con:
        nodes = con.execute("SELECT count(DISTINCT node_id) FROM updates WHERE run_id = ? AND "
                            "step = 1", [log.demo]).fetchone()[0]
    at = learn(db, "Update", run=log.demo, step=1)
    assert not at.exception
    body = text(at)
    assert "This step wrote **2 candidate prompt sets**" in body
    labels = [m.value for m in at.markdown if "· candidate" in m.value]
    assert sum("candidate 1 of 2" in m for m in labels) == nodes
    assert sum("candidate 2 of 2" in m for m in labels) == nodes
    assert "candidate 2 scored 0 on validation, candidate 1 scored 1 and was kept" in body
    # a step with one candidate names none
    one = learn(log.db, "Update", run=log.demo, step=1)
    assert "candidate prompt sets" not in text(one)
    assert not [m.value for m in one.markdown if "· candidate" in m.value]


def test_a_run_with_a_contrast_shows_both_gradients_without_a_paired_run(tmp_path):
    """A demo run whose graph sets `contrast:` wrote the sibling-blind gradients beside its
    own: the stage shows both for the tour's example, from this run, and offers no paired
    run (the log holds no other)."""
    from engine.runs.execute import RunConfig, execute

    repo = Path(__file__).resolve().parents[1]
    db = tmp_path / "demo.duckdb"
    config = RunConfig(graph=str(repo / "sample_graphs" / "demo.yaml"), backend="scripted",
                       scripted_responder=f"{repo}/sample_graphs/demo_responder.py:"
                                          "demo_responder",
                       steps=1, seed=0, db=str(db), run_id="d-one",
                       contrast="semantic-nosibling")
    assert asyncio.run(execute(config)).status == "finished"
    with duckdb.connect(str(db), read_only=True) as con:
        example, mine, theirs = con.execute("""
            SELECT g.example_id, g.content, c.content FROM gradients g JOIN gradients c
            ON c.run_id = g.run_id AND c.step = g.step AND c.example_id = g.example_id
            AND c.node_id = g.node_id AND c.kind = 'contrast'
            WHERE g.run_id = 'd-one' AND g.step = 1 AND g.node_id = 'note'
              AND g.kind = 'gradient' ORDER BY g.example_id LIMIT 1""").fetchone()
    at = learn(db, "Without siblings", run="d-one", step=1, example=example)
    body = text(at)
    assert "No second run: this run made both calls." in body
    assert "left with its siblings (`semantic`" in body
    assert "right without (`semantic-nosibling`" in body
    shown = [c.value for c in at.code]
    assert mine in shown and theirs in shown
    assert not [b for b in at.button if str(b.key).startswith("learn_pair_")]
    assert not at.exception
