"""Two pipelines whose flows their content cannot show, run through the gateway by
tests/gateway/test_flows.py (their base URL from OPENAI_BASE_URL, as the runner sets it):

- `order`: plain `openai` calls; the first answers with a forced tool call,
  record_order(item, quantity), and the code formats its arguments into the next prompt
  as "Order: 2 x apple", which never holds the arguments' JSON;
- `currency`: a LangChain chain, RunnablePassthrough.assign(city=...) |
  RunnablePassthrough.assign(country=...) | currency, whose one-word city also stands in
  the input and whose country is shorter than the importer's evidence.
"""

from __future__ import annotations

import json

RECORD_ORDER = {"type": "function", "function": {
    "name": "record_order", "description": "Record the customer's order.",
    "parameters": {"type": "object", "properties": {
        "item": {"type": "string"}, "quantity": {"type": "integer"}},
        "required": ["item", "quantity"]}}}
ORDER_PROMPT = "Order desk: record the customer's order with record_order."
PRICE_PROMPT = "Price desk: reply with the order's total in euros, a number only."
CITY_PROMPT = "City desk: name the city the sentence is about. One word."
COUNTRY_PROMPT = "Country desk: name the country this city is in. One word."
CURRENCY_PROMPT = "Currency desk: name the currency used in this city. One word."


def order(text: str) -> str:
    from openai import OpenAI

    client = OpenAI()
    reply = client.chat.completions.create(
        model="fake", temperature=0, tools=[RECORD_ORDER],
        tool_choice={"type": "function", "function": {"name": "record_order"}},
        messages=[{"role": "system", "content": ORDER_PROMPT},
                  {"role": "user", "content": text}])
    args = json.loads(reply.choices[0].message.tool_calls[0].function.arguments)
    total = client.chat.completions.create(
        model="fake", temperature=0,
        messages=[{"role": "system", "content": PRICE_PROMPT},
                  {"role": "user", "content": f"Order: {args['quantity']} x {args['item']}"}])
    return (total.choices[0].message.content or "").strip()


def currency(text: str) -> str:
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model="fake", temperature=0, max_retries=0)

    def step(system: str, human: str):
        return ChatPromptTemplate.from_messages([("system", system), ("human", human)]) \
            | llm | StrOutputParser()

    chain = (RunnablePassthrough.assign(city=step(CITY_PROMPT, "{text}"))
             | RunnablePassthrough.assign(country=step(COUNTRY_PROMPT, "City: {city}"))
             | step(CURRENCY_PROMPT, "City: {city}\nCountry: {country}"))
    return chain.invoke({"text": text}).strip()


PRICES = {"apple": 0.5, "pear": 0.75, "plum": 0.25}
COUNTRIES = {"Lisbon": "Portugal", "Tokyo": "Japan", "Lima": "Peru", "Oslo": "Norway"}
CURRENCIES = {"Portugal": "euro", "Japan": "yen", "Peru": "sol", "Norway": "krone"}


def responder(body: dict) -> str | dict:
    """The model of both pipelines: each desk does as its prompt says."""
    import hashlib
    import re

    messages = body.get("messages", [])
    system = messages[0].get("content") or "" if messages else ""
    user = messages[-1].get("content") or "" if messages else ""
    if system == ORDER_PROMPT:
        count = re.search(r"(\d+)", user)
        item = next((i for i in PRICES if i in user), "apple")
        args = json.dumps({"item": item, "quantity": int(count.group(1)) if count else 1})
        digest = hashlib.sha256(user.encode()).hexdigest()[:12]
        return {"content": None, "tool_calls": [{"id": f"call_{digest}", "type": "function",
                                                 "function": {"name": "record_order",
                                                              "arguments": args}}]}
    if system == PRICE_PROMPT:
        found = re.search(r"Order: (\d+) x (\w+)", user)
        if not found:
            return "0"
        return f"{int(found.group(1)) * PRICES.get(found.group(2), 1.0):.2f}"
    if system == CITY_PROMPT:
        return next((c for c in COUNTRIES if c in user), "Lisbon")
    if system == COUNTRY_PROMPT:
        return COUNTRIES.get(user.removeprefix("City: ").strip(), "Spain")
    if system == CURRENCY_PROMPT:
        country = user.rpartition("Country: ")[2].strip()
        return CURRENCIES.get(country, "euro")
    return "ok"


TRIAGE_PROMPT = "Triage desk: say simple or hard for the question. One word."
EXPERT_PROMPT = "Expert desk: think the hard question through in one sentence."
ANSWER_PROMPT = "Answer desk: answer the question in one word."


def branching(text: str) -> str:
    """A triage call, an expert call only when triage says hard (a branch the recorded
    runs may never take), then the answer."""
    from openai import OpenAI

    client = OpenAI()

    def ask(system: str, user: str) -> str:
        reply = client.chat.completions.create(model="fake", temperature=0, messages=[
            {"role": "system", "content": system}, {"role": "user", "content": user}])
        return (reply.choices[0].message.content or "").strip()

    triage = ask(TRIAGE_PROMPT, text)
    notes = ask(EXPERT_PROMPT, text) if triage == "hard" else ""
    return ask(ANSWER_PROMPT, f"{text}\nTriage: {triage}\n{notes}".strip())


def branching_responder(body: dict) -> str:
    messages = body.get("messages", [])
    system = messages[0].get("content") or ""
    if system.startswith("Triage desk"):
        return "hard" if "always hard" in system else "simple"
    if system.startswith("Expert desk"):
        return "It needs care."
    return "yes"


def record_instrumented(name: str, texts: list[str], base_url: str, out) -> None:
    """Run pipeline `name` ("order" or "currency") on each text under its framework's own
    OpenInference instrumentor (OpenAI's, LangChain's), its spans to the OTLP JSON lines
    file `out`: the traces a user would import, with no gateway in between."""
    import os
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sample_graphs"))
    from otlp_export import tracer_provider

    provider = tracer_provider(out, f"flow_{name}")
    if name == "order":
        from openinference.instrumentation.openai import OpenAIInstrumentor as Instrumentor
    else:
        from openinference.instrumentation.langchain import (
            LangChainInstrumentor as Instrumentor,
        )
    Instrumentor().instrument(tracer_provider=provider)
    tracer = provider.get_tracer("flow_pipelines")
    saved = {k: os.environ.get(k) for k in ("OPENAI_BASE_URL", "OPENAI_API_KEY")}
    os.environ.update(OPENAI_BASE_URL=base_url, OPENAI_API_KEY="not-needed")
    try:
        for text in texts:
            if name == "order":  # one trace a pass: the two calls under one parent span
                with tracer.start_as_current_span("pipeline", attributes={
                        "openinference.span.kind": "CHAIN", "input.value": text}):
                    order(text)
            else:
                currency(text)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        Instrumentor().uninstrument()
        provider.shutdown()
