"""Flows the content cannot show, found by asking the pipeline itself (engine/gateway/
flows.py): a forced tool call's arguments formatted into the next prompt, and a LangChain
chain whose one-word values also stand in the input or are too short to be evidence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.gateway.flows import variant_reply
from engine.gateway.pipeline import trace_pipeline
from engine.gateway.runner import PipelineSpec
from engine.traces import TraceError
from engine.traces.collect import collected
from engine.traces.importer import import_traces
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.flow_pipelines import responder

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "tests" / "support" / "flow_pipelines.py"


@pytest.fixture(scope="module")
def server():
    with FakeOpenAIServer(responder=responder) as fake:
        yield fake


def data(tmp_path: Path, rows: list[dict]) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_forced_tool_calls_formatted_arguments_are_a_flow(tmp_path, server):
    rows = [{"text": "Please send 3 apples.", "target": "1.50"},
            {"text": "I would like 2 pears.", "target": "1.50"},
            {"text": "4 plums, thanks.", "target": "1.00"}]
    db = tmp_path / "runs.duckdb"
    traced = trace_pipeline(PipelineSpec(f"{MODULE}:order", None, str(ROOT)),
                            data(tmp_path, rows), db, upstream=server.base_url)
    result = traced.imported.as_json()
    assert len(result["nodes"]) == 2
    first, second = (n["id"] for n in result["nodes"])
    assert result["edges"] == [[first, second]]
    assert result["edge_sources"] == {f"{first}->{second}": "intervention"}
    assert (result["scored"], result["failing"]) == (3, 0)
    # the same traces read by content alone: refused, as an import of a file would be
    with pytest.raises(TraceError, match="feed no later call"):
        import_traces("again", db, spans=collected(db, trace_ids=[
            t.trace_id for t in traced.imported.pipeline.traces]))


def test_a_one_word_city_that_stands_in_the_input_keeps_its_edges(tmp_path, server):
    rows = [{"text": "We spent a week in Lisbon last spring.", "target": "euro"},
            {"text": "Tokyo was loud and bright.", "target": "yen"},
            {"text": "The flight to Lima took all day.", "target": "sol"}]
    traced = trace_pipeline(PipelineSpec(f"{MODULE}:currency", None, str(ROOT)),
                            data(tmp_path, rows), tmp_path / "runs.duckdb",
                            upstream=server.base_url)
    result = traced.imported.as_json()
    ids = [n["id"] for n in result["nodes"]]
    assert len(ids) == 3
    city, country, money = ids
    assert sorted(map(tuple, result["edges"])) == sorted(
        [(city, country), (city, money), (country, money)])
    # the city also stands in the input: only the pipeline could show where it goes (the
    # country, "Portugal" on the first example, is long enough to be seen by content)
    sources = result["edge_sources"]
    assert sources[f"{city}->{country}"] == sources[f"{city}->{money}"] == "intervention"
    assert result["ambiguous"] == []  # what the content left open, the pipeline answered
    assert result["failing"] == 0


@pytest.mark.parametrize("reply, changed", [
    ("Lisbon", "Lisbon Zq"), ("7", "14"), ("2.5", "10.0"),
    ('<tool_call name="record_order">{"item": "apple", "quantity": 2}</tool_call>',
     '<tool_call name="record_order">{"item": "apple Zq", "quantity": 9}</tool_call>'),
    ("[[ ## mood ## ]]\ncalm\n\n[[ ## completed ## ]]",
     "[[ ## mood ## ]]\ncalm Zq\n\n[[ ## completed ## ]]")])
def test_a_variant_reply_keeps_its_form_and_changes_its_value(reply, changed):
    assert variant_reply(reply) == changed


def test_the_graph_page_says_how_each_flow_was_found(tmp_path, server, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.support.dashboard_log import like_a_live_server

    rows = [{"text": "Please send 3 apples.", "target": "1.50"}]
    db = tmp_path / "runs.duckdb"
    traced = trace_pipeline(PipelineSpec(f"{MODULE}:order", None, str(ROOT)),
                            data(tmp_path, rows), db, upstream=server.base_url)
    first, second = traced.imported.pipeline.nodes
    monkeypatch.setenv("SEMBACK_DB", str(db))
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    with like_a_live_server():
        at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=60)
        at.query_params.update({"run": traced.imported.run_id, "step": "0"})
        at.run()
        at.switch_page("screens/graph.py").run()
    assert not at.exception
    captions = "\n".join(c.value for c in at.caption).replace("\\", "")
    assert f"Flows found by intervention: {first} → {second}" in captions
