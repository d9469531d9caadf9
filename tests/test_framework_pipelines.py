"""The framework example pipelines (sample_graphs/dspy_pipeline.py, langchain_pipeline.py,
openai_tools_pipeline.py) run against the scripted server: each writes one trace a request,
its OpenInference spans under one root, and its planted fault bites until its prompt is
repaired."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import (
    dspy_responder,
    langchain_responder,
    openai_tools_responder,
)

SAMPLES = Path(__file__).resolve().parent.parent / "sample_graphs"
FIXED = {
    "dspy": {"note": "The sentence says how many. Write that number."},
    "langchain": {"country": "Country: name the country this city is in. Reply with one "
                             "word."},
    "openai_tools": {"order": "You are the order assistant of {shop}. The customer today is "
                              "{customer}. Record the order with record_order: the item and "
                              "how many the customer asks you to send."},
}


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"sample_{name}", SAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def attributes(span: dict) -> dict:
    return {a["key"]: next(iter(a["value"].values())) for a in span.get("attributes", [])}


def read_spans(path: Path) -> list[dict]:
    return [span for line in path.read_text(encoding="utf-8").splitlines()
            for resource in json.loads(line)["resourceSpans"]
            for scope in resource["scopeSpans"] for span in scope["spans"]]


def traces(spans: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for span in spans:
        out.setdefault(span["traceId"], []).append(span)
    return out


def check_traces(out: Path, targets: Path, rows: int, llm_calls: int) -> dict[str, list[dict]]:
    """One trace a row, each one root (whose input.value the targets file keys on) over
    `llm_calls` LLM spans, every span's parent in its trace."""
    by_trace = traces(read_spans(out))
    assert len(by_trace) == rows
    wanted = [json.loads(line)["input"] for line in targets.read_text().splitlines()]
    inputs = []
    for spans in by_trace.values():
        ids = {s["spanId"] for s in spans}
        roots = [s for s in spans if not s.get("parentSpanId")]
        assert len(roots) == 1
        assert all(s["parentSpanId"] in ids for s in spans if s.get("parentSpanId"))
        kinds = [attributes(s).get("openinference.span.kind") for s in spans]
        assert kinds.count("LLM") == llm_calls
        inputs.append(attributes(roots[0])["input.value"])
    assert sorted(inputs) == sorted(wanted)
    return by_trace


def targets_of(path: Path) -> list[str]:
    return [json.loads(line)["target"] for line in path.read_text().splitlines()]


@pytest.fixture
def local_only(monkeypatch):
    """Every connection and name lookup the test makes, refused unless it is 127.0.0.1,
    and none but such made at all."""
    seen: list[object] = []
    connect, getaddrinfo = socket.socket.connect, socket.getaddrinfo

    def guarded_connect(self, address):
        seen.append(address)
        if isinstance(address, tuple) and address[0] not in ("127.0.0.1", "localhost"):
            raise OSError(f"no network in this test: {address}")
        return connect(self, address)

    def guarded_getaddrinfo(host, *args, **kwargs):
        seen.append(host)
        if host not in ("127.0.0.1", "localhost", None):
            raise OSError(f"no network in this test: {host}")
        return getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    yield seen
    # nothing but the scripted server was contacted (a refused attempt is recorded too)
    assert seen and all((a[0] if isinstance(a, tuple) else a) in ("127.0.0.1", "localhost", None)
                        for a in seen), seen


def test_dspy_pipeline_traces_three_predictors_and_the_mood_fault_bites(tmp_path,
                                                                        local_only):
    pipeline = load("dspy_pipeline")
    out, targets = tmp_path / "traces.jsonl", tmp_path / "targets.jsonl"
    with FakeOpenAIServer(responder=dspy_responder) as server:
        answers = pipeline.run(server.base_url, "fake-qwen", out, 4, targets)
        assert len(server.requests) == 12
        # the note predictor gives the sentence's mood, not its number: the answer
        # predictor, which never reads the sentence, has no number to copy
        assert answers == ["none", "none", "none", "none"]
        assert targets_of(targets) == ["7", "12", "5", "9"]
        by_trace = check_traces(out, targets, 4, 3)
        names = {s["name"] for s in next(iter(by_trace.values()))}
        assert {"CountPipeline.forward", "Predict(NoteSentence).forward",
                "Predict(NameThing).forward", "ChainOfThought.forward",
                "LM.__call__"} <= names
        fixed = pipeline.run(server.base_url, "fake-qwen", tmp_path / "fixed.jsonl", 4,
                             tmp_path / "fixed_targets.jsonl", FIXED["dspy"])
        assert fixed == targets_of(targets)
        assert "Predict(NoteSentence).forward" in {s["name"] for s in
                                                   read_spans(tmp_path / "fixed.jsonl")}


def test_langchain_pipeline_traces_three_steps_and_the_country_fault_bites(tmp_path,
                                                                           local_only):
    pipeline = load("langchain_pipeline")
    out, targets = tmp_path / "traces.jsonl", tmp_path / "targets.jsonl"
    with FakeOpenAIServer(responder=langchain_responder) as server:
        answers = pipeline.run(server.base_url, "fake-qwen", out, 6, targets)
        # the country step names the language: its continent is right only in Europe/Asia
        assert answers == ["Europe", "Europe", "Europe", "Europe", "Asia", "Europe"]
        assert targets_of(targets) == ["America", "Europe", "America", "Africa", "Asia",
                                       "Oceania"]
        by_trace = check_traces(out, targets, 6, 3)
        spans = next(iter(by_trace.values()))
        root = next(s for s in spans if not s.get("parentSpanId"))
        steps = [s["name"] for s in spans if s.get("parentSpanId") == root["spanId"]]
        assert root["name"] == "pipeline" and sorted(steps) == ["city", "continent", "country"]
        fixed = pipeline.run(server.base_url, "fake-qwen", tmp_path / "fixed.jsonl", 6,
                             tmp_path / "fixed_targets.jsonl", FIXED["langchain"])
        assert fixed == targets_of(targets)


def test_openai_tools_pipeline_traces_a_template_a_forced_call_and_a_tool_loop(tmp_path,
                                                                               local_only):
    pipeline = load("openai_tools_pipeline")
    out, targets = tmp_path / "traces.jsonl", tmp_path / "targets.jsonl"
    with FakeOpenAIServer(responder=openai_tools_responder) as server:
        answers = pipeline.run(server.base_url, "fake-qwen", out, 4, targets)
        # record_order takes how many the customer has at home as the quantity
        assert answers == ["5.00", "6.00", "34.00", "12.75"]
        assert targets_of(targets) == ["12.50", "18.00", "17.00", "25.50"]
        forced = server.requests[0]
        assert forced["tool_choice"]["function"]["name"] == "record_order"
        by_trace = check_traces(out, targets, 4, 3)
        spans = sorted(next(iter(by_trace.values())), key=lambda s: int(s["startTimeUnixNano"]))
        attrs = [attributes(s) for s in spans]
        # the pipeline, then each stage under a span of its own name over its calls
        assert [(s["name"], a["openinference.span.kind"]) for s, a in zip(spans, attrs)] == [
            ("pipeline", "CHAIN"), ("order", "CHAIN"), ("ChatCompletion", "LLM"),
            ("cashier", "CHAIN"), ("ChatCompletion", "LLM"), ("lookup_price", "TOOL"),
            ("ChatCompletion", "LLM")]
        assert attrs[2]["llm.prompt_template.template"] == pipeline.PROMPTS["order"]
        assert json.loads(attrs[2]["llm.prompt_template.variables"]) == {
            "shop": "Green Basket", "customer": "Mrs. Alvarez"}
        assert attrs[5]["tool.name"] == "lookup_price" and attrs[5]["output.value"] == "2.50"
        assert attrs[6]["llm.input_messages.3.message.role"] == "tool"
        fixed = pipeline.run(server.base_url, "fake-qwen", tmp_path / "fixed.jsonl", 4,
                             tmp_path / "fixed_targets.jsonl", FIXED["openai_tools"])
        assert fixed == targets_of(targets)


def test_without_out_the_spans_go_to_the_otlp_endpoint(tmp_path, monkeypatch):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    received: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            received.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{httpd.server_port}")
    try:
        pipeline = load("langchain_pipeline")
        with FakeOpenAIServer(responder=langchain_responder) as server:
            pipeline.run(server.base_url, "fake-qwen", None, 2, tmp_path / "targets.jsonl")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert received and all(path == "/v1/traces" for path, _ in received)
    names = [span.name for _, body in received
             for resource in ExportTraceServiceRequest.FromString(body).resource_spans
             for scope in resource.scope_spans for span in scope.spans]
    assert names.count("pipeline") == 2 and names.count("ChatOpenAI") == 6
