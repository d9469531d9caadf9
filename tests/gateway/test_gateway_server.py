"""The gateway as an OpenAI-compatible server, driven by the `openai` SDK: what it forwards,
records and caches, what it refuses, and what it never writes down."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import duckdb
import openai
import pytest

from engine.gateway.calls import template_of
from engine.gateway.interventions import Candidate, NodeRule
from engine.gateway.runner import PipelineSpec, Runner
from engine.gateway.server import PLACEHOLDER_KEY, Gateway, session_ids
from engine.runlog.collected import collected_spans
from engine.traces.collect import collected
from engine.traces.importer import import_traces
from tests.support.fake_openai import FakeOpenAIServer


def client(gateway: Gateway, prefix: str = "", key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}{prefix}/v1", api_key=key, max_retries=0)


def ask(c: openai.OpenAI, system: str, user: str, **extra) -> str:
    reply = c.chat.completions.create(model="fake", messages=[
        {"role": "system", "content": system}, {"role": "user", "content": user}], **extra)
    return reply.choices[0].message.content


def echo(body: dict) -> str:
    """A reply that depends on the whole request."""
    return "saw: " + " / ".join(m.get("content") or "" for m in body["messages"])


@pytest.fixture
def upstream():
    with FakeOpenAIServer(responder=echo) as fake:
        yield fake


def test_forwards_records_an_openinference_span_and_answers_again_from_the_cache(
        tmp_path, upstream):
    db = tmp_path / "runs.duckdb"
    with Gateway(db, upstream.base_url, port=0) as gateway:
        c = client(gateway, "/s/example-1")
        first = ask(c, "Summarize the text.", "The cat sat.")
        again = ask(c, "Summarize the text.", "The cat sat.")
        assert first == again == "saw: Summarize the text. / The cat sat."
        assert len(upstream.requests) == 1  # the second from the cache
        assert (gateway.counts.calls, gateway.counts.cache_hits) == (2, 1)
        assert gateway.sessions == {}  # a client's own session is recorded, never held
        assert c.models.list().data[0].id == "fake"
    rows = collected_spans(db)
    assert len(rows) == 2
    attributes = json.loads(rows[0][6])
    assert attributes["openinference.span.kind"] == "LLM"
    assert attributes["llm.input_messages.0.message.role"] == "system"
    assert attributes["llm.input_messages.1.message.content"] == "The cat sat."
    assert attributes["llm.output_messages.0.message.content"] == first
    assert attributes["semback.gateway.session"] == "example-1"
    assert rows[0][0] == rows[1][0]  # one session, one trace
    # what `import-traces --collected` reads: a call site, its prompt, its reply
    run = import_traces("collected", db, spans=collected(db))
    node = next(iter(run.pipeline.nodes.values()))
    assert node.prompt == "Summarize the text."


def test_one_gateway_takes_otlp_spans_beside_the_calls_it_records(tmp_path, upstream):
    import httpx

    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "pipeline",
            "startTimeUnixNano": "1", "endTimeUnixNano": "2", "attributes": [
                {"key": "openinference.span.kind", "value": {"stringValue": "CHAIN"}}]}
    body = {"resourceSpans": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": "mine"}}]},
        "scopeSpans": [{"spans": [span]}]}]}
    db = tmp_path / "runs.duckdb"
    with Gateway(db, upstream.base_url, port=0) as gateway:
        sent = httpx.post(f"{gateway.url}/v1/traces", json=body)
        assert sent.status_code == 200 and gateway.intake.counts.new == 1
        ask(client(gateway), "Sys.", "Hi.")
    assert sorted(r[7] for r in collected_spans(db)) == ["mine", "semback-gateway"]


def test_a_traceparent_header_groups_calls_by_the_clients_trace(tmp_path, upstream):
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with Gateway(tmp_path / "runs.duckdb", upstream.base_url, port=0) as gateway:
        ask(client(gateway), "Sys.", "Hi.",
            extra_headers={"traceparent": f"00-{trace_id}-{parent}-01",
                           "X-Semback-Node": "greeter"})
    (row,) = collected_spans(tmp_path / "runs.duckdb")
    assert (row[0], row[2], row[3]) == (trace_id, parent, "greeter")
    assert json.loads(row[6])["semback.gateway.node"] == "greeter"


def test_a_restarted_gateway_answers_what_it_answered_before_from_its_spans(tmp_path,
                                                                            upstream):
    db = tmp_path / "runs.duckdb"
    with Gateway(db, upstream.base_url, port=0) as gateway:
        before = ask(client(gateway), "Sys.", "Once.")
    with Gateway(db, upstream.base_url, port=0) as gateway:
        after = ask(client(gateway), "Sys.", "Once.")
        assert gateway.counts.upstream == 0
    assert before == after and len(upstream.requests) == 1
    assert len(collected_spans(db)) == 2  # both answered calls recorded


def test_streams_are_relayed_recorded_and_served_again_from_the_cache(tmp_path, upstream):
    db = tmp_path / "runs.duckdb"
    with Gateway(db, upstream.base_url, port=0) as gateway:
        c = client(gateway, "/s/streamed")
        texts, pieces = [], []
        for _ in range(2):
            chunks = list(c.chat.completions.create(model="fake", stream=True, messages=[
                {"role": "system", "content": "Stream it."},
                {"role": "user", "content": "A long enough message to come in pieces."}]))
            pieces.append(len([ch for ch in chunks if ch.choices
                               and ch.choices[0].delta.content]))
            texts.append("".join(ch.choices[0].delta.content or "" for ch in chunks
                                 if ch.choices))
        assert texts[0] == texts[1] == \
            "saw: Stream it. / A long enough message to come in pieces."
        assert gateway.counts.upstream == 1
        assert pieces[0] > 3  # relayed as the upstream streamed it; then from the cache
    first = json.loads(collected_spans(db)[0][6])
    assert first["llm.output_messages.0.message.content"] == texts[0]


def test_a_candidate_swaps_a_templated_prompt_and_patches_a_reply(tmp_path, upstream):
    db = tmp_path / "runs.duckdb"
    rules = [NodeRule("order", "Shop {shop}. Take the order.", {"variables": {}}),
             NodeRule("price", "Price the order.")]
    with Gateway(db, upstream.base_url, port=0) as gateway:
        gateway.candidates["c1"] = Candidate(
            "c1", rules, {"order": "Shop {shop}. Take the order, as many as asked."},
            {"price": "12.50"})
        c = client(gateway, "/c/c1/s/one")
        assert ask(c, "Shop Corner. Take the order.", "2 apples") == \
            "saw: Shop Corner. Take the order, as many as asked. / 2 apples"
        assert ask(c, "Price the order.", "2 apples") == "12.50"  # never sent upstream
        assert ask(c, "Something else.", "x") == "saw: Something else. / x"
        assert len(upstream.requests) == 2
        with pytest.raises(openai.NotFoundError, match="no candidate named 'c2'"):
            ask(client(gateway, "/c/c2"), "Sys.", "x")
    assert collected_spans(db) == []  # a candidate's calls are no pipeline's own traffic
    spans = [json.loads(r[6]) for r in collected_spans(db, trace_ids=[session_ids("one")[0]])]
    assert [s.get("semback.gateway.node") for s in spans] == ["order", "price", None]
    assert spans[1]["semback.gateway.patched"] is True


def test_a_patched_reply_for_a_tool_calling_node_is_a_tool_call(tmp_path, upstream):
    with Gateway(tmp_path / "runs.duckdb", upstream.base_url, port=0) as gateway:
        gateway.candidates["c"] = Candidate(
            "c", [NodeRule("order", "Record it.")],
            replies={"order": '<tool_call name="record_order">{"item": "tea", '
                              '"quantity": 5}</tool_call>'})
        reply = client(gateway, "/c/c").chat.completions.create(model="fake", messages=[
            {"role": "system", "content": "Record it."}, {"role": "user", "content": "tea"}])
    call = reply.choices[0].message.tool_calls[0]
    assert (reply.choices[0].finish_reason, call.function.name) == ("tool_calls",
                                                                   "record_order")
    assert json.loads(call.function.arguments) == {"item": "tea", "quantity": 5}


def test_dspy_instructions_are_swapped_inside_the_adapters_text():
    rule = NodeRule("note", "Describe the mood.\nIn one word.",
                    {"before": "Your input fields are...", "indent": "        "})
    system = ("Your input fields are...\nIn adhering to this structure, your objective is: "
              "\n        Describe the mood.\n        In one word.")
    assert rule.match(system) == {}
    assert rule.render(system, "Copy the number.", {}).endswith(
        "your objective is: \n        Copy the number.")


def test_a_system_message_filled_from_the_examples_input_is_read_as_its_template():
    fields = {"shop": "Green Basket", "customer": "Mr. Li", "text": "Send 5 apples.",
              "n": 5, "flag": True}
    assert template_of("You serve Mr. Li at Green Basket. Mr. Li is kind.", fields) == (
        "You serve {customer} at {shop}. {customer} is kind.",
        {"shop": "Green Basket", "customer": "Mr. Li"})
    # a value inside a longer word, a short value, a bool: no variable
    assert template_of("The Green Basketry serves 5 kinds.", fields) is None
    # braces already there would read as variables; a message of values only has no prompt
    assert template_of("Answer as JSON {shop} for Green Basket.", fields) is None
    assert template_of("Green Basket", fields) is None


def test_unsupported_paths_bad_bodies_and_a_down_upstream_get_openai_errors(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    db = tmp_path / "runs.duckdb"
    with Gateway(db, f"http://127.0.0.1:{dead}/v1", port=0) as gateway:
        c = client(gateway)
        with pytest.raises(openai.NotFoundError) as found:
            c.embeddings.create(model="fake", input="x")
        assert found.value.body["code"] == "unsupported_endpoint"
        assert "POST /v1/chat/completions" in found.value.body["message"]
        with pytest.raises(openai.APIStatusError) as down:
            ask(c, "Sys.", "x")
        assert down.value.status_code == 502
        assert f"127.0.0.1:{dead}/v1 is not reachable" in down.value.body["message"]
        import httpx

        bad = httpx.post(f"{gateway.url}/v1/chat/completions", content=b"{not json")
        assert bad.status_code == 400 and "not JSON" in bad.json()["error"]["message"]
    assert collected_spans(db) == []  # nothing answered, nothing recorded


def test_an_upstream_error_comes_back_with_its_status(tmp_path):
    with FakeOpenAIServer(faults=[("status", 503)]) as fake, \
            Gateway(tmp_path / "runs.duckdb", fake.base_url, port=0) as gateway:
        with pytest.raises(openai.APIStatusError) as failed:
            ask(client(gateway), "Sys.", "x")
    assert failed.value.status_code == 503
    assert "scripted fault 503" in failed.value.body["message"]


def test_no_key_reaches_the_run_log(tmp_path, upstream, monkeypatch):
    db = tmp_path / "runs.duckdb"
    with Gateway(db, upstream.base_url, port=0, api_key="sk-gateway-secret-1") as gateway:
        ask(client(gateway, key="sk-client-secret-2"), "Sys.", "mine")
        ask(client(gateway, key=PLACEHOLDER_KEY), "Sys.", "yours")  # a worker with no key
    assert upstream.authorizations[0] == "Bearer sk-client-secret-2"  # forwarded
    assert upstream.authorizations[1] == "Bearer sk-gateway-secret-1"  # the gateway's own
    with duckdb.connect(str(db), read_only=True) as con:
        tables = [t for (t,) in con.execute("SHOW TABLES").fetchall()]
        text = "".join(str(con.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)
    assert "saw: Sys. / mine" in text
    assert "secret" not in text
    assert b"secret" not in Path(db).read_bytes()


def _pipeline_module(folder: Path) -> str:
    (folder / "faulty.py").write_text(
        "import time\n"
        "def boom(question):\n    raise RuntimeError('no luck with ' + question)\n"
        "def slow(question):\n    time.sleep(30)\n"
        "def fine(question):\n    return {'answer': question.upper()}\n", encoding="utf-8")
    return str(folder / "faulty.py")


@pytest.mark.parametrize("function, error", [
    ("boom", "RuntimeError: no luck with x (at faulty.py:3)"),
    ("slow", "the pipeline timed out after 2 s"),
    ("fine", None)])
def test_a_pipeline_that_raises_or_runs_over_is_an_example_error(tmp_path, upstream,
                                                                  function, error):
    module = _pipeline_module(tmp_path)

    async def run():
        with Gateway(tmp_path / "runs.duckdb", upstream.base_url, port=0) as gateway:
            async with Runner(gateway, PipelineSpec(f"{module}:{function}", None,
                                                    str(tmp_path)), timeout=2) as runner:
                first = await runner.run({"question": "x"}, "s1")
                second = await runner.run({"question": "y"}, "s2")  # a worker still serves
                return first, second

    first, second = asyncio.run(run())
    assert first.error == error
    if error is None:
        assert (first.output, second.output) == ('{"answer": "X"}', '{"answer": "Y"}')
    else:
        assert first.output is None and second.error is not None


def test_a_command_pipeline_gets_its_session_url_and_one_example_on_stdin(tmp_path,
                                                                           upstream):
    script = tmp_path / "pipe.py"
    script.write_text(
        "import json, os, sys, openai\n"
        "example = json.load(sys.stdin)\n"
        "c = openai.OpenAI()\n"
        "r = c.chat.completions.create(model='fake', messages=[{'role': 'system', "
        "'content': 'Shout.'}, {'role': 'user', 'content': example['question']}])\n"
        "print(r.choices[0].message.content)\n", encoding="utf-8")
    failing = tmp_path / "fails.py"
    failing.write_text("import sys\nsys.exit('bad input, sorry')\n", encoding="utf-8")
    import sys

    async def run(command: str):
        with Gateway(tmp_path / "runs.duckdb", upstream.base_url, port=0) as gateway:
            async with Runner(gateway, PipelineSpec(None, command, str(tmp_path))) as r:
                return await r.run({"question": "quiet"}, "cmd-1"), dict(gateway.sessions)

    outcome, sessions = asyncio.run(run(f"{sys.executable} {script}"))
    assert outcome.output == "saw: Shout. / quiet"
    assert [s.node for s in sessions["cmd-1"]] == [None]
    outcome, _ = asyncio.run(run(f"{sys.executable} {failing}"))
    assert outcome.error == "the command exited with status 1: bad input, sorry"


def test_a_gateway_killed_after_answering_has_lost_no_call(tmp_path, upstream):
    """Killed with SIGKILL right after its replies (no chance to write its spans): the
    next gateway on the run log writes them from the journal and answers the same
    requests from them, without asking the upstream again."""
    import signal
    import subprocess
    import sys

    db = tmp_path / "runs.duckdb"
    child = subprocess.Popen([sys.executable, "-m", "engine", "gateway", "--db", str(db),
                              "--upstream", upstream.base_url, "--port", "0"],
                             stdout=subprocess.PIPE, text=True)
    try:
        url = child.stdout.readline().split()[2]  # "gateway on URL/v1 ..."
        # this process holds the run log, so the gateway can only journal its calls
        from engine.runlog.schema import connect

        with connect(db):
            killed = openai.OpenAI(base_url=url, api_key="sk-test", max_retries=0)
            answers = [ask(killed, "Sys.", f"call {i}") for i in range(5)]
            child.send_signal(signal.SIGKILL)
            child.wait(10)
        assert Path(f"{db}.gateway-journal").read_text().count("\n") == 5
    finally:
        child.kill()
    assert len(upstream.requests) == 5
    with Gateway(db, upstream.base_url, port=0) as gateway:
        again = [ask(client(gateway), "Sys.", f"call {i}") for i in range(5)]
        assert gateway.counts.upstream == 0  # every one from the spans the journal kept
    assert again == answers
    assert len(collected_spans(db)) == 10  # five answered before the kill, five after


def test_trace_says_so_when_the_pipeline_calls_no_model_through_it(tmp_path, upstream):
    from engine.gateway.pipeline import trace_pipeline
    from engine.traces import TraceError

    module = _pipeline_module(tmp_path)
    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "x", "target": "X"}\n', encoding="utf-8")
    with pytest.raises(TraceError, match="made no model call through the gateway"):
        trace_pipeline(PipelineSpec(f"{module}:fine", None, str(tmp_path)), data,
                       tmp_path / "runs.duckdb", upstream=upstream.base_url)


def test_targets_kept_apart_from_the_data_are_matched_by_their_fields(tmp_path):
    from engine.gateway.pipeline import read_data
    from engine.traces import TraceError

    data = tmp_path / "data.jsonl"
    data.write_text('{"question": "a"}\n{"question": "b", "target": "old"}\n',
                    encoding="utf-8")
    targets = tmp_path / "targets.jsonl"
    targets.write_text('{"question": "b", "target": "B"}\n{"question": "a", "target": "A"}\n',
                       encoding="utf-8")
    assert read_data(data, targets) == [(1, {"question": "a"}, "A"),
                                        (2, {"question": "b"}, "B")]
    targets.write_text('{"question": "z", "target": "Z"}\n', encoding="utf-8")
    with pytest.raises(TraceError, match="no line's fields match"):
        read_data(data, targets)
