"""The node inspector's What if panel and Fork button, and the function-node
card, under AppTest on the engine-built run log (support/dashboard_log.py).
Processes are never started: `jobs.launch` is replaced by a recorder, and probe results
are rows written into a copy of the run log the way the engine writes them."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import duckdb
import pytest
from streamlit.testing.v1 import AppTest

from dashboard import jobs
from tests.support.dashboard_log import build_run_log, open_page


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    return build_run_log(tmp_path_factory.mktemp("whatif"))


@pytest.fixture
def started(monkeypatch, tmp_path):
    """Commands the pages asked to start; nothing runs."""
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    commands: list[list[str]] = []

    def launch(cmd, run_id, db, steps, name, kind="run"):
        commands.append(cmd)
        job = jobs.Job(run_id, db, 999_999_990, str(jobs.jobs_dir(db) / f"{name}.log"), cmd,
                       time.time(), steps, returncode=0, kind=kind)
        jobs._save(job)
        return job

    monkeypatch.setattr(jobs, "launch", launch)
    return commands


@pytest.fixture(autouse=True)
def _restore_db(monkeypatch):
    monkeypatch.setenv("SEMBACK_DB", "")  # restored after each test


def inspector(db: Path, **query) -> AppTest:
    return open_page(db, "screens/inspect.py", **query)  # the autouse fixture restores the db


def all_text(at: AppTest) -> str:
    parts = [e.value for kind in ("markdown", "caption", "code", "success", "warning", "error",
                                  "info", "subheader") for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts).replace("\\", "")


def test_follow_the_gradient_starts_the_pinned_probe_command(log, started):
    at = inspector(log.db, run=log.semantic, step=1, example=log.example, node="hint_a")
    assert "What if" in all_text(at) and "No probe of this node on this example yet." \
        in all_text(at)
    slot = f"{log.semantic}|1|{log.example}|hint_a"
    at.radio(key=f"whatif_kind|{slot}").set_value("gradient").run()
    at.button(key=f"whatif_run|{slot}").click().run()
    (cmd,) = started
    assert cmd[1:5] == ["-m", "engine", "probe", log.semantic]
    assert cmd[5:] == ["--db", str(log.db.resolve()), "--step", "1", "--node", "hint_a",
                       "--example", log.example, "--gradient", "--json"]
    assert "Probe started" in all_text(at)


def test_edit_the_output_passes_the_typed_text_through_a_file(log, started):
    at = inspector(log.db, run=log.semantic, step=1, example=log.example, node="hint_a")
    slot = f"{log.semantic}|1|{log.example}|hint_a"
    assert at.radio(key=f"whatif_kind|{slot}").value == "output"
    at.text_area(key=f"whatif_output|{slot}").input("Compare 3 and 9: 9 is larger.").run()
    at.button(key=f"whatif_run|{slot}").click().run()
    (cmd,) = started
    file = cmd[cmd.index("--output") + 1]
    assert file.startswith("@") and Path(file[1:]).read_text() == "Compare 3 and 9: 9 is larger."


def test_apply_a_prompt_proposed_or_hand_written(log, started):
    at = inspector(log.db, run=log.semantic, step=1, example=log.example, node="hint_a")
    slot = f"{log.semantic}|1|{log.example}|hint_a"
    at.radio(key=f"whatif_kind|{slot}").set_value("edit").run()
    at.button(key=f"whatif_run|{slot}").click().run()
    assert started[-1][-5:] == ["--edit", "proposed", "--examples", log.example, "--json"]
    at.radio(key=f"whatif_source|{slot}").set_value("mine").run()
    at.text_area(key=f"whatif_prompt|{slot}").input("List both numbers.").run()
    at.button(key=f"whatif_run|{slot}").click().run()
    edit = started[-1][started[-1].index("--edit") + 1]
    assert Path(edit[1:]).read_text() == "List both numbers."


def test_probe_results_show_the_rerun_nodes_and_the_new_score(log, started, tmp_path):
    db = tmp_path / "probed.duckdb"
    shutil.copy(log.db, db)
    with duckdb.connect(str(db)) as con:
        con.execute("""INSERT INTO probes (probe_id, run_id, step, example_id, node_id, kind,
            intervention, before_output, after_output, before_score, after_score, created_at,
            call_ids, leaks_target, error) VALUES ('p1', ?, 1, ?, 'hint_a', 'gradient',
            'The numbers are 3 and 9; 9 is larger.', '3', '9', 0.0, 1.0, 1.0, '[]', false,
            NULL)""", [log.semantic, log.example])
        con.execute("""INSERT INTO probe_outputs VALUES ('p1', ?, 1, ?, 'final',
            'Re-run answer: 9', NULL, NULL)""", [log.semantic, log.example])
    at = inspector(db, run=log.semantic, step=1, example=log.example, node="hint_a")
    text = all_text(at)
    assert "Follow the gradient" in text and "score 0.00 → 1.00" in text
    assert "fixed: the example now passes" in text
    codes = [c.value for c in at.code]
    assert "Re-run answer: 9" in codes and "The numbers are 3 and 9; 9 is larger." in codes
    # the Graph page colours hint_a by this blame
    at.switch_page("screens/graph.py").run()
    assert "fixes 1/1" in " ".join(n["label"] for n in __import__("json").loads(
        [c for c in at.get("component_instance")][0].proto.json_args)["spec"]["nodes"])


def test_fork_from_here_starts_a_fork_with_the_edited_prompt(log, started):
    at = inspector(log.db, run=log.semantic, step=1, example=log.example, node="final")
    slot = f"{log.semantic}|1|final"
    box = at.text_area(key=f"fork_prompt|{slot}")
    assert box.value  # the prompt in force after step 1
    box.input("Answer with the larger number, digits only.").run()
    at.number_input(key=f"fork_steps|{slot}").set_value(2).run()
    at.button(key=f"fork_run|{slot}").click().run()
    (cmd,) = started
    assert cmd[3:8] == ["run", "--fork", log.semantic, "--from-step", "1"]
    assert cmd[cmd.index("--steps") + 1] == "2"
    node, file = cmd[cmd.index("--set-prompt") + 1].split("=@")
    assert node == "final"
    assert Path(file).read_text() == "Answer with the larger number, digits only."
    # followed where it was started: its end, then the comparison with its parent
    assert "fork tiny-" in all_text(at) and "finished in" in all_text(at)
    (link,) = [p for p in at.get("page_link") if "Compare" in p.proto.label]
    assert f"other={log.semantic}" in link.proto.query_string and "run=tiny-" in link.proto.query_string


def test_a_fork_of_zero_steps_is_not_started_and_the_panel_says_why(log, started):
    """Steps set to 0 used to show a range error and start a one-step fork anyway."""
    at = inspector(log.db, run=log.semantic, step=1, example=log.example, node="final")
    slot = f"{log.semantic}|1|final"
    at.number_input(key=f"fork_steps|{slot}").set_value(0).run()
    assert not at.exception
    button = at.button(key=f"fork_run|{slot}")
    assert button.disabled
    assert "A fork runs at least one step" in all_text(at)
    assert started == []  # a disabled button cannot be pressed


FUNCTION_GRAPH = """\
name: fn
dataset: tiny.jsonl
input_fields: [question]
target_field: answer
metric: exact_match
splits: {train: 2, val: 2, test: 0}
nodes:
  - id: solve
    prompt: Solve the problem.
    inputs: [question]
  - id: number
    kind: function
    function: extract_number
    inputs: [solve]
    output: true
"""


def test_a_function_node_shows_its_description_input_and_return(tmp_path, started):
    import asyncio

    from engine.core.functions import FUNCTIONS
    from engine.llm.scripted import ScriptedBackend
    from engine.runs.execute import RunConfig, execute
    from tests.support.dashboard_log import write_data

    write_data(tmp_path)
    (tmp_path / "fn.yaml").write_text(FUNCTION_GRAPH)
    db = tmp_path / "fn.duckdb"

    def reply(request):
        if request.purpose == "forward":
            return "<output>The larger one is 9, not 3.</output>"
        return None

    config = RunConfig(graph=str(tmp_path / "fn.yaml"), backend="scripted", steps=1,
                       train=2, val=2, test=0, seed=0, db=str(db), cache="off", run_id="fn-run")
    assert asyncio.run(execute(config, forward_backend=ScriptedBackend(responder=reply))
                       ).status == "finished"
    with duckdb.connect(str(db), read_only=True) as con:
        example, returned = con.execute("""SELECT example_id, output_text FROM node_outputs
            WHERE run_id = 'fn-run' AND step = 1 AND node_id = 'number'
            ORDER BY example_id LIMIT 1""").fetchone()
    at = inspector(db, run="fn-run", step=1, example=example, node="number")
    body = all_text(at)
    assert "function node" in at.caption[0].value
    assert "Python function extract_number" in body.replace("*", "")
    codes = [c.value for c in at.code]
    assert FUNCTIONS["extract_number"].__doc__.strip() in codes
    assert returned in codes and any("The larger one is 9, not 3." in c for c in codes)
    slot = f"fn-run|1|{example}|number"
    assert at.radio(key=f"whatif_kind|{slot}").options == ["Edit the output"]  # no prompt
    assert "fork_prompt|fn-run|1|number" not in [t.key for t in at.text_area]


def _running_job(db: Path, run_id: str, kind: str, command_tail: list[str], name: str) -> None:
    job = jobs.Job(run_id, str(db), 999_999_991, str(jobs.jobs_dir(db) / f"{name}.log"),
                   ["python", "-m", "engine", kind, run_id, *command_tail], time.time(), 0,
                   kind=kind)
    jobs._save(job)


@pytest.mark.parametrize("kind,tail,says", [
    ("probe", ["--node", "hint_a", "--gradient"], "probe running"),
    ("probe", ["--node", "hint_b", "--gradient"], None),  # another node's probe
    ("blame", ["--step", "1"], "blame is running on this run")])
def test_what_if_says_probe_running_only_for_a_job_that_probes_this_node(
        log, started, monkeypatch, kind, tail, says):
    """A blame job is not a probe of this node (it was shown as one on every node), and
    another node's probe is not either."""
    monkeypatch.setattr(jobs, "poll", lambda job: job.returncode is None)
    _running_job(log.db, log.semantic, kind, tail, f"{kind}-running")
    body = all_text(inspector(log.db, run=log.semantic, step=1, example=log.example,
                              node="hint_a"))
    assert ("probe running" in body) == (says == "probe running")
    assert ("blame is running" in body) == (says == "blame is running on this run")


def test_an_in_sample_edit_probe_is_not_a_plain_fix():
    """What-if words an edit probe's flip on an example the update call saw as in-sample
    (blame never credits it), not as a plain 'fixed'."""
    from dashboard.views.whatif import flip_label

    assert flip_label(0.0, 1.0) == "fixed: the example now passes"
    assert flip_label(0.0, 1.0, in_sample=True) == \
        "fixed in-sample: the update call saw this example, so no credit"
    assert flip_label(1.0, 0.0, in_sample=True) == "broken: the example now fails"
