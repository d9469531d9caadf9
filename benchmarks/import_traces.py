"""How fast `import-traces` reads a large OTLP JSON lines file, and its memory, against the
floor of reading that file at all (docs/traces.md, "Import at scale").

    python benchmarks/import_traces.py [--spans 96000] [--batch 100] [--dir DIR] [--keep]
                                       [--repeat N]

It writes (into a temporary directory, or DIR) the example pipeline's traces
(sample_graphs/traced_pipeline.py) as openinference-instrumentation-openai records them:
a `pipeline` CHAIN span and three `ChatCompletion` LLM spans a trace, each call with its
flattened messages (`llm.input_messages.*`, `llm.output_messages.*`), the request and the
response JSON in `input.value` / `output.value`, its invocation parameters and token
counts. Each trace's sentence is a GSM8K question (../shared/datasets/gsm8k; its numbers
shifted on each pass over the questions, so no two traces share one) and `numbers`'s reply
the first step of its worked answer, so the messages have a real pipeline's sizes. The
spans are written as the Collector's file exporter writes them: about `--batch` spans an
`ExportTraceServiceRequest` line, in the order they ended, so a trace may straddle two
lines. The targets are one `{"trace_id", "target"}` line a trace.

Then, each in a fresh process:

- the parse floor: the file read line by line and every line `json.loads`-ed, nothing else;
- `python -m engine import-traces FILE --db EMPTY.duckdb --targets TARGETS --metric numeric`
  end to end (its `--base-url` a closed local port: a replayed import calls no model).

It prints each one's wall time, CPU time and peak resident memory (the child's
ru_maxrss, from wait4), and the import's times over the parse floor's (the CPU ratio is
the steadier one on a shared machine); with `--repeat N`, the least time and the largest
peak of N runs of each. The status is 1 when the import fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k"
PROMPTS = {
    "who": "Who: say in one short sentence who the sentence is about.",
    "numbers": "Numbers: say in one short sentence how the person feels.",
    "total": "Total: add up the numbers you are given and reply with the sum, as digits "
             "only.",
}
MODEL = "qwen2.5-1.5b-instruct"
PARAMS = {"model": MODEL, "temperature": 0, "max_tokens": 256}
SCOPE_OPENAI = {"name": "openinference.instrumentation.openai", "version": "0.1.66"}
SCOPE_PIPELINE = {"name": "traced_pipeline"}
RESOURCE = {"attributes": [
    {"key": "telemetry.sdk.language", "value": {"stringValue": "python"}},
    {"key": "telemetry.sdk.name", "value": {"stringValue": "opentelemetry"}},
    {"key": "telemetry.sdk.version", "value": {"stringValue": "1.45.2"}},
    {"key": "service.name", "value": {"stringValue": "traced-pipeline"}}]}
CALC = re.compile(r"<<[^>]*>>")

PARSE_FLOOR = """
import json, sys
n = 0
with open(sys.argv[1], encoding="utf-8") as fh:
    for line in fh:
        if line.strip():
            n += len(json.loads(line)["resourceSpans"])
print(n)
"""


def questions() -> list[tuple[str, str, str]]:
    """(question, the first step of its worked answer, the final answer) of GSM8K."""
    out = []
    for name in ("train.jsonl", "test.jsonl"):
        for line in (GSM8K / name).read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            steps, _, final = row["answer"].rpartition("####")
            lines = [CALC.sub("", s).strip() for s in steps.strip().splitlines() if s.strip()]
            out.append((row["question"].strip(), " ".join(lines[:1]), final.strip()))
    return out


def _attr(key: str, value: object) -> dict:
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    return {"key": key, "value": {"stringValue": str(value)}}


def _tokens(text: str) -> int:
    return max(1, len(text) // 4)


def llm_span(rng: random.Random, trace_id: str, parent: str, start: int, end: int,
             number: int, system: str, user: str, reply: str) -> dict:
    """A ChatCompletion span as openinference-instrumentation-openai 0.1.x records it."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    prompt_tokens, completion_tokens = _tokens(system + user) + 8, _tokens(reply) + 1
    request = {"model": MODEL, "messages": messages, "max_tokens": PARAMS["max_tokens"],
               "temperature": 0}
    response = {  # as llama.cpp's server answers
        "choices": [{"finish_reason": "stop", "index": 0,
                     "message": {"role": "assistant", "content": reply}}],
        "created": start // 1_000_000_000, "model": MODEL,
        "system_fingerprint": "b5742-0c71cfd6", "object": "chat.completion",
        "usage": {"completion_tokens": completion_tokens, "prompt_tokens": prompt_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
        "id": f"chatcmpl-{rng.getrandbits(128):032x}",
        "timings": {"prompt_n": prompt_tokens, "prompt_ms": round(rng.uniform(20, 90), 3),
                    "predicted_n": completion_tokens,
                    "predicted_ms": round(rng.uniform(40, 700), 3)}}
    attributes = [
        _attr("llm.system", "openai"),
        _attr("input.value", json.dumps(request)), _attr("input.mime_type", "application/json"),
        _attr("output.value", json.dumps(response, separators=(",", ":"))),
        _attr("output.mime_type", "application/json"),
        _attr("llm.invocation_parameters", json.dumps(PARAMS)),
        _attr("llm.input_messages.0.message.role", "system"),
        _attr("llm.input_messages.0.message.content", system),
        _attr("llm.input_messages.1.message.role", "user"),
        _attr("llm.input_messages.1.message.content", user),
        _attr("llm.model_name", MODEL),
        _attr("llm.token_count.total", prompt_tokens + completion_tokens),
        _attr("llm.token_count.prompt", prompt_tokens),
        _attr("llm.token_count.completion", completion_tokens),
        _attr("llm.output_messages.0.message.role", "assistant"),
        _attr("llm.output_messages.0.message.content", reply),
        _attr("llm.finish_reason", "stop"), _attr("openinference.span.kind", "LLM")]
    return {"traceId": trace_id, "spanId": f"{rng.getrandbits(64):016x}",
            "parentSpanId": parent, "name": "ChatCompletion", "kind": "SPAN_KIND_INTERNAL",
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": attributes, "status": {"code": "STATUS_CODE_OK"}, "flags": 256}


def trace(rng: random.Random, number: int, start: int, sentence: str, steps: str,
          answer: str) -> list[tuple[dict, dict]]:
    """One pass of the pipeline: (scope, span) in the order the spans ended."""
    trace_id, root = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    subject = next((w.strip(".,'s") for w in sentence.split()[1:] if w[:1].isupper()),
                   sentence.split()[0])
    who = f"It is about {subject}."
    numbers = steps if len(steps) >= 20 and steps not in sentence else \
        f"{subject} works it out from {' and '.join(re.findall(r'[0-9]+', sentence)[:2])}."
    total = answer if rng.random() < 0.4 else str(rng.randint(1, 500))
    out, at = [], start
    for node, user, reply in (("who", f"Text: {sentence}", who),
                              ("numbers", f"Text: {sentence}", numbers),
                              ("total", f"Note: {who}\nNumbers: {numbers}", total)):
        took = rng.randint(150_000_000, 900_000_000)
        out.append((SCOPE_OPENAI, llm_span(rng, trace_id, root, at + 1_000_000, at + took,
                                           number, PROMPTS[node], user, reply)))
        at += took + 2_000_000
    out.append((SCOPE_PIPELINE, {
        "traceId": trace_id, "spanId": root, "name": "pipeline", "kind": "SPAN_KIND_INTERNAL",
        "startTimeUnixNano": str(start), "endTimeUnixNano": str(at),
        "attributes": [_attr("openinference.span.kind", "CHAIN"),
                       _attr("input.value", sentence), _attr("output.value", total)],
        "status": {"code": "STATUS_CODE_OK"}, "flags": 256}))
    return out


def request_line(batch: list[tuple[dict, dict]]) -> str:
    """One ExportTraceServiceRequest: the batch's spans grouped by scope."""
    scopes: dict[str, tuple[dict, list[dict]]] = {}
    for scope, span in batch:
        scopes.setdefault(scope["name"], (scope, []))[1].append(span)
    return json.dumps({"resourceSpans": [{"resource": RESOURCE, "scopeSpans": [
        {"scope": scope, "spans": spans} for scope, spans in scopes.values()]}]},
        separators=(",", ":"))


def write_traces(path: Path, targets: Path, spans: int, batch: int, seed: int = 7) -> int:
    """The file and its targets; returns the number of traces written."""
    rng = random.Random(seed)
    pool = questions()
    count = (spans + 3) // 4
    start = 1_796_600_000_000_000_000
    pending: list[tuple[dict, dict]] = []
    size = rng.randint(batch * 9 // 10, batch * 11 // 10)
    with path.open("w", encoding="utf-8") as fh, targets.open("w", encoding="utf-8") as tf:
        for number in range(count):
            question, steps, answer = pool[number % len(pool)]
            shift = number // len(pool)
            if shift:  # another pass over the questions: its numbers shifted
                question = re.sub(r"\d+", lambda m, k=shift: str(int(m[0]) + k), question)
            these = trace(rng, number, start + number * 3_000_000_000, question, steps,
                          answer)
            tf.write(json.dumps({"trace_id": these[0][1]["traceId"], "target": answer})
                     + "\n")
            pending.extend(these)
            while len(pending) >= size:
                fh.write(request_line(pending[:size]) + "\n")
                pending = pending[size:]
                size = rng.randint(batch * 9 // 10, batch * 11 // 10)
        if pending:
            fh.write(request_line(pending) + "\n")
    return count


def measure(argv: list[str], env: dict[str, str] | None = None
            ) -> tuple[float, float, float, str, int]:
    """(wall seconds, CPU seconds, peak RSS in MiB, output, status) of one fresh process."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env)
    out = proc.stdout.read().decode("utf-8", "replace") if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out, \
        proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=96_000)
    parser.add_argument("--batch", type=int, default=100, help="spans a line, about")
    parser.add_argument("--dir", help="write the files here (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="reuse DIR's traces.jsonl when "
                                                            "there is one")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement: the "
                                                              "least time, largest peak shown")
    args = parser.parse_args()
    if not (args.keep and args.dir and (Path(args.dir) / "traces.jsonl").exists()) \
            and not GSM8K.is_dir():
        print(f"no GSM8K at {GSM8K} (the sentences of the traces): see ../shared/datasets")
        return 1
    with tempfile.TemporaryDirectory(prefix="import-traces-") as tmp:
        where = Path(args.dir or tmp)
        where.mkdir(parents=True, exist_ok=True)
        path, targets = where / "traces.jsonl", where / "targets.jsonl"
        if not (args.keep and path.exists() and targets.exists()):
            began = time.perf_counter()
            count = write_traces(path, targets, args.spans, args.batch)
            print(f"wrote {count} traces ({count * 4} spans), {path.stat().st_size / 1e6:.0f} "
                  f"MB, in {time.perf_counter() - began:.1f} s: {path}")
        else:
            print(f"reusing {path} ({path.stat().st_size / 1e6:.0f} MB)")
        floors, imports = [], []
        db = where / "import.duckdb"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        env.pop("OPENAI_BASE_URL", None)
        for _ in range(max(1, args.repeat)):
            *got, out, status = measure([sys.executable, "-c", PARSE_FLOOR, str(path)])
            if status:
                print(out)
                return 1
            floors.append(got)
            for stale in (db, db.with_name(db.name + ".wal")):
                stale.unlink(missing_ok=True)
            *got, out, status = measure(
                [sys.executable, "-m", "engine", "import-traces", str(path), "--db", str(db),
                 "--targets", str(targets), "--metric", "numeric",
                 "--base-url", "http://127.0.0.1:9/v1", "--run-id", "bench"], env)
            if status:
                print(out.strip())
                print(f"import-traces failed (status {status})")
                return 1
            imports.append(got)
        print(out.strip())
        (floor, floor_cpu), floor_rss = (min(x) for x in list(zip(*floors))[:2]), \
            max(x[2] for x in floors)
        (wall, cpu), rss = (min(x) for x in list(zip(*imports))[:2]), max(x[2] for x in imports)
        load = os.getloadavg()
        print(f"parse floor (read + json.loads every line): {floor:.1f} s (CPU "
              f"{floor_cpu:.1f} s), peak RSS {floor_rss:.0f} MiB")
        print(f"import-traces: {wall:.1f} s ({wall / floor:.1f}x the parse floor; CPU "
              f"{cpu:.1f} s, {cpu / floor_cpu:.1f}x), peak RSS {rss:.0f} MiB")
        print(f"machine: {os.cpu_count()} cores, load average {load[0]:.1f} {load[1]:.1f} "
              f"{load[2]:.1f}")
        for stale in (db, db.with_name(db.name + ".wal")):
            stale.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
