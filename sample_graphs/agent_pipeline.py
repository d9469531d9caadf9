"""A small travel agent written with the `openai` SDK and nothing else: no instrumentor, no
names for its stages. `python -m engine trace` and `optimize` run it through the gateway
(docs/pipelines.md), which sets OPENAI_BASE_URL:

    python -m engine optimize --pipeline sample_graphs/agent_pipeline.py:agent \\
        --data sample_graphs/data/agent_trips.jsonl --val 6 --steps 1 --base-url URL

Each example is a traveler's question ("I fly from Oslo to Madrid tomorrow. Should I pack
an umbrella?"); the answer is yes when it rains where they arrive. Two stages:

- the weather lookup runs a tool loop: the model calls get_weather(city), the code runs
  the tool, and the model states the weather in one sentence. Its prompt is at fault: it
  asks for the city the traveler leaves from, so the fix changes the tool call, which a
  replay of the recorded calls cannot show (it serves the recorded weather);
- the packing advice reads that sentence and answers yes or no.

The client is built when the module is imported, as many pipelines do.
"""

from __future__ import annotations

import json
import os

from openai import OpenAI

MODEL = os.environ.get("AGENT_MODEL", "default")
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


def look_up_weather(question: str, rounds: int = 3) -> str:
    messages: list[dict] = [{"role": "system", "content": PROMPTS["weather"]},
                            {"role": "user", "content": question}]
    content = ""
    for _ in range(rounds):
        reply = CLIENT.chat.completions.create(model=MODEL, temperature=0, max_tokens=128,
                                               tools=[GET_WEATHER], messages=messages)
        message = reply.choices[0].message
        content = (message.content or "").strip()
        if not message.tool_calls:
            break
        messages.append({"role": "assistant", "content": message.content, "tool_calls": [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in message.tool_calls]})
        for call in message.tool_calls:
            try:
                city = str(json.loads(call.function.arguments or "{}").get("city", ""))
            except (json.JSONDecodeError, AttributeError):
                city = ""
            messages.append({"role": "tool", "tool_call_id": call.id,
                             "content": get_weather(city)})
    return content


def agent(question: str) -> str:
    """The pipeline: the question in, yes or no out."""
    report = look_up_weather(question)
    reply = CLIENT.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=16,
        messages=[{"role": "system", "content": PROMPTS["packing"]},
                  {"role": "user", "content": f"Weather report: {report}"}])
    words = (reply.choices[0].message.content or "").strip().lower().split()
    return words[0].strip(".!,") if words else ""
