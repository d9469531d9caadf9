"""Literal-minded models for the framework example pipelines (sample_graphs/
dspy_pipeline.py, langchain_pipeline.py, openai_tools_pipeline.py), served by
tests/support/fake_openai.py's FakeOpenAIServer.

Each reply depends on the prompt as a model's does: a step told the right thing gives the
right value; the planted fault's prompt gives the wrong but plausible value it asks for;
a repaired prompt gives the right one again. Requests that are none of the pipelines'
(an optimizer's backward or update calls) get tests.support.fake_openai's default reply.
"""

from __future__ import annotations

import hashlib
import json
import re

from tests.support.fake_openai import default_responder

# -- DSPy (ChatAdapter's format) --------------------------------------------------------


def chat_adapter_fields(text: str) -> dict[str, str]:
    """The `[[ ## name ## ]]` sections of a ChatAdapter message, name to value."""
    parts = re.split(r"\[\[ ## (\w+) ## \]\]\n?", text)
    fields = {}
    for name, value in zip(parts[1::2], parts[2::2]):
        fields[name] = value.split("\n\nRespond with")[0].strip()
    return fields


def chat_adapter_reply(values: dict[str, str]) -> str:
    """A reply in ChatAdapter's format: each field's section, then the completed marker."""
    return "".join(f"[[ ## {name} ## ]]\n{value}\n\n" for name, value in values.items()) \
        + "[[ ## completed ## ]]"


def dspy_signature(system: str) -> tuple[list[str], str]:
    """A ChatAdapter system message's output field names and its instructions."""
    outputs = system.split("Your output fields are:", 1)[-1].split("All interactions", 1)[0]
    names = re.findall(r"^\d+\. `(\w+)`", outputs, flags=re.M)
    objective = system.split("your objective is:", 1)[-1]
    return names, " ".join(objective.split())


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", text)]


def dspy_responder(body: dict) -> str:
    """sample_graphs/dspy_pipeline.py's predictors as a literal-minded model runs them:
    the sentence's predictor writes its mood in a word, no digits (the fault: calm or
    happy), or the sentence's first number when told to give the number or how many; the
    question's predictor names what the question asks about (boxes); the answer predictor
    reasons, then copies the first number its inputs hold (none when they hold none)."""
    messages = body.get("messages", [])
    system = messages[0].get("content") or "" if messages else ""
    if "Your output fields are:" not in system:
        return default_responder(body)
    names, objective = dspy_signature(system)
    # the input fields only: the closing "Respond with ..." names the outputs' markers
    inputs = {name: value for name, value in
              chat_adapter_fields(messages[-1].get("content") or "").items()
              if name not in names and name != "completed"}
    said = objective.lower()
    values: dict[str, str] = {}
    if "sentence" in inputs:
        sentence = inputs["sentence"]
        numbers = _numbers(sentence)
        if ("number" in said or "how many" in said) and numbers:
            answer = str(numbers[0])
        elif "mood" in said:
            answer = "calm" if sentence.startswith("The ") else "happy"
        else:
            answer = "The sentence does not say."
    elif "question" in inputs:
        asked = re.search(r"how many (.+?)\??$", inputs["question"].strip(), flags=re.I)
        answer = asked.group(1) if asked and "thing" in said else "I cannot tell."
    elif "note" in inputs:
        found = [(name, n) for name, value in inputs.items() for n in _numbers(value)]
        if found:
            name, number = found[0]
            values["reasoning"] = f"The {name} gives the number {number}, so I copy it."
            answer = str(number)
        else:
            values["reasoning"] = "Neither the thing nor the note holds a number."
            answer = "none"
    else:
        answer = "I cannot tell."
    for name in names:
        values.setdefault(name, answer)
    return chat_adapter_reply({name: values[name] for name in names})


# -- LangChain --------------------------------------------------------------------------

CITY_COUNTRY = {"Lima": "Peru", "Rome": "Italy", "Toronto": "Canada", "Dakar": "Senegal",
                "Osaka": "Japan", "Sydney": "Australia", "Madrid": "Spain", "Cairo": "Egypt",
                "Quito": "Ecuador", "Vancouver": "Canada", "Lisbon": "Portugal",
                "Casablanca": "Morocco", "Melbourne": "Australia", "Luanda": "Angola",
                "Seoul": "Korea", "Bogota": "Colombia", "Berlin": "Germany"}
CITY_LANGUAGE = {"Lima": "Spanish", "Rome": "Italian", "Toronto": "English", "Dakar": "French",
                 "Osaka": "Japanese", "Sydney": "English", "Madrid": "Spanish",
                 "Cairo": "Arabic", "Quito": "Spanish", "Vancouver": "English",
                 "Lisbon": "Portuguese", "Casablanca": "Arabic", "Melbourne": "English",
                 "Luanda": "Portuguese", "Seoul": "Korean", "Bogota": "Spanish",
                 "Berlin": "German"}
CONTINENT = {"Peru": "America", "Italy": "Europe", "Canada": "America", "Senegal": "Africa",
             "Japan": "Asia", "Australia": "Oceania", "Spain": "Europe", "Egypt": "Africa",
             "Ecuador": "America", "Portugal": "Europe", "Morocco": "Africa",
             "Angola": "Africa", "Korea": "Asia", "Colombia": "America", "Germany": "Europe",
             # a language's continent: where the literal model places what it is given
             "Spanish": "Europe", "Italian": "Europe", "English": "Europe",
             "French": "Europe", "Portuguese": "Europe", "German": "Europe",
             "Japanese": "Asia", "Korean": "Asia", "Arabic": "Asia"}


def langchain_responder(body: dict) -> str:
    """sample_graphs/langchain_pipeline.py's steps, one word each: the city the sentence
    names; the language spoken there (the fault), or its country when asked for that; the
    continent of what it is given (a language's: Europe for English)."""
    messages = body.get("messages", [])
    if len(messages) < 2:
        return default_responder(body)
    system = (messages[0].get("content") or "").lower()
    user = messages[-1].get("content") or ""
    given = user.split(":", 1)[-1].strip().rstrip(".")
    if "continent" in system:
        return CONTINENT.get(given, "Europe")
    if "language" in system:
        return CITY_LANGUAGE.get(given, "English")
    if "country" in system:
        return CITY_COUNTRY.get(given, "Unknown")
    if "city" in system:
        return next((city for city in CITY_COUNTRY if city in user), "Unknown")
    return default_responder(body)


# -- openai SDK with tools ----------------------------------------------------------------

ITEMS = ("olive oil", "rice", "honey", "coffee", "tea", "bread", "flour", "milk", "jam",
         "chocolate", "pasta", "lentils", "tomatoes", "vinegar")


def tool_call(name: str, arguments: dict, salt: str = "") -> dict:
    """An OpenAI tool call (the id a digest of the call and `salt`)."""
    args = json.dumps(arguments)
    digest = hashlib.sha256(f"{name}{args}{salt}".encode()).hexdigest()[:12]
    return {"id": f"call_{digest}", "type": "function",
            "function": {"name": name, "arguments": args}}


def openai_tools_responder(body: dict) -> str | dict:
    """sample_graphs/openai_tools_pipeline.py's stages: record_order with the item and, as
    its prompt asks, how many the customer has at home (the fault) or how many they order;
    the cashier asks for lookup_price until a tool result is there, then replies with the
    total (or only the unit price, if told to)."""
    messages = body.get("messages", [])
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    system = (messages[0].get("content") or "").lower() if messages else ""
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    if "record_order" in tools:
        text = users[-1] if users else ""
        item = next((i for i in ITEMS if i in text), "")
        have = re.search(r"I have (\d+)", text)
        send = re.search(r"send (\d+)", text)
        at_home = "at home" in system or "still have" in system
        chosen = have if at_home else send
        return {"content": None, "tool_calls": [tool_call(
            "record_order", {"item": item, "quantity": int(chosen.group(1)) if chosen else 1},
            text)]}
    if "lookup_price" in tools:
        try:
            order = json.loads(users[-1].split("Order:", 1)[1]) if users else {}
        except (IndexError, json.JSONDecodeError):
            order = {}
        results = [m.get("content") or "" for m in messages if m.get("role") == "tool"]
        if not results:
            return {"content": None, "tool_calls": [tool_call(
                "lookup_price", {"item": order.get("item", "")}, users[-1] if users else "")]}
        try:
            price = float(results[-1])
        except ValueError:
            return "I could not find the price."
        if "total" in system:
            return f"{int(order.get('quantity') or 0) * price:.2f}"
        return f"{price:.2f}"
    return default_responder(body)


TRIP = re.compile(r"from (\w+) to (\w+)")
AGENT_WEATHER = {"oslo": "rain", "madrid": "sunny", "lisbon": "sunny", "bergen": "rain",
                 "paris": "rain", "rome": "sunny", "dublin": "rain", "athens": "sunny",
                 "london": "rain", "seville": "sunny", "amsterdam": "rain", "nice": "sunny"}
FIXED_PHRASE = "the city the traveler arrives in"


def agent_responder(body: dict) -> str | dict:
    """sample_graphs/agent_pipeline.py's stages, as a model would answer them: the weather
    lookup calls get_weather for the city its prompt names (where the traveler leaves
    from: the fault; or arrives in), then states the weather the tool returned; the packing
    advice says yes when the report says rain. An update call for the weather lookup
    proposes the fix (the arrival city); for any other step, its prompt as it was."""
    messages = body.get("messages", [])
    tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
    system = (messages[0].get("content") or "") if messages else ""
    users = [m.get("content") or "" for m in messages if m.get("role") == "user"]
    if "get_weather" in tools:
        results = [m for m in messages if m.get("role") == "tool"]
        if results:
            asked = [c for m in messages if m.get("role") == "assistant"
                     for c in m.get("tool_calls") or []]
            city = json.loads(asked[-1]["function"]["arguments"]).get("city", "") \
                if asked else ""
            return f"The weather in {city} is {results[-1].get('content')}."
        trip = TRIP.search(users[-1] if users else "")
        arrives = "arrive" in system.lower() or "destination" in system.lower()
        city = (trip.group(2) if arrives else trip.group(1)) if trip else ""
        return {"content": None, "tool_calls": [tool_call("get_weather", {"city": city},
                                                          users[-1] if users else "")]}
    if system.startswith("Packing advice"):
        return "yes" if "rain" in (users[-1] if users else "").lower() else "no"
    if "rewrite one step's output" in system.lower():  # a gradient probe's rewrite
        said = re.search(r"<output>\n?(.*?)\n?</output>", users[-1], re.S) if users else None
        output = said.group(1).strip() if said else ""
        trip = TRIP.search(users[-1])
        if output.startswith("The weather in") and trip:  # the lookup, done right
            city = trip.group(2)
            return f"<output>The weather in {city} is {AGENT_WEATHER[city.lower()]}.</output>"
        return f"<output>{output}</output>"  # a yes or no: nothing in it to change
    step = re.search(r'improving the prompt of the step "(\w+)"', users[-1] if users else "")
    if step:
        current = re.search(r"<prompt>\n?(.*?)\n?</prompt>", users[-1], re.S)
        prompt = current.group(1).strip() if current else ""
        if "leaves from" in prompt:
            prompt = prompt.replace("the city the traveler leaves from", FIXED_PHRASE)
            return ("The lookup asked for the departure city; the advice needs the "
                    f"weather where the traveler arrives.\n<prompt>{prompt}</prompt>")
        return f"The step did what it was asked.\n<prompt>{prompt}</prompt>"
    return ("The weather lookup reported the city the traveler leaves from; the advice "
            "needed the weather where they arrive. <output>yes</output>")
