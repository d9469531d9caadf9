"""blame on the teaching graph with a planted fault (sample_graphs/blame_fault.yaml): the
probes single out the faulty node only when the evidence separates it, name the
confounds (leaks, in-sample edits, copied proposals, errors) and never count them, and
compare methods on the same traces."""

from __future__ import annotations

import asyncio
import json
import re

import duckdb
import pytest

from engine.cli import main
from engine.core.claims import gradient_claim
from engine.data.stats import wilson
from engine.llm.base import LLMError
from engine.llm.scripted import ScriptedBackend
from engine.probes.blame import blame
from engine.probes.probe import ProbeResult
from engine.probes.verdict import (
    Evidence,
    edit_verdict,
    examples_to_separate,
    logged_verdict,
    verdict,
    weigh,
)
from engine.runlog.reader import node_blame, step_updates
from engine.runs.execute import RunConfig, execute
from tests.support.blame_fault_script import blame_fault_responder
from tests.support.runlog import rows
from tests.test_probe import GRAPH

NODES = ["who", "numbers", "total"]  # the graph's LLM nodes


def logged_run(tmp_path, misleading: bool = False, **config) -> str:
    db = str(tmp_path / "runs.duckdb")
    # every node gets a proposal for the edit probes, 'who' too, whose honest gradients
    # say no change is needed (under the default --update-when asked it would get none)
    settings = dict(graph=str(GRAPH), db=db, steps=1, test=0, run_id="bf",
                    failures_per_step=3, update_when="always")
    settings.update(config)
    asyncio.run(execute(RunConfig(**settings), forward_backend=ScriptedBackend(
        responder=blame_fault_responder(misleading))))
    return db


def run_blame(db: str, misleading: bool = False, examples: str = "failing", **kw):
    kw.setdefault("adaptive", False)  # what every planned probe shows (adaptive: below)
    return asyncio.run(blame(db, "bf", kw.pop("step", 1), examples,
                             forward_backend=ScriptedBackend(
                                 responder=blame_fault_responder(misleading)), **kw))


def table(report) -> dict[str, tuple]:
    edits = {e.node_id: e for e in report.edits}
    return {r.node_id: (r.probed, r.flips, r.leaks, edits[r.node_id].flips,
                        edits[r.node_id].in_sample, edits[r.node_id].counted)
            for r in report.nodes}


def test_blame_pools_every_failing_example_and_names_the_fault(tmp_path):
    db = logged_run(tmp_path)
    report = run_blame(db, step=None)
    assert report.steps == [1] and len(report.examples) == 8  # all 8 training examples fail
    # the 3 back-propagated examples are in-sample for every edit: their flips are shown,
    # and they are left out of what is counted (5 of the 8)
    assert table(report) == {"who": (8, 0, 0, 0, 0, 5), "numbers": (8, 8, 0, 5, 3, 5),
                             "total": (8, 0, 8, 0, 0, 5)}  # total's flips copy the target
    rows = {r.node_id: r for r in report.nodes}
    assert rows["numbers"].interval[0] > max(rows["who"].interval[1], rows["total"].interval[1])
    assert report.verdict.node == "numbers" and report.claimed == "numbers"
    logged = {r["node_id"]: (r["probed"], r["flips"], r["leaks"], r["edit_flips"],
                             r["edit_probed"])
              for r in node_blame(db, "bf", 1).to_dict("records")}
    assert logged == {n: (p, f, k, e, ep) for n, (p, f, k, e, _, ep) in table(report).items()}
    assert logged_verdict(node_blame(db, "bf", 1).to_dict("records"),
                          step_updates(db, "bf", 1).to_dict("records"), NODES)[0].node == "numbers"
    with duckdb.connect(db, read_only=True) as con:
        kinds = con.execute("SELECT kind, count(*) FROM probes GROUP BY kind ORDER BY kind"
                            ).fetchall()
    assert kinds == [("edit", 24), ("gradient", 24)]
    again = run_blame(db, step=None)  # deterministic, and free the second time
    assert table(again) == table(report) and again.model_calls == 0


def test_three_sampled_examples_barely_separate_and_the_gradients_claims(tmp_path):
    db = logged_run(tmp_path)
    report = run_blame(db, examples="sampled")
    assert len(report.examples) == 3
    assert table(report)["numbers"] == (3, 3, 0, 0, 3, 0)  # every edit probe is in-sample
    low, high = report.nodes[1].interval
    assert round(low, 3) == 0.526 and high == 1.0
    assert report.verdict.node == "numbers"
    # the command says why no edit counts, and what would test them
    import io

    from rich.console import Console

    from engine.cli.probes import blame_lines

    said = "no edit probe counts: every example probed fed the update call"
    assert any(said in line for line in blame_lines(report, Console(file=io.StringIO())))
    assert not any(said in line for line in blame_lines(run_blame(db),
                                                        Console(file=io.StringIO())))
    # honest gradients: 'who' is told no change is needed, 'numbers' to change
    claims = {(c["example"], c["node"]): c["asks_change"] for c in report.claims}
    assert not any(v for (e, n), v in claims.items() if n == "who")
    assert all(v for (e, n), v in claims.items() if n == "numbers")


def test_probes_disagree_with_gradients_that_point_at_the_wrong_node(tmp_path):
    db = logged_run(tmp_path, misleading=True)
    report = run_blame(db, misleading=True, examples="sampled")
    # 'who' is asked to change too; following that fixes nothing. Both inputs of 'total'
    # asked, neither upstream of the other: the gradients point at no single node
    claims = {(c["example"], c["node"]): c["asks_change"] for c in report.claims}
    assert all(v for (e, n), v in claims.items() if n in ("who", "numbers"))
    assert report.claimed is None
    assert table(report)["who"][:2] == (3, 0)
    assert report.verdict.node == "numbers"


def test_no_verdict_while_intervals_overlap():
    one = Evidence("a", probed=1, flips=1)
    two = Evidence("b", probed=3, flips=2)
    v = verdict([one, two])  # 1/1 does not beat 2/3
    assert v.node is None and "insufficient evidence" in v.reason
    assert v.more_examples is not None and v.more_examples > 0
    assert verdict([Evidence("a", probed=3, flips=3), Evidence("b", probed=3)]).node == "a"
    # an equal share never separates; errors are not counted as 'did not flip'
    assert verdict([Evidence("a", probed=4, flips=2), Evidence("b", probed=4, flips=2)]
                   ).more_examples is None
    failed = Evidence("a", probed=10, flips=1, errors=9)
    assert failed.counted == 1 and failed.share == 1.0
    assert verdict([Evidence("a", probed=2, flips=0), Evidence("b", probed=2)]).node is None


def test_two_nodes_above_the_rest_but_not_each_other_are_a_tie():
    """two_faults' shape: either repair alone passes the number on, so both faults fix every
    failing example and the third node none. No single node is named; the tie names both,
    and only when each clears every node outside it."""
    rows = [Evidence("total", probed=6), Evidence("fault_b", probed=6, flips=6),
            Evidence("fault_a", probed=6, flips=6)]
    v = verdict(rows)
    assert v.node is None and v.tied == ["fault_a", "fault_b"]
    assert v.named == "fault_a or fault_b"
    assert v.reason.startswith("a tie: the 90% intervals of fault_a and fault_b (fault_a 6/6, "
                               "fault_b 6/6) each lie above every other node's")
    assert v.as_json()["tied"] == ["fault_a", "fault_b"]
    # one tied node that does not clear the third: no tie, only insufficient evidence
    weak = verdict([Evidence("total", probed=6, flips=1), Evidence("a", probed=6, flips=6),
                    Evidence("b", probed=6, flips=3)])
    assert weak.tied == [] and weak.named == "no node"
    assert "insufficient evidence" in weak.reason
    # a tie needs a node outside it, and a single leader is named, not tied
    assert verdict([Evidence("a", probed=6, flips=6), Evidence("b", probed=6, flips=6)]
                   ).tied == []
    assert verdict([Evidence("a", probed=6, flips=6), Evidence("b", probed=6, flips=6),
                    Evidence("c", probed=6)]).tied == ["a", "b"]
    assert verdict([Evidence("a", probed=6, flips=6), Evidence("b", probed=6)]).node == "a"


def test_edit_probes_decide_when_every_gradient_fix_carries_the_answer():
    """The demo's shape: the faulty node's right output is the answer itself, so every
    gradient that fixes it leaks (no gradient flips anywhere). Its out-of-sample edit
    flips 23 of 23 where the other node's flips none: the edit probes name it, and the
    report says why they decide."""
    gradients = [Evidence("note", probed=23, leaks=18), Evidence("thing", probed=23, leaks=7),
                 Evidence("answer", probed=23, leaks=23)]
    edits = [Evidence("note", "edit", probed=23, flips=23),
             Evidence("thing", "edit", probed=23), Evidence("answer", "edit")]
    chosen, kind, why = weigh(gradients, edits)
    assert (chosen.node, kind) == ("note", "edit")
    assert chosen.reason == ("note's 90% interval lies above every other node's (answer: no "
                             "edit to probe)")
    assert why.startswith("the gradient probes named no node (no gradient probe flipped")
    # gradients that name a node decide, whatever the edits say
    named = [Evidence("note", probed=6, flips=6), Evidence("thing", probed=6)]
    assert weigh(named, [Evidence("thing", "edit", probed=6, flips=6),
                         Evidence("note", "edit", probed=6)]) == (verdict(named), "gradient", "")
    # edits that name no node leave the gradient verdict in place; its reason gives
    # theirs too, so that two nodes' edits each fixing some are not hidden behind "no
    # gradient probe flipped an example"
    overlap = [Evidence("note", "edit", probed=6, flips=4), Evidence("thing", "edit", probed=6,
                                                                     flips=1)]
    chosen, kind, why = weigh(gradients, overlap)
    assert (chosen.node, kind, why) == (None, "gradient", "")
    assert chosen.reason.startswith("no gradient probe flipped")
    assert chosen.reason.endswith("; the edit probes name no node either: insufficient "
                                  "evidence: note (4/6) and thing (1/6) have overlapping 90% "
                                  f"intervals; {edit_verdict(overlap).reason.split('; ')[1]}")
    assert chosen.more_examples == edit_verdict(overlap).more_examples
    # edits that fixed nothing add nothing to the reason
    assert weigh(gradients, [Evidence("note", "edit", probed=6),
                             Evidence("thing", "edit", probed=6)])[0] == verdict(gradients)
    # one node tried is no comparison
    assert weigh(gradients, edits[:1] + [Evidence("thing", "edit")])[1] == "gradient"
    # ... unless the other's update left its prompt as it was: its edit alone changes
    # nothing, so it fixes none of the examples the tried node was probed on
    kept = [Evidence("fault", "edit", probed=6, flips=4),
            Evidence("total", "edit", unchanged=1)]
    chosen, kind, _ = weigh([Evidence("fault", probed=6, leaks=6),
                             Evidence("total", probed=6, leaks=6)], kept)
    assert (chosen.node, kind) == ("fault", "edit")
    assert chosen.reason == ("fault's 90% interval lies above every other node's (total: its "
                             "update left the prompt unchanged, so 0 of 6)")
    # but a proposal never probed (a copy of training examples) is no such comparison
    copied = [kept[0], Evidence("total", "edit", copy_rejected=1)]
    assert weigh(gradients, copied)[1] == "gradient"
    assert edit_verdict(copied).reason == ("only fault's edit was probed: no other node to "
                                        "compare")
    # and one fix in six does not clear an unchanged node's 0 of 6
    assert weigh([], [Evidence("fault", "edit", probed=6, flips=1),
                      Evidence("total", "edit", unchanged=1)])[0].node is None
    # no gradients at all: the edits decide
    assert weigh([], edits)[1:] == ("edit", "the run has no gradients")


def test_wilson_interval_and_examples_needed():
    assert wilson(0, 0) == (0.0, 1.0)
    low, high = wilson(8, 8)
    assert round(low, 4) == 0.7473 and high == 1.0
    low, high = wilson(5, 10)
    assert round(low, 3) == 0.269 and round(high, 3) == 0.731
    n = examples_to_separate(0.8, 0.2)
    assert wilson(round(0.8 * n), n)[0] > wilson(round(0.2 * n), n)[1]
    assert not wilson(round(0.8 * (n - 1)), n - 1)[0] > wilson(round(0.2 * (n - 1)), n - 1)[1]


def test_a_flip_needs_a_failing_score_before():
    base = dict(run_id="r", step=1, example_id="e", node_id="n", kind="edit", intervention="",
                before_output="", after_output="")
    assert ProbeResult(**base, before_score=0.0, after_score=1.0).flipped
    assert not ProbeResult(**base, before_score=1.0, after_score=1.0).flipped
    assert not ProbeResult(**base, before_score=None, after_score=1.0).flipped
    broke = ProbeResult(**base, before_score=1.0, after_score=0.0)
    assert broke.regressed and not broke.flipped
    assert ProbeResult(**base, before_score=0.2, after_score=0.9).score_change == \
        pytest.approx(0.7)
    assert not ProbeResult(**base, before_score=0.0, after_score=1.0, error="x").flipped


@pytest.mark.parametrize("text, asks", [
    ("", False),
    ("No change is needed: the name does not affect the sum.", False),
    ("This input is already correct as it is.", False),
    ("No change is needed to the wording, but the numbers must be passed on.", True),
    ("Give the numbers.", True),
    ("There is no other information; pass the numbers instead of a name.", True),
])
def test_reading_what_a_gradient_claims(text, asks):
    assert gradient_claim(text)[0] is asks


def test_blame_command_prints_the_table_and_the_verdict(tmp_path, capsys, monkeypatch):
    db = logged_run(tmp_path, misleading=True)
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder(True)))
    assert main(["blame", "bf", "--db", db, "--step", "1", "--examples", "sampled",
                 "--exhaustive"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    numbers = next(ln for ln in lines if ln.startswith("│ numbers"))
    assert "3/3" in numbers and "[0.53, 1.00]" in numbers and "<- probes" in numbers
    assert "<- gradients" not in captured.out
    assert "probes blame: numbers" in captured.out
    assert "gradients point at: no single node (0 of 3 examples point at one node)" \
        in captured.out
    assert "probes 18/18 done" in captured.err  # progress, one line at a time in a log
    assert main(["blame", "bf", "--db", db, "--step", "7"]) == 2
    assert "no complete step 7" in capsys.readouterr().err
    assert main(["blame", "bf", "--db", db, "--method", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err
    assert main(["blame", "bf", "--db", db, "--examples", "sampled", "--step", "1",
                 "--repeats", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --repeats")


def test_blame_json_and_methods_on_the_same_traces(tmp_path, capsys, monkeypatch):
    db = logged_run(tmp_path)
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    assert main(["blame", "bf", "--db", db, "--examples", "sampled", "--json",
                 "--method", "semantic,textgrad,semantic-nosibling"]) == 0
    report = json.loads(capsys.readouterr().out)
    nodes = {n["node"]: n for n in report["nodes"]}
    assert set(nodes) == {"who", "numbers", "total"}
    assert (nodes["numbers"]["probed"], nodes["numbers"]["flips"], nodes["numbers"]["errors"]
            ) == (3, 3, 0)
    assert nodes["numbers"]["interval"] == [0.5258, 1.0]
    assert nodes["total"]["leaks"] == 3 and nodes["total"]["flips"] == 0
    assert report["verdict"]["node"] == "numbers"
    methods = {(m["method"], m["node"]): m for m in report["methods"]}
    assert {m for m, _ in methods} == {"semantic", "textgrad", "semantic-nosibling"}
    for name in ("semantic", "textgrad", "semantic-nosibling"):
        row = methods[(name, "numbers")]
        assert set(row) >= {"method", "node", "probed", "flips", "interval"}
        assert (row["probed"], row["flips"]) == (3, 3)


def test_a_method_without_gradients_is_judged_by_its_out_of_sample_edits(tmp_path, capsys,
                                                                        monkeypatch):
    """`--method none` logs no gradients: the verdict weighs the edit probes, and only
    their flips on examples the update call did not see."""
    db = logged_run(tmp_path, method="none")
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    assert main(["blame", "bf", "--db", db]) == 0
    out = capsys.readouterr().out
    grads, edited = [ln for ln in out.splitlines() if ln.startswith("│ numbers")]
    assert "5/5" in edited and "<- probes" in edited and "<- probes" not in grads
    assert "probes blame: numbers (edit probes: " in out
    assert "the edit probes decide: the run has no gradients" in out
    # the pages' verdict, from the probes the blame logged, is the command's
    pooled = logged_verdict(node_blame(db, "bf", 1).to_dict("records"),
                            step_updates(db, "bf", 1).to_dict("records"), NODES)
    assert (pooled[0].node, pooled[1]) == ("numbers", "edit")
    # the Examples page names the same examples in-sample: the seeded sample drawn again,
    # with no gradient logged to say which they were
    from engine.runlog.debug import example_rows

    cells = example_rows(db, "bf", 1, split="train", limit=100)
    marked = set(cells.loc[cells["in_sample"] == "numbers", "example_id"])
    sampled = {e for _, e in run_blame(db, examples="sampled").examples}
    assert len(marked) == 3 and marked == sampled
    report = run_blame(db)
    assert report.evidence == "edit" and {r.kind for r in report.results} == {"edit"}
    edits = {e.node_id: e for e in report.edits}
    assert (edits["numbers"].flips, edits["numbers"].in_sample) == (5, 3)
    assert report.verdict.node == "numbers"
    sampled = run_blame(db, examples="sampled")
    assert sampled.verdict.node is None  # every edit flip there is in-sample


def test_a_node_whose_update_changed_nothing_counts_as_fixing_nothing(tmp_path, monkeypatch,
                                                                     capsys):
    """Only `numbers`'s update proposed a new prompt; `who`'s and `total`'s left theirs as
    they were. Their edits alone change nothing, so they fix none of the failing examples:
    `numbers`'s out-of-sample fixes are weighed against 0 of n, and blame names it (it used
    to say one tried node was no comparison). The pages' verdict agrees."""
    def only_numbers(request):
        if request.purpose == "update" and request.meta.get("node") != "numbers":
            return f"<prompt>{request.meta.get('prompt', '')}</prompt>"
        return blame_fault_responder()(request)

    db = str(tmp_path / "runs.duckdb")
    asyncio.run(execute(RunConfig(graph=str(GRAPH), db=db, steps=1, test=0, run_id="bf",
                                  failures_per_step=3, update_when="always", method="none"),
                        forward_backend=ScriptedBackend(responder=only_numbers)))
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT node_id FROM updates WHERE new_prompt <> old_prompt"
                           ).fetchall() == [("numbers",)]
    report = run_blame(db)
    edits = {e.node_id: e for e in report.edits}
    assert (edits["numbers"].flips, edits["numbers"].probed, edits["numbers"].counted) == (
        5, 8, 5)
    assert (edits["who"].probed, edits["who"].unchanged) == (0, 1)
    assert (report.verdict.node, report.evidence) == ("numbers", "edit")
    assert report.verdict.reason.endswith(
        "(total: its update left the prompt unchanged, so 0 of 5; who: its update left the "
        "prompt unchanged, so 0 of 5)")
    pooled = logged_verdict(node_blame(db, "bf", 1).to_dict("records"),
                            step_updates(db, "bf", 1).to_dict("records"), NODES)
    assert (pooled[0].node, pooled[0].reason) == ("numbers", report.verdict.reason)


def test_copied_proposals_are_never_probed(tmp_path, capsys, monkeypatch):
    """A proposal the optimizer rejected as a copy of training examples is flagged, not
    probed: its flips would be the examples pasted in."""
    def copying(request):
        if request.purpose == "update" and request.meta.get("node") == "numbers":
            pasted = request.user_text.split('<input name="text">', 1)[-1][:400]
            return f"<prompt>Copy the two numbers in the text. Examples: {pasted}</prompt>"
        return blame_fault_responder()(request)

    db = str(tmp_path / "runs.duckdb")
    asyncio.run(execute(RunConfig(graph=str(GRAPH), db=db, steps=1, test=0, run_id="bf",
                                  failures_per_step=3),
                        forward_backend=ScriptedBackend(responder=copying)))
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT reject_reason FROM updates WHERE node_id = 'numbers'"
                           ).fetchone()[0] == "copies training examples"
    report = asyncio.run(blame(db, "bf", 1, forward_backend=ScriptedBackend(
        responder=copying)))
    edits = {e.node_id: e for e in report.edits}
    assert (edits["numbers"].probed, edits["numbers"].copy_rejected) == (0, 1)
    assert not [r for r in report.results if r.kind == "edit" and r.node_id == "numbers"]
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=copying))
    assert main(["probe", "bf", "--db", db, "--step", "1", "--node", "numbers", "--edit",
                 "proposed"]) == 2
    assert "copies training examples" in capsys.readouterr().err


# --repeats at temperature > 0: four draws of each probe. The gradient probe at 'numbers'
# on a sentence whose first number is n: its first `fixing` draws follow the gradient
# (and fix the example), the next ones do not, and its last `failing` draws fail. The
# seeded split's eight training sentences start with these numbers (17 twice).
DRAWS = 4
PATTERNS = {  # n: (fixing, failing)
    5: (0, 0),  # no draw fixes it
    6: (1, 0),  # one lucky draw of four: not a flip
    16: (2, 0),  # a tie, two of four: not a flip
    17: (2, 1),  # two of the three that did not fail: a flip
    3: (3, 0),  # three of four: a flip
    15: (4, 0),  # every draw: a flip
    13: (0, 4),  # every draw fails: an error, not evidence either way
}


def first_number(text: str) -> int:
    return int(re.search(r"has (\d+)", text).group(1))


def disagreeing_draws(request):
    if request.purpose == "probe" and request.meta.get("role") == "probe_rewrite" \
            and request.meta.get("node") == "numbers":
        fixing, failing = PATTERNS[first_number(request.user_text)]
        if request.sample_index >= DRAWS - failing:
            raise LLMError("scripted: this draw fails")
        if request.sample_index >= fixing:  # this draw ignores the gradient
            return f"<output>{request.meta.get('output', '')}</output>"
    return blame_fault_responder()(request)


def test_repeated_draws_become_one_flip_by_strict_majority(tmp_path, capsys, monkeypatch):
    """R draws of one (step, example, node) probe are one group: it flips when more than
    half of its draws that did not fail flip (a tie does not); failed draws are left out;
    the flips, the denominator (groups, not draws) and the interval count groups."""
    db = logged_run(tmp_path, temperature=0.7)
    backend = ScriptedBackend(responder=disagreeing_draws)
    report = asyncio.run(blame(db, "bf", 1, "failing", repeats=DRAWS,
                               forward_backend=backend, adaptive=False))
    assert report.repeats == DRAWS
    assert {r.sample_index for r in report.results} == set(range(DRAWS))
    firsts = {e: first_number(json.loads(f)["text"]) for e, f in rows(
        db, "SELECT example_id, fields FROM examples WHERE split = 'train'")}
    assert sorted(firsts.values()) == [3, 5, 6, 13, 15, 16, 17, 17]
    numbers = next(r for r in report.nodes if r.node_id == "numbers")
    # flips: 3 of 4, 4 of 4 and twice 2 of 3; not 1 of 4 nor 2 of 4; 13 is an error
    assert (numbers.probed, numbers.errors, numbers.flips, numbers.leaks) == (8, 1, 4, 0)
    assert numbers.counted == 7 and numbers.interval == wilson(4, 7)
    # groups with a draw that did not fail, and those whose draws all agreed (5 and 15)
    assert (numbers.repeat_groups, numbers.repeat_agree) == (7, 2)
    flipped = {c["example"]: c["flipped"] for c in report.claims if c["node"] == "numbers"}
    assert flipped == {e: n in (3, 15, 17) for e, n in firsts.items()}
    # each draw is its own request to the model: one per sample index and example
    rewrites = [q for q in backend.requests if q.meta.get("role") == "probe_rewrite"
                and q.meta.get("node") == "numbers"]
    assert sorted(q.sample_index for q in rewrites) == sorted(list(range(DRAWS)) * 8)
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=disagreeing_draws))
    assert main(["blame", "bf", "--db", db, "--step", "1", "--exhaustive", "--repeats",
                 str(DRAWS), "--json"]) == 0
    data = {n["node"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}["numbers"]
    low, high = wilson(4, 7)
    assert (data["probed"], data["errors"], data["flips"], data["interval"],
            data["repeat_agreement"]) == (8, 1, 4, [round(low, 4), round(high, 4)], [2, 7])


def test_repeats_are_ignored_at_temperature_zero(tmp_path):
    cold = run_blame(logged_run(tmp_path), examples="sampled", repeats=3)
    assert cold.repeats == 1 and "ignored" in cold.repeats_note
    assert {r.sample_index for r in cold.results} == {0}


def test_edit_probes_of_the_proposal_on_its_own_examples_are_in_sample(tmp_path, capsys,
                                                                       monkeypatch):
    from engine.probes.single import probe

    db = logged_run(tmp_path)
    bk = ScriptedBackend(responder=blame_fault_responder())
    seen = asyncio.run(probe(db, "bf", 1, "numbers", "edit", text="proposed",
                             forward_backend=bk))
    assert len(seen) == 3 and all(r.in_sample and r.flipped for r in seen)
    fresh = asyncio.run(probe(db, "bf", 1, "numbers", "edit", text="proposed",
                              examples="val", forward_backend=bk))
    assert fresh and not any(r.in_sample for r in fresh)
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    assert main(["probe", "bf", "--db", db, "--step", "1", "--node", "numbers", "--edit",
                 "proposed"]) == 0
    assert capsys.readouterr().out.count("[in-sample") == 3


def test_a_named_node_never_overlaps_another():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    counts = st.integers(0, 40).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n)))

    @settings(max_examples=300, deadline=None)
    @given(st.lists(counts, min_size=1, max_size=5))
    def check(pairs):
        rows = [Evidence(f"n{i}", probed=n, flips=k) for i, (n, k) in enumerate(pairs)]
        v = verdict(rows)
        if v.node is not None:
            named = next(r for r in rows if r.node_id == v.node)
            assert all(named.interval[0] > r.interval[1] for r in rows if r is not named)
            assert v.tied == []
        if v.tied:  # each tied node clears every node outside the tie, and a node is left
            inside = [r for r in rows if r.node_id in v.tied]
            outside = [r for r in rows if r.node_id not in v.tied]
            assert len(inside) >= 2 and outside and all(r.flips for r in inside)
            assert all(i.interval[0] > o.interval[1] for i in inside for o in outside)
        elif any(r.flips for r in rows) and len(rows) > 1 and v.more_examples is not None:
            assert v.more_examples > 0

    check()


def test_the_report_names_the_models_that_answered_not_only_the_settings(tmp_path,
                                                                        monkeypatch):
    """A run's settings need not name its optimizer model (the embedded default pairs the
    0.5B with the 1.5B when the client is made): the report's rewriter is the model the
    probes' client really used."""
    from engine.runs import execute as run_execution

    db = logged_run(tmp_path)
    made = run_execution.make_client

    def paired(*args, **kwargs):
        client = made(*args, **kwargs)
        client.optimizer_model = "paired-optimizer"
        return client

    monkeypatch.setattr(run_execution, "make_client", paired)
    report = run_blame(db)
    assert report.rewriter == "paired-optimizer"


def test_an_edit_from_a_candidate_the_step_did_not_keep_says_so(tmp_path, capsys, monkeypatch):
    """Of a step's two candidate prompt sets (--proposals 2), the kept one left `numbers`
    as it was and the rejected second rewrote it: blame probes the second's edit (the best
    that changed the node), and its table says where that edit came from, in the text and
    in the JSON; the kept candidate's edits carry no such line."""
    from engine.runlog.probing import proposal_origin

    db = logged_run(tmp_path)
    with duckdb.connect(db) as con:
        con.execute("UPDATE updates SET candidate = 0, accepted = true WHERE run_id = 'bf'")
        # a second candidate: the same edits, scored 0.25 and rejected ...
        con.execute("""INSERT INTO updates SELECT * REPLACE (1 AS candidate, false AS accepted,
                           0.25 AS val_after, 'candidate 1 scored higher' AS reject_reason)
                       FROM updates WHERE run_id = 'bf' AND step = 1""")
        # ... while the kept one left `numbers` as it was
        con.execute("UPDATE updates SET new_prompt = old_prompt, accepted = false WHERE "
                    "run_id = 'bf' AND node_id = 'numbers' AND candidate = 0")
    assert proposal_origin(db, "bf", 1, "numbers") == (
        "candidate 2 of 2, not kept (its prompt set scored 0.250 on validation)")
    assert proposal_origin(db, "bf", 1, "total") is None  # the kept candidate's edit
    report = run_blame(db)
    assert report.edit_origins == {"numbers": "candidate 2 of 2, not kept (its prompt set "
                                              "scored 0.250 on validation)"}
    assert {e.node_id: e.probed for e in report.edits}["numbers"] == 8
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    assert main(["blame", "bf", "--db", db, "--step", "1"]) == 0
    shown = capsys.readouterr().out
    assert ("  numbers's edit probed: candidate 2 of 2, not kept (its prompt set scored 0.250 "
            "on validation)") in shown
    assert "total's edit probed" not in shown
    assert main(["blame", "bf", "--db", db, "--step", "1", "--json"]) == 0
    nodes = {n["node"]: n for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert nodes["numbers"]["edit"]["origin"].startswith("candidate 2 of 2, not kept")
    assert "origin" not in nodes["total"]["edit"]


def test_the_pages_verdict_reads_the_same_candidates_edit_as_blame(tmp_path):
    """Under --proposals 2, a node has one update row per candidate. The pages' verdict
    (logged_verdict) must judge the edit blame probed (`step_proposal`: the kept
    candidate's, else the best-scored one that changed the prompt), not whichever row
    comes last: here `total`'s second candidate left it unchanged, its first changed it
    but was never probed, so `numbers` has no node to be compared with."""
    from engine.runlog.probing import chosen_updates, step_proposal

    db = logged_run(tmp_path)
    with duckdb.connect(db) as con:
        con.execute("UPDATE updates SET candidate = 0, accepted = false, val_after = 0.5 "
                    "WHERE run_id = 'bf'")
        con.execute("""INSERT INTO updates SELECT * REPLACE (1 AS candidate,
                           old_prompt AS new_prompt, 0.25 AS val_after)
                       FROM updates WHERE run_id = 'bf' AND step = 1""")
    updates = step_updates(db, "bf", 1).to_dict("records")
    chosen = {u["node_id"]: u for u in chosen_updates(updates)}
    for node in NODES:
        assert step_proposal(db, "bf", 1, node)[1] == chosen[node]["new_prompt"]
    assert all(chosen[n]["candidate"] == 0 for n in NODES)
    counts = [{"node_id": "numbers", "probed": 0, "flips": 0, "leaks": 0, "edit_probed": 5,
               "edit_flips": 5}]
    found, evidence = logged_verdict(counts, updates, NODES)
    assert (found.node, found.reason) == (
        None, "only numbers's edit was probed: no other node to compare")
