"""blame per edge: at a node with two successors, each successor's gradient is followed on
its own, and only the one that fixes the answer is credited."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute
from tests.support.two_successors import two_successors_responder, write_two_successors

METHODS = ("semantic", "textgrad", "semantic-nosibling")


@pytest.fixture
def db(tmp_path, monkeypatch):
    graph = write_two_successors(tmp_path)
    path = str(tmp_path / "runs.duckdb")
    asyncio.run(execute(RunConfig(graph=str(graph), db=path, steps=1, test=0, run_id="ts",
                                  failures_per_step=2),
                        forward_backend=ScriptedBackend(responder=two_successors_responder())))
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=two_successors_responder()))
    return path


def test_each_edge_of_a_two_successor_node_is_followed_alone(db, capsys):
    assert main(["blame", "ts", "--db", db, "--json", "--method", ",".join(METHODS)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["probed_examples"] == 4  # every training example fails
    edges = {(e["method"], e["source"], e["target"]): e for e in report["edges"]}
    assert set(edges) == {(m, s, t) for m in METHODS for s, t in
                          [("fault", "add"), ("fault", "check"), ("add", "total"),
                           ("check", "total")]}
    methods = {(m["method"], m["node"]): m for m in report["methods"]}
    for name in METHODS:
        fixing, capitals = edges[(name, "fault", "add")], edges[(name, "fault", "check")]
        assert set(fixing) >= {"method", "source", "target", "probed", "flips", "errors",
                               "leaks", "interval"}
        assert (fixing["probed"], fixing["flips"], fixing["errors"], fixing["leaks"]) == \
            (4, 4, 0, 0)
        assert fixing["interval"] == [0.5965, 1.0]  # Wilson 90%, 4 of 4
        # it asked for a change too, but following it alone fixes nothing
        assert (capitals["probed"], capitals["flips"], capitals["claimed"]) == (4, 0, 4)
        assert capitals["interval"][0] == 0.0
        # the node followed both at once: the aggregate fixes every example
        fault = methods[(name, "fault")]
        assert (fault["probed"], fault["flips"], fault["claimed"]) == (4, 4, 4)
        # one successor: the edge row is the node row
        for node in ("add", "check"):
            row, edge = methods[(name, node)], edges[(name, node, "total")]
            assert (edge["probed"], edge["flips"], edge["interval"]) == \
                (row["probed"], row["flips"], row["interval"])


def test_the_edge_table_in_the_text_output(db, capsys):
    assert main(["blame", "ts", "--db", db, "--method", "semantic"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {ln.split("│")[2].strip(): ln for ln in lines
            if ln.startswith("│ semantic") and "->" in ln}
    assert set(rows) == {"fault -> add", "fault -> check", "add -> total", "check -> total"}
    assert "4/4" in rows["fault -> add"] and "[0.60, 1.00]" in rows["fault -> add"]
    assert "0/4" in rows["fault -> check"]
    fault = next(ln for ln in lines if ln.startswith("│ semantic │ fault ") and "->" not in ln)
    assert fault.split("│")[9].strip() == "4/4"  # claimed: both gradients asked


def test_no_edges_without_methods(db, capsys):
    assert main(["blame", "ts", "--db", db, "--json"]) == 0
    assert "edges" not in json.loads(capsys.readouterr().out)
