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
    the facts of the sentence; how the customer feels (the fault), or the coupon's value
    when told to give it; the payment worked out from the facts and whatever number the
    coupon's reply holds (none: nothing is taken off)."""
    messages = body.get("messages", [])
    system = messages[0].get("content") or "" if messages else ""
    if "Your output fields are:" not in system:
        return default_responder(body)
    names, objective = dspy_signature(system)
    inputs = chat_adapter_fields(messages[-1].get("content") or "")
    said = objective.lower()
    values: dict[str, str] = {}
    if "sentence" in inputs:
        sentence = inputs["sentence"]
        quantity = re.search(r"(\d+) (\w+) at (\d+) euros each", sentence)
        coupon = re.search(r"(\d+)-euro coupon", sentence)
        who = re.search(r"\b([A-Z][a-z]+) (?:bought|paid)", sentence)
        if "coupon" in said and coupon:
            answer = f"{coupon.group(1)} euros"
        elif "feel" in said:
            answer = (f"{who.group(1) if who else 'The customer'} is pleased with the "
                      f"{quantity.group(2) if quantity else 'purchase'}.")
        elif "quantity" in said and quantity:
            answer = f"quantity {quantity.group(1)}, unit price {quantity.group(3)} euros"
        else:
            answer = "The sentence does not say."
    elif "facts" in inputs:
        facts = _numbers(inputs["facts"])
        coupon = _numbers(inputs.get("coupon", ""))
        quantity, price = (facts + [0, 0])[:2]
        off = coupon[0] if coupon and "coupon" in said else 0
        total = quantity * price - off
        values["reasoning"] = (f"{quantity} times {price} is {quantity * price}; the coupon "
                               f"takes off {off}, which leaves {total}.")
        answer = str(total)
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
