"""A small travel agent written with the `openai` SDK and nothing else: no instrumentor, no
names for its stages. `python -m engine trace` and `optimize` run it through the gateway
(docs/pipelines.md), which sets OPENAI_BASE_URL:

    python -m engine optimize --pipeline sample_graphs/agent_pipeline.py:agent \\
        --data sample_graphs/data/agent_trips.jsonl --val 6 --steps 1 --base-url URL

Each example is a traveler's question ("I fly from Oslo to Madrid tomorrow. Should I pack
an umbrella?"); the answer is yes when it rains where they arrive. Two stages:

- the weather lookup runs a tool loop: the model calls get_weather(city), the code runs
  the tool, and the model states the weather in one sentence (a call a small model writes
  as JSON text instead of in its template's tool-call format is read as one). Its prompt is at fault: it
  asks for the city the traveler leaves from, so the fix changes the tool call, which a
  replay of the recorded calls cannot show (it serves the recorded weather);
- the packing advice reads that sentence and answers yes or no.

The client is built when the module is imported, as many pipelines do.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from openai import OpenAI

MODEL = os.environ.get("AGENT_MODEL", "default")
DATA = Path(__file__).parent / "data" / "agent_trips.jsonl"  # its examples, for --data
PROMPTS = {
    # the planted fault: the weather that matters is where the traveler arrives
    "weather": "Weather lookup: call get_weather for the city the traveler leaves from, "
               "then state that city's weather in one short sentence.",
    "packing": "Packing advice: read the weather report and answer yes if the traveler "
               "should pack an umbrella (it rains), else no. Answer with one word.",
}
WEATHER = {"oslo": "rain", "madrid": "sunny", "lisbon": "sunny", "bergen": "rain",
           "paris": "rain", "rome": "sunny", "dublin": "rain", "athens": "sunny",
           "london": "rain", "seville": "sunny", "amsterdam": "rain", "nice": "sunny"}
GET_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Today's weather in a city: rain or sunny.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "the city"}}, "required": ["city"]}}}

CLIENT = OpenAI(api_key=os.environ.get("OPENAI_API_KEY") or "not-needed")


def get_weather(city: str) -> str:
    """The tool: a city's weather today, or 'unknown'."""
    return WEATHER.get(city.strip().lower(), "unknown")


def text_tool_call(content: str, tools: list[dict] | None) -> list[dict]:
    """A tool call a small model wrote as text ({"name": ..., "arguments": {...}}) instead
    of in its chat template's tool-call format, read as the call it means."""
    names = {t["function"]["name"] for t in tools or []}
    try:
        said = json.loads(content.strip().removeprefix("```json").strip("`").strip())
    except json.JSONDecodeError:
        return []
    if not isinstance(said, dict) or said.get("name") not in names:
        return []
    return [{"id": "call_0", "type": "function", "function": {
        "name": said["name"], "arguments": json.dumps(said.get("arguments") or {})}}]


def ask(messages: list[dict], max_tokens: int, stream: bool,
        tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    """One model call: its reply's text and tool calls, read from a stream or not."""
    content, calls = _ask(messages, max_tokens, stream, tools)
    if tools and not calls:
        calls = text_tool_call(content, tools)
        if calls:
            content = ""
    return content, calls


def _ask(messages: list[dict], max_tokens: int, stream: bool,
         tools: list[dict] | None = None) -> tuple[str, list[dict]]:
    extra = {"tools": tools} if tools else {}
    if not stream:
        reply = CLIENT.chat.completions.create(model=MODEL, temperature=0,
                                               max_tokens=max_tokens, messages=messages,
                                               **extra)
        message = reply.choices[0].message
        return (message.content or "").strip(), [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls or []]
    text, calls = "", {}
    for chunk in CLIENT.chat.completions.create(model=MODEL, temperature=0, stream=True,
                                                max_tokens=max_tokens, messages=messages,
                                                **extra):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        text += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "type": "function",
                                                 "function": {"name": "", "arguments": ""}})
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["function"]["name"] += part.function.name or ""
                call["function"]["arguments"] += part.function.arguments or ""
    return text.strip(), [calls[i] for i in sorted(calls)]


def look_up_weather(question: str, stream: bool = False, rounds: int = 3) -> str:
    messages: list[dict] = [{"role": "system", "content": PROMPTS["weather"]},
                            {"role": "user", "content": question}]
    content = ""
    for _ in range(rounds):
        content, calls = ask(messages, 128, stream, [GET_WEATHER])
        if not calls:
            break
        messages.append({"role": "assistant", "content": content or None,
                         "tool_calls": calls})
        for call in calls:
            try:
                city = str(json.loads(call["function"]["arguments"] or "{}").get("city", ""))
            except (json.JSONDecodeError, AttributeError):
                city = ""
            messages.append({"role": "tool", "tool_call_id": call["id"],
                             "content": get_weather(city)})
    return content


def agent(question: str, stream: bool = False) -> str:
    """The pipeline: the question in, yes or no out."""
    report = look_up_weather(question, stream)
    advice, _ = ask([{"role": "system", "content": PROMPTS["packing"]},
                     {"role": "user", "content": f"Weather report: {report}"}], 16, stream)
    words = advice.lower().split()
    return words[0].strip(".!,") if words else ""


def agent_streaming(question: str) -> str:
    """The same pipeline, every reply streamed."""
    return agent(question, stream=True)
