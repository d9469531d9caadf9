"""`collect`, the live OTLP/HTTP receiver (engine/traces/collect.py), fed by the standard
`opentelemetry-exporter-otlp-proto-http` exporter configured only through
OTEL_EXPORTER_OTLP_ENDPOINT, and `import-traces --collected`, which must make the same run
of what arrived as of the same spans in a file."""

from __future__ import annotations

import gzip
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from pathlib import Path

import duckdb
import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan

from engine.cli.commands import main
from engine.runlog.collected import SpanStore, collected_counts, collected_spans
from engine.runlog.writer import open_for_writing
from engine.traces import collect as receiver_module
from engine.traces.collect import Receiver, collected, since_time
from engine.traces.otlp import spans_of
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.traced_pipeline import load_pipeline, responder

REPO = Path(__file__).resolve().parents[1]
http_exporter = pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    reason="opentelemetry-exporter-otlp-proto-http is not installed (requirements.txt)")


# --- helpers ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_collect(db: Path, port: int = 0) -> tuple[subprocess.Popen, int]:
    """`python -m engine collect` as its own process; its port, read from its first line."""
    proc = subprocess.Popen([sys.executable, "-m", "engine", "collect", "--db", str(db),
                             "--port", str(port)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline() if ready else ""
    match = re.search(r"on http://127\.0\.0\.1:(\d+)/v1/traces into ", line)
    if not match:
        proc.kill()
        raise AssertionError(f"collect did not start: {line!r} {proc.communicate()}")
    return proc, int(match[1])


def stop(proc: subprocess.Popen) -> tuple[int, str, str]:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    return proc.returncode, out, err


def post(url: str, body: bytes, content_type: str = "application/x-protobuf",
         encoding: str = "") -> tuple[int, str, bytes]:
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, reply.headers["Content-Type"], reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def value(v: object) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, list):
        return AnyValue(array_value=ArrayValue(values=[value(x) for x in v]))
    return AnyValue(string_value=v)


def request_of(spans: list[dict], service: str = "svc") -> ExportTraceServiceRequest:
    """An ExportTraceServiceRequest of spans given as dicts (ids in hex)."""
    out = []
    for s in spans:
        out.append(PbSpan(trace_id=bytes.fromhex(s["trace"]), span_id=bytes.fromhex(s["span"]),
                          parent_span_id=bytes.fromhex(s.get("parent", "")),
                          name=s.get("name", "step"), start_time_unix_nano=s.get("start", 1),
                          end_time_unix_nano=s.get("end", 2),
                          attributes=[KeyValue(key=k, value=value(v))
                                      for k, v in s.get("attributes", {}).items()]))
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource={"attributes": [KeyValue(key="service.name", value=value(service))]},
        scope_spans=[ScopeSpans(spans=out)])])


def some_spans(trace: int, count: int = 3) -> list[dict]:
    return [{"trace": f"{trace + 1:032x}", "span": f"{trace * 100 + i + 1:016x}",
             "parent": "" if i == 0 else f"{trace * 100 + 1:016x}", "name": f"s{i}",
             "start": 1_000 + i, "end": 2_000 + i, "attributes": {"n": i}}
            for i in range(count)]


@pytest.fixture
def receiver(tmp_path):
    lines: list[str] = []
    r = Receiver(tmp_path / "collect.duckdb", port=0, log=lines.append)
    r.lines = lines
    r.start()
    yield r
    r.close()


def traces_url(r: Receiver) -> str:
    return f"{r.url}/v1/traces"


def read(r: Receiver) -> list:
    """What `r` collected so far, read in this process (where its connection must go first)."""
    r.store.release()
    return collected(r.db)


def run_traced_pipeline(base_url: str, out: Path, targets: Path, limit: int) -> None:
    """sample_graphs/traced_pipeline.py's run, its spans sent to two exporters at once: its
    own OTLP JSON lines file and the standard OTLP/HTTP exporter, configured only by the
    environment (OTEL_EXPORTER_OTLP_ENDPOINT) behind a BatchSpanProcessor."""
    from openai import OpenAI
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    pipeline = load_pipeline()
    import otlp_export  # sample_graphs/otlp_export.py, on the path the pipeline put it on

    provider = TracerProvider(resource=Resource.create({"service.name": "traced-pipeline"}))
    provider.add_span_processor(SimpleSpanProcessor(otlp_export.OTLPJsonLinesExporter(out)))
    provider.add_span_processor(BatchSpanProcessor(http_exporter.OTLPSpanExporter()))
    tracer = provider.get_tracer("traced_pipeline")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = OpenAI(base_url=base_url, api_key="not-needed")
    rows = [json.loads(line) for line in
            pipeline.DATA.read_text(encoding="utf-8").splitlines()][:limit]
    try:
        with open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                pipeline.pipeline(client, "fake-qwen", row["text"], pipeline.PROMPTS, tracer)
                fh.write(json.dumps({"input": row["text"], "target": row["answer"]}) + "\n")
    finally:
        OpenAIInstrumentor().uninstrument()
        provider.shutdown()  # flushes the batch processor: every span sent


def without_run_id(got: dict) -> dict:
    return {k: v for k, v in got.items() if k != "run_id"}


# --- the real exporter, end to end -----------------------------------------------------


def test_the_standard_exporters_spans_import_as_the_same_spans_in_a_file_do(
        tmp_path, capsys, monkeypatch):
    db, spans_file, targets = tmp_path / "collect.duckdb", tmp_path / "traces.jsonl", \
        tmp_path / "targets.jsonl"
    proc, port = start_collect(db)
    try:
        for name in list(os.environ):
            if name.startswith("OTEL_EXPORTER_OTLP"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
        with FakeOpenAIServer(responder=responder) as server:
            run_traced_pipeline(server.base_url, spans_file, targets, 6)
        in_file = [s for line in spans_file.read_text().splitlines()
                   for s in spans_of(json.loads(line)["resourceSpans"])]
        # the receiver still runs: another process reads the log between its writes
        assert collected_counts(db) == {"spans": len(in_file), "traces": 6, "services": 1}
        got = {(s.trace_id, s.span_id): s for s in collected(db)}
        assert got == {(s.trace_id, s.span_id): s for s in in_file}  # every field, once

        assert main(["import-traces", "--collected", "--db", str(db), "--targets",
                     str(targets), "--metric", "numeric", "--run-id", "live", "--json"]) == 0
        live = json.loads(capsys.readouterr().out)
        assert main(["import-traces", str(spans_file), "--db", str(tmp_path / "file.duckdb"),
                     "--targets", str(targets), "--metric", "numeric", "--json"]) == 0
        from_file = json.loads(capsys.readouterr().out)
    finally:
        code, out, err = stop(proc)
    assert without_run_id(live) == without_run_id(from_file)
    assert [n["id"] for n in live["nodes"]] == ["who", "numbers", "total"]
    assert live["edges"] == [["numbers", "total"], ["who", "total"]]
    assert (live["traces"], live["scored"], live["failing"]) == (6, 6, 6)
    assert code == 0 and "Traceback" not in out + err, err
    assert out.strip().splitlines()[-1].startswith("stopped: ")
    assert f"{len(in_file)} spans stored" in out
    # the run is an ordinary run in the same log, beside what was collected
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'live'").fetchall() == \
            [("finished",)]


def test_killing_the_receiver_mid_stream_loses_no_span_the_exporter_re_sent(
        tmp_path, monkeypatch):
    """kill -9 while a BatchSpanProcessor streams batches, restart on the same port: the
    exporter's retries (connection errors, backoff 1 s, 2 s, 4 s ...) deliver every span,
    and a batch stored just before the kill and sent again is stored once."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    db = tmp_path / "collect.duckdb"
    proc, port = start_collect(db)
    for name in list(os.environ):
        if name.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")  # retries until 1+2+4+8 s
    provider = TracerProvider(resource=Resource.create({"service.name": "stream"}))
    provider.add_span_processor(BatchSpanProcessor(
        http_exporter.OTLPSpanExporter(), schedule_delay_millis=20, max_export_batch_size=16,
        max_queue_size=20_000))
    tracer = provider.get_tracer("stream")
    traces, per_trace, kill_after = 500, 4, 150
    sent: set[str] = set()
    streaming, done = threading.Event(), threading.Event()

    def produce() -> None:  # a trace every 10 ms or so, before, during and after the kill
        for i in range(traces):
            with tracer.start_as_current_span("pipeline") as root:
                sent.add(f"{root.get_span_context().trace_id:032x}")
                for j in range(per_trace - 1):
                    with tracer.start_as_current_span(f"call {j}",
                                                      attributes={"i": i, "j": j}):
                        pass
            if i == kill_after:
                streaming.set()
            time.sleep(0.01)
        done.set()

    producer = threading.Thread(target=produce)
    restarted = None
    try:
        producer.start()
        assert streaming.wait(60)
        # this process reads the log while the receiver keeps writing to it
        started = time.monotonic()
        while_streaming = collected_counts(db)["spans"]
        read_seconds = time.monotonic() - started
        proc.kill()  # SIGKILL: no clean stop, possibly mid-request
        proc.wait()
        assert not done.is_set(), "the stream ended before the kill: make it longer"
        before = collected_counts(db)["spans"]
        time.sleep(0.3)
        restarted, again = start_collect(db, port)
        assert again == port
        producer.join(120)
        assert provider.force_flush(60_000)
    finally:
        provider.shutdown()
        if restarted is not None:
            code, out, err = stop(restarted)
        else:
            proc.kill()
    assert 0 < while_streaming <= before and read_seconds < 30
    assert 0 < before < traces * per_trace
    assert code == 0 and "Traceback" not in err, err
    rows = collected_spans(db)
    assert len(rows) == len({(r[0], r[1]) for r in rows}) == traces * per_trace
    assert {r[0] for r in rows} == sent
    assert {r[7] for r in rows} == {"stream"}


# --- the protocol ----------------------------------------------------------------------


def test_json_gzip_and_deflate_bodies_are_accepted_and_answered_in_kind(receiver):
    url = traces_url(receiver)
    request = request_of(some_spans(0))
    as_json = json_format.MessageToDict(request)
    for span in as_json["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # OTLP JSON: hex ids
        for key in ("traceId", "spanId", "parentSpanId"):
            if key in span:
                span[key] = __import__("base64").b64decode(span[key]).hex()
    status, kind, body = post(url, json.dumps(as_json).encode(), "application/json")
    assert (status, kind, json.loads(body)) == (200, "application/json", {})
    status, kind, body = post(url, gzip.compress(request_of(some_spans(1)).SerializeToString()),
                              encoding="gzip")
    assert (status, kind) == (200, "application/x-protobuf")
    assert ExportTraceServiceResponse.FromString(body) == ExportTraceServiceResponse()
    status, _, _ = post(url, zlib.compress(json.dumps(json_format.MessageToDict(
        request_of(some_spans(2)))).encode()), "application/json; charset=utf-8", "deflate")
    assert status == 200  # protobuf's own JSON mapping too: ids in base64
    assert receiver.counts.new == 9 and receiver.lines == []
    spans = read(receiver)
    assert {s.trace_id for s in spans} == {f"{t:032x}" for t in (1, 2, 3)}
    first = [s for s in spans if s.trace_id == f"{1:032x}"]
    assert [(s.name, s.parent_id, s.start, s.attributes) for s in first] == [
        ("s0", "", 1000, {"n": 0}), ("s1", f"{1:016x}", 1001, {"n": 1}),
        ("s2", f"{1:016x}", 1002, {"n": 2})]


def test_a_bad_body_gets_400_with_a_status_one_log_line_and_the_receiver_serves_on(receiver):
    from google.rpc.status_pb2 import Status

    url = traces_url(receiver)
    bad = [(b"\xff\xfenot protobuf at all", "application/x-protobuf", ""),
           (b"{not json", "application/json", ""),
           (b'{"resourceSpans": {"a": 1}}', "application/json", ""),
           (json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [
               {"traceId": "zz", "spanId": "!!"}]}]}]}).encode(), "application/json", ""),
           (b"\x1f\x8b\x08 truncated gzip", "application/x-protobuf", "gzip")]
    for body, kind, encoding in bad:
        status, reply_kind, reply = post(url, body, kind, encoding)
        assert (status, reply_kind) == (400, kind), reply
        if kind == "application/json":
            code, message = json.loads(reply)["code"], json.loads(reply)["message"]
        else:
            code, message = Status.FromString(reply).code, Status.FromString(reply).message
        assert code == 3 and message  # google.rpc.Code INVALID_ARGUMENT, and why
    assert len(receiver.lines) == len(bad)
    assert all(line.startswith("refused a request from 127.0.0.1: 400 ") and "\n" not in line
               for line in receiver.lines)
    status, _, _ = post(url, request_of(some_spans(5)).SerializeToString())
    assert status == 200 and receiver.counts.new == 3 and receiver.counts.rejected == len(bad)


def test_other_paths_get_404_other_content_types_415_and_bad_ids_a_partial_success(receiver):
    status, _, _ = post(f"{receiver.url}/v1/metrics", b"x")
    assert status == 404
    status, _, body = post(traces_url(receiver), b"x", "text/plain")
    assert status == 415 and "application/x-protobuf" in json.loads(body)["message"]
    status, _, _ = post(traces_url(receiver), b"x", encoding="br")
    assert status == 415
    with pytest.raises(urllib.error.HTTPError) as got:
        urllib.request.urlopen(traces_url(receiver), timeout=10)
    assert got.value.code == 405
    spans = some_spans(7) + [{"trace": "0" * 32, "span": "1" * 16}]
    status, _, body = post(traces_url(receiver), request_of(spans).SerializeToString())
    reply = ExportTraceServiceResponse.FromString(body)
    assert status == 200 and reply.partial_success.rejected_spans == 1
    assert "trace id" in reply.partial_success.error_message
    assert receiver.counts.new == 3 and receiver.counts.dropped == 1


def test_a_re_sent_batch_is_stored_once_and_a_trace_sent_apart_is_merged(receiver, tmp_path):
    url = traces_url(receiver)
    spans = some_spans(3, count=4)
    body = request_of(spans[:3]).SerializeToString()
    assert post(url, body)[0] == 200
    assert post(url, body)[0] == 200  # the exporter's retry of a batch it saw no reply to
    receiver.store.release()
    assert collected_counts(receiver.db) == {"spans": 3, "traces": 1, "services": 1}
    receiver.close()
    # the last span of the trace arrives at another run of the receiver, with a repeat
    again = Receiver(receiver.db, port=0, log=receiver.lines.append)
    with again:
        assert post(traces_url(again), request_of(spans[1:]).SerializeToString())[0] == 200
    assert (again.counts.spans, again.counts.new) == (3, 1)
    got = collected(receiver.db)
    assert sorted(s.span_id for s in got) == sorted(s["span"] for s in spans)
    assert len({s.trace_id for s in got}) == 1


def test_a_reply_lost_after_the_commit_is_re_sent_by_the_exporter_and_stored_once(
        receiver, monkeypatch):
    """The receiver commits a batch and its reply never says so (here: the commit is
    answered as if the log were busy, 503): the exporter sends the batch again, and it is
    not stored twice."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    export = receiver_module.Receiver.export
    dropped = []

    def lose_first_reply(self, *args, **kwargs):
        answer = export(self, *args, **kwargs)  # stored and committed
        if not dropped:
            dropped.append(answer[0])
            raise receiver_module.BadRequest(503, "the reply was lost")
        return answer

    monkeypatch.setattr(receiver_module.Receiver, "export", lose_first_reply)
    for name in list(os.environ):
        if name.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(http_exporter.OTLPSpanExporter()))
    with provider.get_tracer("t").start_as_current_span("once"):
        pass
    provider.shutdown()
    assert dropped and receiver.counts.requests == 2 and receiver.counts.new == 1
    assert [s.name for s in read(receiver)] == ["once"]


def test_the_protobuf_reader_reads_what_spans_of_reads_of_its_json_mapping():
    request = request_of([{"trace": "ab" * 16, "span": "cd" * 8, "parent": "ef" * 8,
                           "attributes": {"s": "x", "i": 7, "f": 0.5, "b": True,
                                          "a": ["p", "q"], "n": [1, 2]}}])
    request.resource_spans[0].scope_spans[0].spans[0].attributes.add(key="bytes").value \
        .bytes_value = b"\x00"
    fast = receiver_module.decode(request.SerializeToString(), "application/x-protobuf")
    slow = spans_of(json_format.MessageToDict(request)["resourceSpans"])
    assert [s for _, s in fast[0]] == slow and fast[1] == []
    assert fast[0][0][0] == "svc"


# --- the run log -----------------------------------------------------------------------


def test_a_log_that_never_collected_reads_as_empty_and_gains_the_table_from_collect(
        tmp_path, capsys):
    db = tmp_path / "old.duckdb"
    open_for_writing(db)  # a run log as any run leaves it: no collected_spans
    assert collected_spans(db) == [] and collected_counts(db)["spans"] == 0
    assert main(["import-traces", "--collected", "--db", str(db)]) == 2
    assert "no collected spans" in capsys.readouterr().err
    Receiver(db, port=0).close()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM collected_spans").fetchone() == (0,)


def test_the_store_lets_another_process_in_between_batches_that_keep_coming(tmp_path):
    db = tmp_path / "log.duckdb"
    open_for_writing(db)
    store = SpanStore(db, idle=0.1, hold=0.3, pause=0.1)
    stop_writing = threading.Event()

    def write() -> None:
        n = 0
        while not stop_writing.is_set():
            store.store([(f"{n + 1:032x}", f"{n + 1:016x}", "", "s", 1, 2, "{}", "svc")])
            n += 1
            time.sleep(0.005)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        time.sleep(0.2)
        reader = subprocess.run(
            [sys.executable, "-c", "import sys; from engine.runlog.collected import "
             "collected_counts; print(collected_counts(sys.argv[1])['spans'])", str(db)],
            cwd=REPO, capture_output=True, text=True, timeout=60)
    finally:
        stop_writing.set()
        writer.join()
        store.close()
    assert reader.returncode == 0, reader.stderr
    assert int(reader.stdout) > 0
    assert collected_counts(db)["spans"] >= int(reader.stdout)


def test_service_and_since_choose_whole_traces(tmp_path):
    db = tmp_path / "log.duckdb"
    open_for_writing(db)
    store = SpanStore(db)
    try:
        row = ("{:032x}".format, "{:016x}".format)
        store.store([(row[0](1), row[1](1), "", "a", 1, 2, "{}", "web"),
                     (row[0](2), row[1](2), "", "b", 1, 2, "{}", "worker")], received_at=100.0)
        store.store([(row[0](2), row[1](3), row[1](2), "c", 1, 2, "{}", "web"),
                     (row[0](3), row[1](4), "", "d", 1, 2, "{}", "worker")], received_at=200.0)
    finally:
        store.close()
    names = [r[3] for r in collected_spans(db, service="web")]
    assert names == ["a", "b", "c"]  # trace 2 is whole: one of its spans is web's
    assert [r[3] for r in collected_spans(db, since=150.0)] == ["d"]
    assert since_time("30m", now=10_000.0) == 10_000.0 - 1800
    with pytest.raises(ValueError):
        since_time("yesterday")


# --- the command line ------------------------------------------------------------------


def test_collect_refuses_a_port_in_use_and_bad_flags_in_one_line(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["collect", "--db", str(tmp_path / "c.duckdb"), "--port",
                     str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot listen on 127.0.0.1:")
    assert "in use" in err[0]
    with pytest.raises(SystemExit) as exit_:
        main(["collect", "--port", "70000"])
    assert exit_.value.code == 2
    assert [line for line in capsys.readouterr().err.splitlines() if "error:" in line] == [
        "python -m engine collect: error: argument --port: expected a port number 0-65535 "
        "(0: any free port), not 70000"]
    foreign = tmp_path / "theirs.duckdb"
    with duckdb.connect(str(foreign)) as con:
        con.execute("CREATE TABLE sales (amount INTEGER)")
    assert main(["collect", "--db", str(foreign), "--port", "0"]) == 2
    assert "not a run log" in capsys.readouterr().err


def test_collect_stops_cleanly_on_sigterm_and_its_defaults_are_the_receivers(tmp_path):
    from engine.cli import collect as collect_cli

    assert (collect_cli.DEFAULT_HOST, collect_cli.DEFAULT_PORT, collect_cli.PATH) == (
        receiver_module.DEFAULT_HOST, receiver_module.DEFAULT_PORT, receiver_module.PATH)
    proc, port = start_collect(tmp_path / "c.duckdb")
    assert post(f"http://127.0.0.1:{port}/v1/traces", b"garbage")[0] == 400
    code, out, err = stop(proc)
    assert code == 0 and out.strip().splitlines()[-1].startswith("stopped: 0 spans stored")
    assert err.strip().splitlines() == [err.strip()] and "refused a request" in err


def test_import_traces_takes_a_file_or_collected_spans(tmp_path, capsys):
    db = tmp_path / "log.duckdb"
    open_for_writing(db)
    for argv in (["import-traces", "--db", str(db)],
                 ["import-traces", "x.jsonl", "--collected", "--db", str(db)],
                 ["import-traces", "x.jsonl", "--service", "web", "--db", str(db)],
                 ["import-traces", "--collected", "--db", str(db)],
                 ["import-traces", "--collected", "--since", "soon", "--db", str(db)]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), (argv, err)
