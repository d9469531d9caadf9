"""What a re-run may do that the recorded run did not, and what the Runs page says of a
run that re-runs its pipeline."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

from engine.core.forward import Prompts, RunContext
from engine.data.examples import Example
from engine.gateway.pipeline import open_rerun, trace_pipeline
from engine.gateway.runner import PipelineSpec
from engine.runlog.reader import run_record
from engine.runlog.state import load_resume_state
from tests.support.dashboard_log import like_a_live_server
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.flow_pipelines import TRIAGE_PROMPT, branching_responder

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "tests" / "support" / "flow_pipelines.py"
APP = ROOT / "dashboard" / "app.py"


def test_a_branch_the_recorded_runs_never_took_is_noted_never_a_crash(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"text": t, "target": "yes"}) + "\n"
                            for t in ("Is the sky blue?", "Is water wet?")), encoding="utf-8")
    db = str(tmp_path / "runs.duckdb")
    with FakeOpenAIServer(responder=branching_responder) as server:
        traced = trace_pipeline(PipelineSpec(f"{MODULE}:branching", None, str(ROOT)), data,
                                db, upstream=server.base_url)
        run = traced.imported.run_id
        assert len(traced.imported.pipeline.nodes) == 2  # triage and answer: no expert
        point = load_resume_state(db, run)
        example = next(Example(e["example_id"], json.loads(e["fields"]), e["target"])
                       for e in point.examples)

        async def rerun_with_hard_triage() -> tuple[str, list[str]]:
            async with open_rerun(db, run) as rerun:
                triage = next(n.id for n in rerun.graph.nodes if n.prompt == TRIAGE_PROMPT)
                prompts = Prompts.initial(rerun.graph).updated(
                    {triage: (1, TRIAGE_PROMPT + " Here it is always hard.")})
                ctx = RunContext(rerun.graph, None, lambda event: None, run, 1,
                                 rerun=rerun)
                trace = await rerun.forward_example(ctx, prompts, example, "train")
                return trace.output(triage), list(rerun.notes)

        triage_output, notes = asyncio.run(rerun_with_hard_triage())
    assert triage_output == "hard"
    assert len(notes) == 1 and "matches no node of the run" in notes[0]
    assert "Expert desk" in notes[0]
    assert notes[0] in (run_record(db, run)["notes"] or "")  # kept in the run's notes


def test_the_runs_page_says_a_run_re_runs_its_pipeline(tmp_path, monkeypatch):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "Is it?", "target": "yes"}) + "\n", encoding="utf-8")
    db = tmp_path / "runs.duckdb"
    with FakeOpenAIServer(responder=branching_responder) as server:
        run = trace_pipeline(PipelineSpec(f"{MODULE}:branching", None, str(ROOT)), data, db,
                             upstream=server.base_url).imported.run_id
    monkeypatch.setenv("SEMBACK_DB", str(db))
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update({"run": run})
        at.run()
    assert not at.exception
    captions = "\n".join(c.value for c in at.caption).replace("\\", "")  # markdown escapes
    assert f"re-runs its pipeline ({MODULE}:branching) through the gateway" in captions
