"""--proposals N: a step writes N candidate prompt sets from the same gradients (the first
as the run asks, the others sampled), scores each on validation, and keeps the best if it
improves; every candidate's proposals are recorded, only the kept pass is the step's
validation record, and resume, progress and the estimate count the candidates."""

from __future__ import annotations

import duckdb
import pytest

from engine.cli import main
from engine.core.graph import GraphError, load_graph
from engine.core.optimizer import CANDIDATE_TEMPERATURE
from engine.events import Progress
from engine.llm.scripted import ScriptedBackend
from engine.runlog.debug import node_history
from engine.runlog.state import load_resume_state
from engine.runs.estimate import estimate_for
from engine.runs.execute import RunConfig, load_splits
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.test_node_gates import good_and_bad_edits


def second_draw_is_right(request) -> str | None:
    """The first candidate (greedy, sample 0) edits hint_a to no use and hint_b to a bad
    hint; the second (sampled, sample 1) edits hint_a to the good hint and leaves hint_b.
    Forward calls as in tests/test_node_gates.py: `final` is right only when it sees a
    good hint and no bad one."""
    if request.purpose == "update":
        first = request.sample_index == 0
        new = {"hint_a": "A-PLAIN" if first else "A-GOOD",
               "hint_b": "B-BAD" if first else request.meta["prompt"]}.get(
                   request.meta.get("node"), request.meta["prompt"])
        return f"<prompt>{new}</prompt>"
    return good_and_bad_edits(request)


def rows(db, sql: str, *params) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def test_the_better_candidate_is_kept_and_every_candidate_is_recorded(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=second_draw_is_right), steps=1,
                        train=4, val=4, proposals=2)
    assert result.state.prompts.text["hint_a"] == "A-GOOD"
    assert result.state.prompts.text["hint_b"] == TWO_HINTS.split("prompt: ")[2].split("\n")[0]
    assert rows(db, "SELECT val_score, accepted FROM steps WHERE step = 1") == [(1.0, True)]
    changed = rows(db, "SELECT candidate, node_id, new_prompt, accepted, val_after, "
                       "reject_reason FROM updates WHERE step = 1 AND new_prompt <> old_prompt "
                       "ORDER BY candidate, node_id")
    assert changed == [
        (0, "hint_a", "A-PLAIN", False, 0.0,
         "candidate 1 scored 0 on validation, candidate 2 scored 1 and was kept"),
        (0, "hint_b", "B-BAD", False, 0.0,
         "candidate 1 scored 0 on validation, candidate 2 scored 1 and was kept"),
        (1, "hint_a", "A-GOOD", True, 1.0, None),
    ]
    # the second candidate's update calls were sampled: a draw of their own
    calls = rows(db, "SELECT DISTINCT temperature FROM llm_calls WHERE purpose = 'update' "
                     "ORDER BY temperature")
    assert calls == [(0.0,), (CANDIDATE_TEMPERATURE,)]
    # only the kept candidate's validation pass is the step's record, at its prompt versions
    assert rows(db, "SELECT count(*) FROM node_outputs WHERE step = 1 AND split = 'val'") \
        == [(4 * 3,)]
    assert rows(db, "SELECT DISTINCT prompt_version FROM node_outputs WHERE step = 1 AND "
                    "split = 'val' AND node_id = 'hint_a'") == [(2,)]
    assert rows(db, "SELECT node_id, version, prompt, accepted FROM prompt_versions WHERE "
                    "step = 1 ORDER BY node_id, version") == [
        ("hint_a", 1, "A-PLAIN", False), ("hint_a", 2, "A-GOOD", True),
        ("hint_b", 1, "B-BAD", False)]
    assert rows(db, "SELECT value FROM metrics WHERE step = 1 AND key = 'candidates_scored'") \
        == [(2.0,)]
    # the Debug page's history of hint_a: one row per candidate's edit, with its version
    edits = node_history(str(db), result.run_id, "hint_a")["edits"]
    assert edits[["new_prompt", "version", "accepted"]].values.tolist() == [
        ["A-PLAIN", 1, False], ["A-GOOD", 2, True]]
    # progress counted both candidates' update calls and validation passes
    update = [p for p in result.events.of(Progress) if p.phase == "update"]
    gate = [p for p in result.events.of(Progress) if p.phase == "gate"]
    assert update[-1].calls_done == update[-1].calls_expected == 2 * 3
    assert gate[-1].calls_expected == 2 * 4 * 3


def test_resume_sees_what_the_live_run_kept_and_rejected(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=second_draw_is_right), steps=1,
                        train=4, val=4, proposals=2)
    state = load_resume_state(str(db), result.run_id).state
    live = result.state
    assert (state.prompts.text, state.rejected, state.next_version) \
        == (live.prompts.text, live.rejected, live.next_version)
    assert state.prompts.text["hint_a"] == "A-GOOD"
    # hint_a's edit was kept: nothing rejected since; the losing candidate's hint_b edit is
    # rejected for the next update call to see, as a rejected step's would be
    assert state.rejected["hint_a"] == []
    assert state.rejected["hint_b"] == ["B-BAD"]
    assert state.next_version == {"hint_a": 3, "hint_b": 2, "final": 1}


def test_when_no_candidate_improves_every_edit_is_rejected_and_shown_next(tmp_path):
    def never_right(request):
        reply = second_draw_is_right(request)
        if request.purpose == "update" and request.meta.get("node") == "hint_a":
            return f"<prompt>A-PLAIN-{request.sample_index}</prompt>"
        return reply

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=never_right), steps=2,
                        train=4, val=4, proposals=2)
    assert rows(db, "SELECT accepted FROM steps WHERE step = 1") == [(False,)]
    reasons = dict(rows(db, "SELECT candidate, reject_reason FROM updates WHERE step = 1 "
                            "AND node_id = 'hint_a'"))
    assert reasons[0] == "rejected jointly: the candidate scored 0, not above 0"
    assert reasons[1] == "candidate 2 scored 0 on validation, candidate 1 scored 0; neither above 0"
    # step 2's update of hint_a was shown both rejected edits, in candidate order
    update = rows(db, "SELECT messages FROM llm_calls WHERE step = 2 AND purpose = 'update' "
                      "AND node_id = 'hint_a' AND temperature = 0")[0][0]
    assert update.index("A-PLAIN-0") < update.index("A-PLAIN-1")
    assert result.status == "finished"


def test_the_estimate_and_a_graphs_own_default(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS + "proposals: 2\n", arithmetic_rows())
    config = RunConfig(graph=str(graph), backend="scripted", steps=1, train=4, val=4, test=0,
                       db=str(tmp_path / "none.duckdb"))
    spec = load_graph(config.graph)
    assert spec.proposals == 2 and spec.run_defaults() == {"proposals": 2}
    one = estimate_for(config, spec, load_splits(config, spec))
    two = estimate_for(RunConfig(**{**config.__dict__, "proposals": 2}), spec,
                       load_splits(config, spec))
    phase = {p.name: p.expected for p in one.phases}
    phases = {p.name: p.expected for p in two.phases}
    assert phases["step 1: update"] == 2 * phase["step 1: update"] == 2 * 3
    assert phases["step 1: validation candidates"] == 2 * phase["step 1: validation candidate"]
    # `run` takes the graph's default under --proposals, as it does its steps
    db = tmp_path / "runs.duckdb"
    assert main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--db", str(db)]) == 0
    assert rows(db, "SELECT json_extract(config, '$.proposals')::INT FROM runs") == [(2,)]
    assert main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--db", str(db), "--proposals", "1"]) == 0
    assert sorted(rows(db, "SELECT json_extract(config, '$.proposals')::INT FROM runs")) \
        == [(1,), (2,)]


@pytest.mark.parametrize("value", ["0", "two", "[2]"])
def test_a_graphs_proposals_must_be_a_whole_number_of_at_least_one(tmp_path, value):
    graph = write_graph(tmp_path, TWO_HINTS + f"proposals: {value}\n", arithmetic_rows())
    with pytest.raises(GraphError, match="'proposals' must be a whole number, 1 or more"):
        load_graph(graph)


def test_a_version_7_log_gains_the_candidate_column_and_reads_as_one_candidate(tmp_path):
    from engine.runlog.probing import step_proposal
    from engine.runlog.reader import step_updates
    from engine.runlog.schema import SCHEMA_VERSION
    from engine.runlog.writer import open_for_writing
    from tests.support.runlog import log_at_version

    db = tmp_path / "v7.duckdb"
    log_at_version(db, 7, "updates", ", candidate INTEGER", ("updates", {
        "run_id": "r", "step": 1, "node_id": "n", "old_prompt": "a", "new_prompt": "b",
        "accepted": True}))
    assert "candidate" not in str(rows(db, "DESCRIBE updates"))
    open_for_writing(db)
    assert rows(db, "SELECT max(version) FROM schema_version") == [(SCHEMA_VERSION,)]
    assert rows(db, "SELECT node_id, candidate FROM updates") == [("n", None)]
    assert step_updates(str(db), "r")[["node_id", "candidate"]].values.tolist() == [["n", 0]]
    assert step_proposal(str(db), "r", 1, "n") == ("a", "b", "")


def test_a_candidate_that_repeats_an_earlier_ones_edits_is_not_scored_again(tmp_path):
    def same_every_draw(request):
        if request.purpose == "update":
            new = {"hint_a": "A-GOOD"}.get(request.meta.get("node"), request.meta["prompt"])
            return f"<prompt>{new}</prompt>"
        return second_draw_is_right(request)

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=same_every_draw), steps=1,
                        train=4, val=4, proposals=2)
    assert rows(db, "SELECT candidate, accepted, val_after, reject_reason FROM updates "
                    "WHERE step = 1 AND node_id = 'hint_a' ORDER BY candidate") == [
        (0, True, 1.0, None), (1, False, 1.0, "the same edits as candidate 1")]
    # one version of the edit, one validation pass, and progress expected just that pass
    assert rows(db, "SELECT node_id, version FROM prompt_versions WHERE step = 1") \
        == [("hint_a", 1)]
    assert rows(db, "SELECT value FROM metrics WHERE step = 1 AND key = 'candidates_scored'") \
        == [(1.0,)]
    gate = [p for p in result.events.of(Progress) if p.phase == "gate"]
    assert gate[-1].calls_expected == 4 * 3
    assert result.state.rejected["hint_a"] == []
