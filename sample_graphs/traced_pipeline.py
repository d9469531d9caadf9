"""A plain-Python pipeline of three `openai` SDK calls, traced with OpenInference, for
`python -m engine import-traces` (docs/traces.md).

`who` and `numbers` read a sentence ("Maria has 3 apples in the basket and adds 15
more."); `total` reads both of their replies, never the sentence, and gives the sum. The
`numbers` prompt is plainly at fault: it asks how the person feels instead of for the two
numbers (sample_graphs/blame_fault.yaml is the same pipeline as a graph). Run it against any OpenAI-compatible server on 127.0.0.1 (the embedded model
served by llama.cpp, or the scripted server of the tests):

    python sample_graphs/traced_pipeline.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen --out traces.jsonl --limit 12
    python -m engine import-traces traces.jsonl --db traces.duckdb --targets targets.jsonl \\
        --metric numeric
    python -m engine backprop RUN_ID --db traces.duckdb
    python -m engine blame RUN_ID --db traces.duckdb

It writes the spans as OTLP JSON lines (one ExportTraceServiceRequest a line, the
OpenTelemetry Collector's file format) to --out, and each sentence's expected sum to
--targets (default: targets.jsonl beside --out).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from openai import OpenAI
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry import trace

sys.path.insert(0, str(Path(__file__).parent))  # the exporter beside this script
from otlp_export import command_line, tracer_provider  # noqa: E402

DATA = Path(__file__).parent / "data" / "blame_fault.jsonl"
PROMPTS = {
    "who": "Who: say in one short sentence who the sentence is about.",
    # the planted fault: it should pass on the two numbers
    "numbers": "Numbers: say in one short sentence how the person feels.",
    "total": "Total: add up the numbers you are given and reply with the sum, as digits "
             "only.",
}


def ask(client: OpenAI, model: str, system: str, user: str) -> str:
    reply = client.chat.completions.create(
        model=model, temperature=0, max_tokens=64,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}])
    return (reply.choices[0].message.content or "").strip()


def pipeline(client: OpenAI, model: str, sentence: str, prompts: dict[str, str],
             tracer: trace.Tracer) -> str:
    with tracer.start_as_current_span("pipeline", attributes={
            "openinference.span.kind": "CHAIN", "input.value": sentence}) as span:
        who = ask(client, model, prompts["who"], f"Text: {sentence}")
        numbers = ask(client, model, prompts["numbers"], f"Text: {sentence}")
        answer = ask(client, model, prompts["total"], f"Note: {who}\nNumbers: {numbers}")
        span.set_attribute("output.value", answer)
    return answer


def run(base_url: str, model: str, out: str | Path, limit: int, targets: str | Path,
        prompts: dict[str, str] | None = None) -> list[str]:
    """Run the pipeline on the first `limit` sentences, tracing every call to `out`."""
    provider = tracer_provider(out, "traced_pipeline")
    tracer = provider.get_tracer("traced_pipeline")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = OpenAI(base_url=base_url, api_key="not-needed")
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()][:limit]
    answers = []
    try:
        with open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                answers.append(pipeline(client, model, row["text"], prompts or PROMPTS, tracer))
                fh.write(json.dumps({"input": row["text"], "target": row["answer"]}) + "\n")
    finally:
        OpenAIInstrumentor().uninstrument()
        provider.shutdown()
    return answers


def main() -> None:
    command_line(__doc__, run, "expected sums")


if __name__ == "__main__":
    main()
