"""A plain-Python pipeline of `openai` SDK calls with tools, traced with OpenInference, for
`python -m engine import-traces` (docs/traces.md).

Each request is a customer's message to a grocer ("I have 2 bags of rice left, please
send 5 more."); the pipeline answers what the order costs (12.50):

- `order` is told, in a templated system message ("You are the order assistant of
  {shop}. The customer today is {customer}. ..."), to record the order, and answers with
  a forced call of the tool record_order(item, quantity). Its prompt is plainly at fault:
  it asks, as quantity, for how many the customer still has at home (2), not how many
  they order (5). The template, its variables and its version are recorded on the span
  with openinference's `using_prompt_template`;
- `cashier` is given the recorded order and runs a tool loop: it asks for
  lookup_price(item), the script runs the tool (a TOOL span), hands the model the price,
  and the model replies with the total (quantity times unit price) in text.

Each request is one trace: a `pipeline` span (kind CHAIN, its input.value the customer's
message) over one CHAIN span per stage (`order`, `cashier`: the names the importer gives
the nodes), each over the ChatCompletion spans of openinference-instrumentation-openai and
the tool's span. Run it against any OpenAI-compatible server with tool calls on 127.0.0.1 (the
embedded model served by llama.cpp with --jinja, or the scripted server of the tests):

    python sample_graphs/openai_tools_pipeline.py --base-url http://127.0.0.1:8080/v1 \\
        --model qwen --out traces.jsonl --limit 12

It writes the spans as OTLP JSON lines (one ExportTraceServiceRequest a line, the
OpenTelemetry Collector's file format) to --out, and each message's expected total to
--targets (default: targets.jsonl beside --out). With OTEL_EXPORTER_OTLP_ENDPOINT set and no
--out, the spans go to that OTLP/HTTP endpoint instead.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from openai import OpenAI
from openinference.instrumentation import using_prompt_template
from openinference.instrumentation.openai import OpenAIInstrumentor
from opentelemetry import trace

sys.path.insert(0, str(Path(__file__).parent))  # the exporter beside this script
from otlp_export import command_line, tracer_provider  # noqa: E402

DATA = Path(__file__).parent / "data" / "openai_orders.jsonl"
PROMPTS = {
    # the planted fault: the quantity should be how many the customer asks to be sent
    "order": "You are the order assistant of {shop}. The customer today is {customer}. "
             "Record the order with record_order: the item the customer asks for and, as "
             "quantity, how many they still have at home.",
    "cashier": "You are the cashier of the shop. Look up the item's unit price with "
               "lookup_price, then reply with the order's total price (the quantity times "
               "the unit price) as a number only.",
}
TEMPLATE_VERSION = "order-v1"
PRICES = {"rice": 2.5, "honey": 6.0, "olive oil": 8.5, "coffee": 4.25, "tea": 3.0,
          "bread": 2.75, "flour": 1.5, "milk": 1.25, "jam": 3.5, "chocolate": 2.0,
          "pasta": 1.75, "lentils": 2.25, "tomatoes": 1.0, "vinegar": 2.5}
RECORD_ORDER = {"type": "function", "function": {
    "name": "record_order", "description": "Record the customer's order.",
    "parameters": {"type": "object", "properties": {
        "item": {"type": "string", "description": "what the customer orders"},
        "quantity": {"type": "integer", "description": "how many"}},
        "required": ["item", "quantity"]}}}
LOOKUP_PRICE = {"type": "function", "function": {
    "name": "lookup_price", "description": "The unit price of an item, in euros.",
    "parameters": {"type": "object", "properties": {
        "item": {"type": "string", "description": "the item"}}, "required": ["item"]}}}


def lookup_price(item: str) -> str:
    """The tool: an item's unit price in euros, or "unknown"."""
    price = PRICES.get(item.strip().lower())
    return "unknown" if price is None else f"{price:.2f}"


def record(client: OpenAI, model: str, template: str, variables: dict[str, str],
           message: str) -> dict:
    """The `order` stage: a templated system message and a forced record_order call."""
    with using_prompt_template(template=template, variables=variables,
                               version=TEMPLATE_VERSION):
        reply = client.chat.completions.create(
            model=model, temperature=0, max_tokens=128, tools=[RECORD_ORDER],
            tool_choice={"type": "function", "function": {"name": "record_order"}},
            messages=[{"role": "system", "content": template.format(**variables)},
                      {"role": "user", "content": message}])
    calls = reply.choices[0].message.tool_calls or []
    if not calls:
        return {}
    try:
        return json.loads(calls[0].function.arguments or "{}")
    except json.JSONDecodeError:
        return {}


def cashier(client: OpenAI, model: str, system: str, order: dict, tracer: trace.Tracer,
            rounds: int = 4) -> str:
    """The `cashier` stage: a tool loop with lookup_price until the model replies in text."""
    messages: list[dict] = [{"role": "system", "content": system},
                            {"role": "user", "content": f"Order: {json.dumps(order)}"}]
    for _ in range(rounds):
        reply = client.chat.completions.create(
            model=model, temperature=0, max_tokens=128, tools=[LOOKUP_PRICE],
            messages=messages)
        message = reply.choices[0].message
        if not message.tool_calls:
            return (message.content or "").strip()
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for call in message.tool_calls]})
        for call in message.tool_calls:
            with tracer.start_as_current_span(call.function.name, attributes={
                    "openinference.span.kind": "TOOL", "tool.name": call.function.name,
                    "input.value": call.function.arguments,
                    "input.mime_type": "application/json"}) as span:
                try:
                    item = str(json.loads(call.function.arguments or "{}").get("item", ""))
                except (json.JSONDecodeError, AttributeError):
                    item = ""
                result = (lookup_price(item) if call.function.name == "lookup_price"
                          else f"no tool named {call.function.name}")
                span.set_attribute("output.value", result)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


def pipeline(client: OpenAI, model: str, row: dict, prompts: dict[str, str],
             tracer: trace.Tracer) -> str:
    with tracer.start_as_current_span("pipeline", attributes={
            "openinference.span.kind": "CHAIN", "input.value": row["text"]}) as span:
        # each stage under a span of its own name: the importer names the node by it
        with tracer.start_as_current_span("order", attributes={
                "openinference.span.kind": "CHAIN", "input.value": row["text"]}) as stage:
            order = record(client, model, prompts["order"],
                           {"shop": row["shop"], "customer": row["customer"]}, row["text"])
            stage.set_attribute("output.value", json.dumps(order))
        with tracer.start_as_current_span("cashier", attributes={
                "openinference.span.kind": "CHAIN", "input.value": json.dumps(order)}) as stage:
            answer = cashier(client, model, prompts["cashier"], order, tracer)
            stage.set_attribute("output.value", answer)
        span.set_attribute("output.value", answer)
    return answer


def run(base_url: str, model: str, out: str | Path | None, limit: int, targets: str | Path,
        prompts: dict[str, str] | None = None) -> list[str]:
    """Run the pipeline on the first `limit` messages, tracing every call to `out`."""
    provider = tracer_provider(out, "openai_tools_pipeline")
    tracer = provider.get_tracer("openai_tools_pipeline")
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = OpenAI(base_url=base_url, api_key="not-needed")
    rows = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()][:limit]
    answers = []
    try:
        with open(targets, "w", encoding="utf-8") as fh:
            for row in rows:
                answers.append(pipeline(client, model, row, {**PROMPTS, **(prompts or {})},
                                        tracer))
                fh.write(json.dumps({"input": row["text"], "target": row["answer"]}) + "\n")
    finally:
        OpenAIInstrumentor().uninstrument()
        provider.shutdown()
    return answers


def answer(text: str, shop: str, customer: str) -> str:
    """The pipeline on one message, untraced, its model wherever OPENAI_BASE_URL points: how
    `python -m engine trace --pipeline` runs it through the gateway (docs/pipelines.md),
    which finds the order stage's template from the shop and customer it was filled with."""
    import os

    client = OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "not-needed")
    return pipeline(client, os.environ.get("OPENAI_MODEL", "qwen"),
                    {"text": text, "shop": shop, "customer": customer}, PROMPTS,
                    trace.get_tracer("openai_tools_pipeline"))


def main() -> None:
    command_line(__doc__, run, "expected totals")


if __name__ == "__main__":
    main()
