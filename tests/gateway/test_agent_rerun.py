"""The tool agent (sample_graphs/agent_pipeline.py), run for real through the gateway: a
fix that changes the tool call is invisible to a replay of the recorded calls, kept when
validation re-runs the pipeline, and blame through re-runs names the stage at fault."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.core.forward import Prompts, RunContext
from engine.data.examples import Example
from engine.events import Proposal
from engine.gateway.pipeline import open_rerun, optimize_pipeline, trace_pipeline, with_rerun
from engine.gateway.runner import PipelineSpec
from engine.probes.blame import blame
from engine.runlog.reader import query
from engine.runlog.state import load_resume_state
from engine.traces.backprop import backprop
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import FIXED_PHRASE, agent_responder

ROOT = Path(__file__).resolve().parents[2]
AGENT = ROOT / "sample_graphs" / "agent_pipeline.py"
DATA = ROOT / "sample_graphs" / "data" / "agent_trips.jsonl"


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(responder=agent_responder) as fake:
        yield fake


def spec(function: str = "agent") -> PipelineSpec:
    return PipelineSpec(f"{AGENT}:{function}", None, str(ROOT))


def test_replay_cannot_see_the_fix_that_rerunning_keeps_and_blame_names(tmp_path, server):
    db = str(tmp_path / "runs.duckdb")
    traced = trace_pipeline(spec(), DATA, db, upstream=server.base_url, val=6)
    pipeline = traced.imported.pipeline
    assert list(pipeline.nodes) == ["weather", "packing"]
    assert pipeline.edges == [("weather", "packing")]
    assert (traced.imported.scored, traced.imported.failing, traced.errors) == (14, 12, [])
    questions = [json.loads(line)["question"] for line in DATA.read_text().splitlines()]
    assert [t.root_input for t in pipeline.traces] == questions  # the file's order
    run = traced.imported.run_id

    # replaying the recorded calls: the proposal is the fix, and validation cannot see it,
    # since the replayed tool loop reads the recorded weather of the departure city
    replayed = asyncio.run(backprop(db, run))
    weather = next(p for p in replayed.events.of(Proposal) if p.node_id == "weather")
    assert FIXED_PHRASE in weather.new_prompt
    assert not weather.accepted
    assert "scored 0.3333, not above 0.3333" in weather.reject_reason

    # blame on that step, through re-runs of the pipeline: the lookup is at fault
    report = asyncio.run(with_rerun(db, run, lambda rerun: blame(db, run, 1, rerun=rerun,
                                                                   adaptive=False)))
    assert report.as_json()["verdict"]["node"] == "weather"
    probes = query(db, "SELECT node_id, kind, after_score, error FROM probes "
                       "WHERE run_id = ? AND kind = 'edit'", [run])
    assert set(probes.node_id) == {"weather"}
    # the failing examples fixed and the passing validation ones kept: the pipeline re-ran
    assert len(probes) >= 8 and set(probes.after_score) == {1.0} and probes.error.isna().all()

    # optimize re-runs the pipeline to validate: the same fix is kept, validation 2/6 -> 6/6
    summary = optimize_pipeline(spec(), DATA, str(tmp_path / "optimized.duckdb"),
                                upstream=server.base_url, val=6, steps=1)
    assert summary["changed"] == ["weather"]
    assert FIXED_PHRASE in summary["prompts"]["weather"]
    assert summary["validation"] == {"before": pytest.approx(2 / 6), "after": 1.0, "n": 6}
    assert summary["steps"] == [{"step": 1, "status": "finished", "kept": ["weather"]}]


def test_an_example_the_rerun_fails_on_is_an_error_never_a_failing_score(tmp_path, server):
    """With the fix, the pipeline itself raises on one validation example (its weather
    service knows no Rome): that example is an example error with its exception line,
    left out of the validation score, which the other five decide (1.0, not 5/6)."""
    db = str(tmp_path / "runs.duckdb")
    closed = PipelineSpec(f"{ROOT / 'tests' / 'support' / 'pipeline_code.py'}:"
                          "agent_rome_closed", None, str(ROOT))
    summary = optimize_pipeline(closed, DATA, db, upstream=server.base_url, val=6, steps=1)
    assert summary["changed"] == ["weather"]
    assert summary["validation"]["before"] == pytest.approx(2 / 6)
    assert summary["validation"]["after"] == 1.0
    errors = query(db, "SELECT example_id, score, error FROM losses WHERE run_id = ? AND "
                       "step = 1 AND split = 'val' AND error IS NOT NULL", [summary["run_id"]])
    assert len(errors) == 1 and "no report for Rome" in errors.error[0]


def test_a_rerun_with_one_edit_sends_upstream_only_that_nodes_calls(tmp_path, server):
    db = str(tmp_path / "runs.duckdb")
    run = trace_pipeline(spec(), DATA, db, upstream=server.base_url, val=6).imported.run_id
    point = load_resume_state(db, run)
    val = [Example(e["example_id"], json.loads(e["fields"]), e["target"])
           for e in point.examples if e["split"] == "val"]

    async def upstream_calls(changes: dict[str, str]) -> tuple[int, list[str]]:
        async with open_rerun(db, run) as rerun:
            ctx = RunContext(rerun.graph, None, lambda event: None, run, 1, rerun=rerun)
            prompts = Prompts.initial(rerun.graph).updated(
                {node: (1, text) for node, text in changes.items()})
            before = len(server.requests)
            traces = await asyncio.gather(*(ctx.rerun.forward_example(ctx, prompts, e, "val")
                                            for e in val))
            return len(server.requests) - before, [t.output("packing") for t in traces]

    unchanged, answers = asyncio.run(upstream_calls({}))
    assert unchanged == 0  # every call answered from the gateway's cache
    edited = "Packing advice: answer yes if the report says rain, else no. One word."
    calls, again = asyncio.run(upstream_calls({"packing": edited}))
    # the packing calls only (one a distinct report): the lookups' requests did not change
    reports = {b["messages"][1]["content"] for b in server.requests[-calls:]}
    assert calls == len(reports) == len(val)
    assert again == answers
    bodies = server.requests[-calls:]
    assert all(b["messages"][0]["content"] == edited for b in bodies)


def test_a_streaming_pipeline_is_recorded_and_intervened_on(tmp_path, server):
    summary = optimize_pipeline(spec("agent_streaming"), DATA, str(tmp_path / "runs.duckdb"),
                                upstream=server.base_url, val=6, steps=1)
    assert summary["edges"] == [["weather", "packing"]]
    assert summary["changed"] == ["weather"]
    assert summary["validation"]["after"] == 1.0
    streamed = [b for b in server.requests if b.get("stream")]
    assert streamed and all(b["stream"] for b in streamed)


def test_optimize_on_the_command_line_prints_json(tmp_path, server):
    done = subprocess.run(
        [sys.executable, "-m", "engine", "optimize", "--pipeline", f"{AGENT}:agent",
         "--data", str(DATA), "--val", "6", "--steps", "1", "--base-url", server.base_url,
         "--db", str(tmp_path / "runs.duckdb"), "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["nodes"] == ["weather", "packing"]
    assert summary["validation"]["before"] < summary["validation"]["after"] == 1.0
    assert FIXED_PHRASE in summary["prompts"]["weather"]


def test_trace_refuses_a_bad_data_file_in_one_line(tmp_path, server):
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "x", "target": "yes"}\nnot json\n', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "engine", "trace", "--pipeline", f"{AGENT}:agent",
         "--data", str(data), "--base-url", server.base_url,
         "--db", str(tmp_path / "runs.duckdb")],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert "data.jsonl:2: expected a JSON object" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_the_python_api_optimizes_a_pipeline_function(tmp_path, server):
    import importlib.util

    import engine

    loaded = importlib.util.spec_from_file_location("agent_pipeline", AGENT)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    rows = [json.loads(line) for line in DATA.read_text().splitlines()]
    summary = engine.optimize(pipeline=module.agent, data=rows, val=6, steps=1,
                              base_url=server.base_url, db=str(tmp_path / "runs.duckdb"))
    assert summary["changed"] == ["weather"]
    assert summary["validation"]["after"] == 1.0
    with pytest.raises(ValueError, match="top level of a module file"):
        engine.optimize(pipeline=lambda question: question, data=rows,
                        base_url=server.base_url)
