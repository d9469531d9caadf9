"""How fast `collect` stores spans, and its memory: 96,000 OpenInference spans (a CHAIN span
and three LLM calls with their messages a trace) posted to `python -m engine collect` as
OTLP/HTTP protobuf in batches of 512, as a BatchSpanProcessor sends them, one request at a
time; then, for comparison, the same spans as an OTLP JSON lines file read by the file
import's reader (engine.traces.otlp.read_spans) and by `--collected`'s.

    python benchmarks/collect_rate.py [--spans 96000] [--batch 512] [--clients 1]
                                      [--gzip] [--dir DIR]

Prints the receiver's spans per second (from the first request sent to the last reply),
its peak resident memory (VmHWM of the `collect` process), and the readers' spans per
second. The status is 1 when a span is missing or stored twice.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from google.protobuf import json_format  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue  # noqa: E402
from opentelemetry.proto.resource.v1.resource_pb2 import Resource  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan  # noqa: E402

SPANS_PER_TRACE = 4
PROMPTS = ("Who: say in one short sentence who the sentence is about.",
           "Numbers: say in one short sentence how the person feels.",
           "Total: add up the numbers you are given and reply with the sum, as digits only.")


def _kv(key: str, value: object) -> KeyValue:
    if isinstance(value, bool):
        return KeyValue(key=key, value=AnyValue(bool_value=value))
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    if isinstance(value, float):
        return KeyValue(key=key, value=AnyValue(double_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=str(value)))


def trace_spans(number: int, start: int) -> list[PbSpan]:
    """One trace of the example pipeline as openinference-instrumentation-openai records it."""
    trace_id = secrets.token_bytes(16)
    root = secrets.token_bytes(8)
    sentence = (f"Person {number} has {number % 17 + 2} apples in the basket and adds "
                f"{number % 23 + 5} more.")
    spans = [PbSpan(trace_id=trace_id, span_id=root, name="pipeline", kind=1,
                    start_time_unix_nano=start, end_time_unix_nano=start + 900_000_000,
                    attributes=[_kv("openinference.span.kind", "CHAIN"),
                                _kv("input.value", sentence), _kv("output.value", "0")])]
    replies = [f"It is about person {number}.", f"Person {number} feels fine.", "0"]
    for i, (prompt, reply) in enumerate(zip(PROMPTS, replies)):
        user = f"Text: {sentence}" if i < 2 else f"Note: {replies[0]}\nNumbers: {replies[1]}"
        messages = [{"role": "system", "content": prompt}, {"role": "user", "content": user}]
        body = {"messages": messages, "model": "qwen", "temperature": 0, "max_tokens": 64}
        begin = start + (i + 1) * 200_000_000
        spans.append(PbSpan(
            trace_id=trace_id, span_id=secrets.token_bytes(8), parent_span_id=root,
            name="ChatCompletion", kind=1, start_time_unix_nano=begin,
            end_time_unix_nano=begin + 150_000_000,
            attributes=[_kv(k, v) for k, v in {
                "openinference.span.kind": "LLM", "llm.system": "openai",
                "llm.provider": "openai", "llm.model_name": "qwen",
                "llm.invocation_parameters": json.dumps(
                    {"model": "qwen", "temperature": 0, "max_tokens": 64}),
                "input.value": json.dumps(body), "input.mime_type": "application/json",
                "output.value": json.dumps({"id": f"chatcmpl-{number}-{i}", "choices": [
                    {"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": reply}}],
                    "usage": {"prompt_tokens": 40, "completion_tokens": 9}}),
                "output.mime_type": "application/json",
                "llm.input_messages.0.message.role": "system",
                "llm.input_messages.0.message.content": prompt,
                "llm.input_messages.1.message.role": "user",
                "llm.input_messages.1.message.content": user,
                "llm.output_messages.0.message.role": "assistant",
                "llm.output_messages.0.message.content": reply,
                "llm.token_count.prompt": 40, "llm.token_count.completion": 9,
                "llm.token_count.total": 49}.items()]))
    return spans


def requests_of(total: int, batch: int) -> list[ExportTraceServiceRequest]:
    spans: list[PbSpan] = []
    start = time.time_ns()
    for number in range((total + SPANS_PER_TRACE - 1) // SPANS_PER_TRACE):
        spans.extend(trace_spans(number, start + number * 1_000_000_000))
    spans = spans[:total]
    resource = Resource(attributes=[_kv("service.name", "traced-pipeline"),
                                    _kv("telemetry.sdk.language", "python")])
    return [ExportTraceServiceRequest(resource_spans=[ResourceSpans(
        resource=resource, scope_spans=[ScopeSpans(spans=spans[i:i + batch])])])
        for i in range(0, len(spans), batch)]


def peak_rss_mib(pid: int) -> float:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", text)[1]) / 1024


def post_all(url: str, bodies: list[bytes], clients: int, compressed: bool) -> None:
    import requests

    headers = {"Content-Type": "application/x-protobuf"}
    if compressed:
        headers["Content-Encoding"] = "gzip"
    queue = list(reversed(bodies))
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        with requests.Session() as session:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                reply = session.post(url, data=body, headers=headers, timeout=60)
                if reply.status_code != 200:
                    failures.append(f"{reply.status_code} {reply.text[:200]}")

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise SystemExit(f"{len(failures)} requests failed: {failures[0]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=96_000, help="spans to send")
    parser.add_argument("--batch", type=int, default=512, help="spans a request")
    parser.add_argument("--clients", type=int, default=1, help="requests in flight at once")
    parser.add_argument("--gzip", action="store_true", help="gzip each request")
    parser.add_argument("--dir", help="where the run log goes (default: a new temporary "
                                      "folder)")
    args = parser.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="collect-rate-"))
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "collect.duckdb"
    built = time.perf_counter()
    requests = requests_of(args.spans, args.batch)
    bodies = [r.SerializeToString() for r in requests]
    if args.gzip:
        bodies = [gzip.compress(b) for b in bodies]
    print(f"{args.spans:,} spans in {len(bodies)} requests of up to {args.batch} "
          f"({sum(map(len, bodies)) / 2**20:.1f} MiB{' gzipped' if args.gzip else ''}), "
          f"built in {time.perf_counter() - built:.1f} s", flush=True)

    receiver = subprocess.Popen(
        [sys.executable, "-m", "engine", "collect", "--db", str(db), "--port", "0"],
        cwd=REPO, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        first = receiver.stdout.readline()
        match = re.search(r"(http://\S+?)/v1/traces", first)
        if not match:
            raise SystemExit(f"collect did not start: {first!r}")
        url = f"{match[1]}/v1/traces"
        started = time.perf_counter()
        post_all(url, bodies, args.clients, args.gzip)
        seconds = time.perf_counter() - started
        rss = peak_rss_mib(receiver.pid)
    finally:
        receiver.terminate()
        receiver.wait(timeout=30)
    print(f"collect: {args.spans:,} spans stored in {seconds:.1f} s: "
          f"{args.spans / seconds:,.0f} spans/s ({len(bodies) / seconds:.1f} requests/s, "
          f"{args.clients} client{'s' if args.clients > 1 else ''}); peak RSS of the "
          f"receiver {rss:.0f} MiB", flush=True)

    from engine.runlog.collected import collected_counts
    from engine.traces.collect import collected
    from engine.traces.otlp import read_spans

    counts = collected_counts(db)
    read_started = time.perf_counter()
    spans = collected(db)
    read_seconds = time.perf_counter() - read_started
    lines = folder / "spans.jsonl"
    with lines.open("w", encoding="utf-8") as fh:
        for r in requests:
            fh.write(json.dumps(json_format.MessageToDict(r)) + "\n")
    file_started = time.perf_counter()
    from_file = read_spans(lines)
    file_seconds = time.perf_counter() - file_started
    print(f"read back: --collected {len(spans):,} spans in {read_seconds:.1f} s "
          f"({len(spans) / read_seconds:,.0f} spans/s); the file import's reader "
          f"{len(from_file):,} spans in {file_seconds:.1f} s "
          f"({len(from_file) / file_seconds:,.0f} spans/s)", flush=True)
    ok = counts["spans"] == args.spans and len(spans) == args.spans and \
        len({(s.trace_id, s.span_id) for s in spans}) == args.spans
    print(f"stored {counts['spans']:,} spans in {counts['traces']:,} traces: "
          f"{'every span once' if ok else 'MISSING OR REPEATED SPANS'} (run log {db})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
