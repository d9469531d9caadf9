"""Structured replies over the OpenAI-compatible path, against the fake server: the request's
response_format, constrained replies in the run log, and the fallback to text formats when
a server refuses response_format."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.events import StructuredFallback
from engine.llm.openai_backend import OpenAIBackend
from engine.prompts import structured as S
from engine.runs.execute import RunConfig, execute
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph
from tests.support.json_schema import assert_follows
from tests.support.runlog import rows


@pytest.fixture(autouse=True)
def _no_openai_env(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def run_against(server, tmp_path, **options):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    backend = OpenAIBackend(base_url=server.base_url, api_key="sk-test")
    settings = {"steps": 1, "train": 4, "val": 4, "test": 0, "max_retries": 0}
    settings.update(options)
    config = RunConfig(graph=str(graph), db=str(db), backend="openai", **settings)
    return asyncio.run(execute(config, forward_backend=backend)), db




def test_optimizer_requests_carry_the_roles_json_schema(tmp_path):
    with FakeOpenAIServer() as server:
        result, db = run_against(server, tmp_path)
        bodies = list(server.requests)
    assert result.status == "finished"
    optimizer = [b for b in bodies if "response_format" in b]
    forward = [b for b in bodies if "response_format" not in b]
    assert optimizer and forward  # forward calls stay text
    names = {b["response_format"]["json_schema"]["name"] for b in optimizer}
    assert names == {"backward_joint", "update"}
    for body in optimizer:
        fmt = body["response_format"]
        assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True
        schema = fmt["json_schema"]["schema"]
        assert schema["additionalProperties"] is False and schema["required"][0] == "reasoning"
        assert "maxLength" not in json.dumps(schema)  # strict mode rejects length keywords
        assert S.JSON_ASK in body["messages"][-1]["content"]
    calls = rows(db, "SELECT purpose, constrained, response FROM llm_calls")
    for purpose, constrained, response in calls:
        assert constrained is (purpose != "forward")
        if purpose != "forward":
            assert S.decode(response) is not None
    assert rows(db, "SELECT count(*) FROM gradients WHERE kind = 'gradient' "
                    "AND parse_error IS NOT NULL") == [(0,)]
    assert rows(db, "SELECT count(*), count(parse_error) FROM updates")[0][1] == 0


def test_the_fake_server_replies_with_schema_valid_json():
    from tests.support.fake_openai import default_responder

    schema = S.schema_for("backward_joint", ["hint_a", "hint_b"])
    body = {"messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "b",
                                                                      "schema": schema}}}
    value = assert_follows(schema, default_responder(body))
    assert set(value) == {"reasoning", "hint_a", "hint_b", "asks_change_hint_a",
                          "asks_change_hint_b"}


def test_a_server_that_refuses_response_format_falls_back_to_text_once(tmp_path):
    with FakeOpenAIServer(reject_response_format=True) as server:
        result, db = run_against(server, tmp_path)
        bodies = list(server.requests)
    assert result.status == "finished"
    refused = [b for b in bodies if "response_format" in b]
    # only requests already in flight when the first refusal came back carry a schema
    assert 1 <= len(refused) <= 2  # two failing examples are back-propagated at once
    for body in refused:  # each is answered by the same request as text
        assert any("response_format" not in b and b["messages"] == body["messages"]
                   for b in bodies)
    first_text = max(bodies.index(b) for b in refused) + 1
    fallbacks = result.events.of(StructuredFallback)
    assert len(fallbacks) == 1 and "response_format" in fallbacks[0].message
    step = fallbacks[0].step
    assert rows(db, "SELECT step, value FROM metrics WHERE key = 'structured_fallback'") == [
        (step, 1.0)]
    later = bodies[first_text + len(refused):]
    optimizer_later = [b for b in later if "<gradient input=" in b["messages"][-1]["content"]
                       or "<prompt>" in b["messages"][-1]["content"]]
    assert optimizer_later and all(S.JSON_ASK not in b["messages"][-1]["content"]
                                   for b in optimizer_later)
    assert all(c == (False,) for c in rows(db, "SELECT constrained FROM llm_calls"))


def test_structured_on_makes_a_refusal_an_error(tmp_path):
    with FakeOpenAIServer(reject_response_format=True) as server:
        with pytest.raises(Exception, match="refused response_format") as raised:
            run_against(server, tmp_path, structured="on")
        assert all("response_format" in b for b in server.requests if "<output>" not in
                   b["messages"][-1]["content"])  # no text fallback was sent
    assert "--structured on" in str(raised.value)
    [(status, error)] = rows(tmp_path / "runs.duckdb", "SELECT status, error FROM runs")
    assert status == "failed" and "--structured on" in error


def test_structured_off_never_sends_response_format(tmp_path):
    with FakeOpenAIServer() as server:
        result, _ = run_against(server, tmp_path, structured="off")
        bodies = list(server.requests)
    assert result.status == "finished" and bodies
    assert all("response_format" not in b for b in bodies)
