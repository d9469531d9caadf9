"""Imported traces keep what they are: each trace its own example under its whole id, and a
run of this project, exported as spans and imported again, each node's own prompt."""

from __future__ import annotations

import hashlib
import json

import duckdb

from engine.cli.commands import main
from tests.support.otlp_traces import llm_span, three_call_trace, write_lines

# eight trace ids that share their first 20 hex digits: an id cut to 16 digits makes them
# one example
PREFIX = "0123456789abcdef0123"
IDS = [PREFIX + hashlib.sha256(str(i).encode()).hexdigest()[:12] for i in range(8)]


def _run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_traces_whose_ids_share_a_long_prefix_stay_distinct_examples(tmp_path, capsys):
    spans, targets = [], []
    for i, trace_id in enumerate(IDS):
        sentence = f"Crate {i} holds {i + 2} jars of honey."
        count = f"The number is {i + 2}."
        for span in three_call_trace(i, sentence, count, f"Topic: crate {i} and honey",
                                     str(i + 2)):
            span["traceId"] = trace_id
            spans.append(span)
        # every other trace's target is wrong: graded against its own target, half fail
        targets.append({"trace_id": trace_id, "target": str(i + 2 if i % 2 == 0 else 900 + i)})
    (tmp_path / "targets.jsonl").write_text(
        "".join(json.dumps(t) + "\n" for t in targets), encoding="utf-8")
    db = tmp_path / "r.duckdb"
    got = _run_json(capsys, "import-traces", str(write_lines(tmp_path / "t.jsonl", spans)),
                    "--db", str(db), "--targets", str(tmp_path / "targets.jsonl"),
                    "--metric", "numeric")
    assert (got["traces"], got["scored"], got["failing"]) == (8, 8, 4)
    with duckdb.connect(str(db), read_only=True) as con:
        examples = con.execute("SELECT example_id, target FROM examples WHERE run_id = ? "
                               "ORDER BY example_id", [got["run_id"]]).fetchall()
        losses = con.execute("SELECT example_id, target, prediction, score FROM losses "
                             "WHERE run_id = ? ORDER BY example_id", [got["run_id"]]).fetchall()
    assert examples == sorted((t["trace_id"], t["target"]) for t in targets)
    assert [(e, t) for e, t, _, _ in losses] == examples  # one loss per trace, its own target
    assert [s for *_, s in sorted(losses, key=lambda r: IDS.index(r[0]))] == \
        [1.0, 0.0] * 4


def test_two_calls_claiming_one_example_are_refused(tmp_path, capsys):
    """This project's own export names each forward call's example; two passes that claim
    the same example are refused, never merged."""
    own = {"semback.purpose": "forward", "semback.step": 0, "semback.node_id": "only",
           "semback.example_id": "q1"}
    spans = [llm_span("run", "forward only", "Be brief.", "Question one here?",
                      "Answer one here.", 1, extra={**own, "semback.phase": "forward on train"}),
             llm_span("run", "forward only", "Be brief.", "Question two here?",
                      "Answer two here.", 2, extra={**own, "semback.phase": "forward on val"})]
    db = tmp_path / "r.duckdb"
    assert main(["import-traces", str(write_lines(tmp_path / "t.jsonl", spans)),
                 "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "example 'q1'" in err, err
    assert not db.exists()


def test_a_run_exported_as_otel_imports_with_each_nodes_own_prompt(tmp_path, capsys):
    """The forward calls' messages hold the prompt set's frame (the default set's shared
    system message, the node's prompt inside the user message); the export names the
    node's prompt beside them (`semback.prompt`), and the import takes it."""
    from engine.core.graph import load_graph
    from engine.prompts.templates import FORWARD_SYSTEM
    from tests.support.otlp_traces import exported_diamond_run

    graph, spans = exported_diamond_run(tmp_path)
    capsys.readouterr()
    # the export still records what was sent: the shared system message is in the messages
    every = [{a["key"]: next(iter(a["value"].values())) for a in s["attributes"]}
             for line in spans.read_text(encoding="utf-8").splitlines()
             for r in json.loads(line)["resourceSpans"] for sc in r["scopeSpans"]
             for s in sc["spans"]]
    attributes = [a for a in every if a.get("semback.purpose") == "forward"]
    assert all(a["llm.input_messages.0.message.content"] == FORWARD_SYSTEM for a in attributes)
    prompts = {n.id: n.prompt for n in load_graph(graph).nodes}
    assert {(a["semback.node_id"], a["semback.prompt"]) for a in attributes
            if a["semback.step"] == "0"} == set(prompts.items())
    got = _run_json(capsys, "import-traces", str(spans), "--db", str(tmp_path / "back.duckdb"))
    assert {n["id"]: n["prompt"] for n in got["nodes"]} == prompts
    assert got["traces"] == 8 and got["ambiguous"] == []
