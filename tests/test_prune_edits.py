"""An accepted candidate keeps only the edits its gain needs: a joint
candidate whose validation score rose is scored without each of its edits in turn, an
edit whose absence scores as well is dropped (recorded as a rejected proposal with its
reason), the step keeps and logs the prompts that remain, and the run's summary names the
dropped edit."""

from __future__ import annotations

import asyncio
import re

import pytest

from engine.cli import main
from engine.core.optimizer import PRUNED_REASON
from engine.events import Progress, Proposal, StepFinished
from engine.llm.base import LLMRequest
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute, resume
from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph
from tests.support.runlog import rows, run_content


def useful_and_useless(request: LLMRequest) -> str | None:
    """TWO_HINTS where hint_a's edit does the work and hint_b's does nothing for the score:
    hint_a writes 'good' under its edited prompt (else 'plain'); hint_b writes 'plain', or
    'noise' under its edited prompt (so the final node sees other inputs, as the demo's
    `answer` edit 'Copy the length of the string from your inputs.' gave other replies);
    the final node is right exactly when it reads a 'good' hint."""
    node, text = request.meta.get("node"), request.user_text
    if request.purpose == "update":
        new = {"hint_a": "A-GOOD", "hint_b": "Copy the length of the string."}.get(
            node, request.meta["prompt"])
        return f"<prompt>{new}</prompt>"
    if request.purpose == "forward" and node == "hint_a":
        return f"<output>{'good' if 'A-GOOD' in text else 'plain'}</output>"
    if request.purpose == "forward" and node == "hint_b":
        return f"<output>{'noise' if 'length of the string' in text else 'plain'}</output>"
    if request.purpose == "forward" and node == "final":
        a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
        return f"<output>{a + b if chr(10) + 'good' + chr(10) in text else 0}</output>"
    return None


def useful_and_useless_responder():
    """--scripted-responder FILE.py:NAME calls NAME() for the responder."""
    return useful_and_useless


def both_needed(request: LLMRequest) -> str | None:
    """Each hint's edit is needed: the final node is right only when both hints are good."""
    node, text = request.meta.get("node"), request.user_text
    if request.purpose == "update":
        new = {"hint_a": "A-GOOD", "hint_b": "B-GOOD"}.get(node, request.meta["prompt"])
        return f"<prompt>{new}</prompt>"
    if request.purpose == "forward" and node in ("hint_a", "hint_b"):
        good = ("A-GOOD" if node == "hint_a" else "B-GOOD") in text
        return f"<output>{'good' if good else 'plain'}</output>"
    if request.purpose == "forward" and node == "final":
        a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
        return f"<output>{a + b if text.count(chr(10) + 'good' + chr(10)) == 2 else 0}</output>"
    return None


def step1(result) -> StepFinished:
    return next(s for s in result.events.of(StepFinished) if s.step == 1)


def test_a_useless_edit_is_dropped_from_the_kept_candidate(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=useful_and_useless), steps=1,
                        train=4, val=4)
    # the kept prompts: hint_a's edit only; hint_b's version is logged, not accepted
    assert rows(db, "SELECT node_id, prompt, accepted FROM prompt_versions WHERE step = 1 "
                    "ORDER BY node_id") == [("hint_a", "A-GOOD", True),
                                            ("hint_b", "Copy the length of the string.", False)]
    updates = {r[0]: r[1:] for r in rows(
        db, "SELECT node_id, accepted, val_before, val_after, val_alone, reject_reason "
            "FROM updates WHERE step = 1")}
    assert updates["hint_a"] == (True, 0.0, 1.0, 1.0, None)
    accepted, before, after, alone, reason = updates["hint_b"]
    # tried first (the later node in the graph), dropped: hint_a's edit was not tried
    # alone against it, and no pass scored hint_b's edit alone
    assert (accepted, before, after, alone) == (False, 0.0, 1.0, None)
    assert reason == (f"{PRUNED_REASON}: without this edit validation scored 1, as with it "
                      "(1): the gain does not need it")
    # the step keeps the score of the prompts it kept, and its validation record is their
    # pass: hint_b at its old version, the final node on (good, plain)
    assert rows(db, "SELECT val_score, accepted FROM steps WHERE step = 1") == [(1.0, True)]
    assert rows(db, "SELECT node_id, prompt_version, count(*) FROM node_outputs WHERE step = 1 "
                    "AND split = 'val' GROUP BY ALL ORDER BY 1") == [
        ("final", 0, 4), ("hint_a", 1, 4), ("hint_b", 0, 4)]
    assert all("noise" not in r[0] for r in rows(
        db, "SELECT input_text FROM node_outputs WHERE step = 1 AND split = 'val' "
            "AND node_id = 'final'"))
    metrics = step1(result).metrics
    assert metrics["edits_pruned"] == 1 and metrics["proposals_changed"] == 2
    assert metrics["val_candidate"] == 1.0
    # one pass beside the joint one, without hint_b: hint_b's old calls (step 0's, from the
    # cache) and the final node on (good, plain) (new requests); hint_a's edit shared
    assert metrics["prune_calls"] == 8
    assert step1(result).timings["prune_model_calls"] == 4
    assert rows(db, "SELECT value FROM metrics WHERE step = 1 AND key = 'edits_pruned'") == [
        (1.0,)]
    # progress counts the passes as a phase of their own, after the gate's
    phases = [e.phase for e in result.events.of(Progress) if e.step == 1]
    assert phases[-1] == "prune" and phases.index("prune") > max(
        i for i, p in enumerate(phases) if p == "gate")
    last = [e for e in result.events.of(Progress) if e.phase == "prune"][-1]
    assert last.calls_done == last.calls_expected == 8


def test_edits_the_gain_needs_are_all_kept(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=both_needed), steps=1, train=4,
                        val=4)
    assert rows(db, "SELECT node_id, accepted, val_after, val_alone, reject_reason FROM "
                    "updates WHERE step = 1 AND node_id LIKE 'hint_%' ORDER BY 1") == [
        ("hint_a", True, 1.0, 0.0, None), ("hint_b", True, 1.0, 0.0, None)]
    assert step1(result).metrics["edits_pruned"] == 0
    assert step1(result).val_score == 1.0


@pytest.mark.parametrize("given", [{"gate": False}, {"steps": 1}], ids=["no-gate", "rejected"])
def test_nothing_is_pruned_without_the_gate_or_on_a_rejected_step(tmp_path, given):
    def rejected(request):  # hint_a's edit no longer helps: the step is rejected
        if request.purpose == "forward" and request.meta.get("node") == "hint_a":
            return "<output>plain</output>"
        return useful_and_useless(request)

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    responder = useful_and_useless if "gate" in given else rejected
    result = run_engine(graph, db, ScriptedBackend(responder=responder), train=4, val=4,
                        **{"steps": 1, **given})
    assert "edits_pruned" not in step1(result).metrics
    assert all(PRUNED_REASON not in (p.reject_reason or "")
               for p in result.events.of(Proposal))
    assert not any(e.phase == "prune" for e in result.events.of(Progress))


def test_the_best_of_several_candidates_is_pruned(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=useful_and_useless), steps=1,
                        train=4, val=4, proposals=2)
    # the responder ignores the sample: candidate 2 repeats candidate 1 (scored once)
    kept = rows(db, "SELECT node_id, candidate, accepted, reject_reason FROM updates "
                    "WHERE step = 1 AND node_id LIKE 'hint_%' ORDER BY candidate, node_id")
    assert kept[0] == ("hint_a", 0, True, None)
    assert kept[1][:3] == ("hint_b", 0, False) and kept[1][3].startswith(PRUNED_REASON)
    assert [r[2] for r in kept[2:]] == [False, False]
    assert step1(result).metrics["edits_pruned"] == 1


def test_the_run_summary_names_the_dropped_edit(tmp_path, capsys):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    code = main(["run", str(graph), "--backend", "scripted", "--steps", "1", "--train", "4",
                 "--val", "4", "--test", "0", "--scripted-responder",
                 f"{__file__}:useful_and_useless_responder", "--db",
                 str(tmp_path / "runs.duckdb")])
    assert code == 0
    out = capsys.readouterr().out.splitlines()
    assert ("step 1: dropped the edit of hint_b: without it validation scored 1, as with it "
            "(1): the gain does not need it") in out
    pruning = [line for line in out if line.startswith("pruning: ")]
    assert pruning == ["pruning: 1 accepted step, each edit left out in turn: 1 dropped, 8 calls "
                       f"(4 to the model), {pruning[0].split(', ')[-1]}"]


def useful_on_even(request: LLMRequest) -> str | None:
    """`useful_and_useless`, with the final node right only where the question's first
    number is even: after step 1 keeps hint_a's edit, training examples still fail, so
    step 2 back-propagates and shows hint_b's update call its dropped edit as rejected."""
    reply = useful_and_useless(request)
    if request.purpose == "forward" and request.meta.get("node") == "final":
        a = int(re.findall(r"(\d+) apples and buys", request.user_text)[0])
        return reply if a % 2 == 0 else "<output>0</output>"
    return reply


class Counting(ScriptedBackend):
    """The scripted backend with `useful_on_even`, counting requests that reach it."""

    def __init__(self) -> None:
        super().__init__(responder=useful_on_even)
        self.made = 0

    async def complete(self, request: LLMRequest):
        self.made += 1
        return await super().complete(request)


@pytest.mark.parametrize("stop", ["while pruning", "in the next step"])
def test_a_stopped_run_resumes_to_what_an_uninterrupted_run_logs(tmp_path, stop):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())

    def start(name: str, backend: Counting, **options):
        config = RunConfig(graph=str(graph), db=str(tmp_path / name), backend="scripted",
                           steps=2, train=4, val=4, test=2, run_id="r", **options)
        return asyncio.run(execute(config, forward_backend=backend))

    full = start("full.duckdb", Counting())
    assert step1(full).metrics["edits_pruned"] == 1
    full_db = tmp_path / "full.duckdb"
    full_content = run_content(full_db, "r")
    full_reasons = rows(full_db, "SELECT step, node_id, reject_reason, val_alone FROM updates "
                                 "ORDER BY ALL")
    # step 2 trains again, and its update call for hint_b shows the dropped edit
    assert rows(full_db, "SELECT count(*) FROM llm_calls WHERE step = 2 AND purpose = "
                         "'update' AND node_id = 'hint_b' AND messages LIKE "
                         "'%Copy the length of the string.%'") == [(1,)]
    step1_calls = sum(1 for r in rows(full_db, "SELECT step FROM llm_calls WHERE NOT "
                                               "cache_hit") if r[0] <= 1)
    # the pruning pass's model calls are the last of step 1's: stop inside them, or
    # inside step 2, which a resume then starts from the run log's state
    budget = step1_calls - 1 if stop == "while pruning" else step1_calls + 2
    stopped = start("stopped.duckdb", Counting(), max_calls=budget)
    assert stopped.status == "budget"
    phase = [(e.step, e.phase) for e in stopped.events.of(Progress)][-1]
    assert phase == ((1, "prune") if stop == "while pruning" else (2, "forward"))
    resumed = asyncio.run(resume(str(tmp_path / "stopped.duckdb"), "r",
                                 forward_backend=Counting()))
    assert resumed.status == "finished"
    assert run_content(tmp_path / "stopped.duckdb", "r") == full_content
    assert rows(tmp_path / "stopped.duckdb", "SELECT step, node_id, reject_reason, val_alone "
                "FROM updates ORDER BY ALL") == full_reasons


def test_prompt_history_shows_the_dropped_edit_and_why(tmp_path, monkeypatch):
    from tests.support.dashboard_log import open_page

    monkeypatch.delenv("SEMBACK_DB", raising=False)  # open_page sets it; restored after
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=useful_and_useless), steps=1,
                        train=4, val=4)
    at = open_page(db, "screens/history.py", run=result.run_id, node="hint_b")
    timeline = next(d.value for d in at.dataframe if "verdict" in d.value.columns)
    assert list(timeline["verdict"]) == ["dropped"]
    assert timeline["reason"].iloc[0].startswith(PRUNED_REASON)
    assert any(i.value.startswith(f"why: {PRUNED_REASON}: without this edit validation "
                                  "scored 1") for i in at.info)
    assert any(e.label.startswith("step 1 · dropped · validation") for e in at.expander)
    kept = open_page(db, "screens/history.py", run=result.run_id, node="hint_a")
    assert list(next(d.value for d in kept.dataframe if "verdict" in d.value.columns)[
        "verdict"]) == ["accepted"]


def test_the_estimate_counts_pruning_at_the_share_of_accepted_steps(tmp_path):
    from engine.core.graph import load_graph
    from engine.runs.call_sizes import CallSizes
    from engine.runs.estimate import estimate_calls, prune_calls

    graph = load_graph(write_graph(tmp_path, TWO_HINTS, arithmetic_rows()))
    changed = graph.trainable_nodes
    # each of the 3 edits left out: the final node sees 3 new sets of edits; without the
    # cache the old hints count too (hint_a's old call where its edit is left out, and
    # hint_b's); beside --node-gates on's passes alone, those old calls are made already
    assert prune_calls(graph, changed, cached=True) == 3
    assert prune_calls(graph, changed, cached=False) == 5
    assert prune_calls(graph, changed, cached=False, alone=True) == 3
    assert prune_calls(graph, changed[:1], cached=False) == 0

    def pruning(**settings) -> tuple[int, int]:
        config = RunConfig(graph="", steps=4, **settings)
        est = estimate_calls(graph, config, 20, 16, 0, sizes=CallSizes(accepted_share=0.25))
        phase = [p for p in est.phases if "pruning" in p.name]
        return (phase[0].expected, phase[0].upper) if phase else (0, 0)

    assert pruning() == (4 * 16 * 3 // 4, 4 * 16 * 5)  # a quarter of the steps accepted
    assert pruning(gate=False) == (0, 0)  # every candidate kept whole
    assert pruning(update_mode="one") == (0, 0)  # one edit a step: nothing to leave out


def one_of_three(request: LLMRequest) -> str | None:
    """DIAMOND where a's edit does the work and b's and c's change their outputs only."""
    node, text = request.meta.get("node"), request.user_text
    marks = {"a": "A-GOOD", "b": "B-NOISE", "c": "C-NOISE"}
    outputs = {"a": "good", "b": "noise", "c": "more noise"}
    if request.purpose == "update":
        return f"<prompt>{marks.get(node, request.meta['prompt'])}</prompt>"
    if request.purpose == "forward" and node in marks:
        return f"<output>{outputs[node] if marks[node] in text else 'plain'}</output>"
    if request.purpose == "forward" and node == "final":
        a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
        return f"<output>{a + b if chr(10) + 'good' + chr(10) in text else 0}</output>"
    return None


def test_two_useless_edits_of_three_are_dropped_in_turn(tmp_path):
    from tests.support.graphs import DIAMOND

    graph = write_graph(tmp_path, DIAMOND, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=one_of_three), steps=1, train=4,
                        val=4)
    got = {r[0]: r[1:] for r in rows(db, "SELECT node_id, accepted, reject_reason FROM "
                                         "updates WHERE step = 1")}
    assert got["a"] == (True, None)
    # c first (the later in the graph), then b against {a, b}: each scored 1 without it
    for node in ("b", "c"):
        assert got[node][0] is False and got[node][1].startswith(PRUNED_REASON), node
    assert step1(result).metrics["edits_pruned"] == 2
    assert step1(result).val_score == 1.0
    assert rows(db, "SELECT node_id FROM prompt_versions WHERE step = 1 AND accepted") == [
        ("a",)]
    # two passes: without c ({a, b}: c's old calls, the final node on new inputs), then
    # without b ({a}: b's old calls, the final node again): 2 x (4 + 4)
    assert step1(result).metrics["prune_calls"] == 16


def test_the_reason_says_whether_validation_rose_without_the_edit():
    from engine.core.optimizer import pruned_reason

    assert pruned_reason(0.708, 0.708) == (
        f"{PRUNED_REASON}: without this edit validation scored 0.708, as with it (0.708): "
        "the gain does not need it")
    assert pruned_reason(0.75, 0.708).startswith(
        f"{PRUNED_REASON}: without this edit validation scored 0.75, more than with it "
        "(0.708)")


def test_under_auto_gates_the_estimate_counts_a_step_gated_or_pruned_at_most_once(tmp_path):
    from engine.core.graph import load_graph
    from engine.runs.call_sizes import CallSizes
    from engine.runs.estimate import estimate_calls

    graph = load_graph(write_graph(tmp_path, TWO_HINTS, arithmetic_rows()))
    config = RunConfig(graph="", steps=4, node_gates="auto")
    est = estimate_calls(graph, config, 20, 16, 0, sizes=CallSizes(accepted_share=0.25))
    upper = {p.name.split(": ")[1]: p.upper for p in est.phases if p.split == "val"}
    # the gates' 5 node calls per example at most, alone or pruning: pruning adds nothing
    assert upper["per-node gates (auto)"] == 4 * 16 * 5
    assert upper["pruning the kept edits"] == 0


def test_an_edit_whose_removal_costs_one_validation_example_is_kept(tmp_path):
    """Pruning's boundary: an edit is dropped only when validation without it scores at
    least as well. Here hint_b's edit is needed by exactly one of twenty validation
    examples: without it validation scores 19/20 against 20/20, so it must be kept (a
    tolerance of one example in twenty would drop it)."""
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    probe_db = tmp_path / "split.duckdb"  # which examples the seed puts in validation
    run_engine(graph, probe_db, ScriptedBackend(responder=both_needed), steps=0, train=4,
               val=20)
    val = [r[0] for r in rows(probe_db, "SELECT example_id FROM examples WHERE split = 'val' "
                                        "ORDER BY position")]
    assert len(val) == 20
    special = next(r["question"] for r in arithmetic_rows() if r["id"] == val[0])

    def one_example_needs_b(request: LLMRequest) -> str | None:
        """hint_a's edit fixes every example; hint_b's only `special`, which needs both."""
        node, text = request.meta.get("node"), request.user_text
        if request.purpose == "forward" and node == "final":
            a, b = map(int, re.findall(r"(\d+) apples and buys (\d+)", text)[0])
            good = text.count(chr(10) + "good" + chr(10))
            needed = 2 if special in text else 1
            return f"<output>{a + b if good >= needed and 'good' in text.split(chr(10)) else 0}" \
                   "</output>"
        return both_needed(request)

    db = tmp_path / "runs.duckdb"
    result = run_engine(graph, db, ScriptedBackend(responder=one_example_needs_b), steps=1,
                        train=4, val=20)
    # the pass without hint_b scored 19 of 20: below the joint 20 of 20, so both are kept
    assert rows(db, "SELECT node_id, accepted, val_after FROM updates WHERE step = 1 AND "
                    "node_id LIKE 'hint_%' ORDER BY 1") == [("hint_a", True, 1.0),
                                                           ("hint_b", True, 1.0)]
    assert step1(result).metrics["edits_pruned"] == 0
    assert step1(result).val_score == 1.0
    assert rows(db, "SELECT count(*) FROM losses WHERE step = 1 AND split = 'val' AND "
                    "score = 1") == [(20,)]
