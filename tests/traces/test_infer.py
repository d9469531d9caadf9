"""engine/traces/infer.py, one rule a test, on spans written here: call sites, prompt
templates, a predictor asked again through another adapter, flows by structure, by
content and by intervention, ambiguity, and the framework profiles' names."""

from __future__ import annotations

import json
from itertools import count

import pytest

from engine.traces import TraceError
from engine.traces.conventions import GENERIC_NAMES, signature_name
from engine.traces.infer import infer_pipeline
from engine.traces.otlp import Span

_ids = count(1)


def span(trace: int, name: str, parent: str = "", **attributes) -> Span:
    n = next(_ids)
    return Span(f"{trace:032x}", f"{n:016x}", parent, name, n * 10, n * 10 + 5, attributes)


def llm(trace: int, parent: str, system: str, user: str, reply: str, **extra) -> Span:
    return span(trace, "ChatCompletion", parent, **{
        "openinference.span.kind": "LLM",
        "llm.input_messages.0.message.role": "system",
        "llm.input_messages.0.message.content": system,
        "llm.input_messages.1.message.role": "user",
        "llm.input_messages.1.message.content": user,
        "llm.output_messages.0.message.role": "assistant",
        "llm.output_messages.0.message.content": reply, **extra})


def root(trace: int, text: str) -> Span:
    return span(trace, "pipeline", **{"openinference.span.kind": "CHAIN",
                                      "input.value": text})


def unit(trace: int, name: str, parent: Span, returned: str | None = None,
         received: dict | None = None) -> Span:
    attributes = {"openinference.span.kind": "CHAIN"}
    if returned is not None:
        attributes["output.value"] = returned
    if received is not None:
        attributes["input.value"] = json.dumps(received)
    return span(trace, name, parent.span_id, **attributes)


def two_step(trace: int, sentence: str, city: str, units: bool = False) -> list[Span]:
    """`city` names the city of the sentence; `weather` reads it in 'City: {city}'."""
    top = root(trace, sentence)
    spans = [top]
    first = unit(trace, "find_city", top, city, {"text": sentence}) if units else top
    second = unit(trace, "weather", top, "rain", {"city": city}) if units else top
    spans += [first, second] if units else []
    spans.append(llm(trace, first.span_id, "Name the city.", sentence, city))
    spans.append(llm(trace, second.span_id, "Say its weather.", f"City: {city}", "rain"))
    return spans


def test_call_sites_are_the_units_that_own_a_call_named_as_the_code_names_them():
    spans = two_step(1, "We flew to Amsterdam.", "Amsterdam", units=True)
    pipeline = infer_pipeline(spans)
    assert list(pipeline.nodes) == ["find_city", "weather"]
    assert pipeline.nodes["find_city"].prompt == "Name the city."


def test_calls_with_no_unit_are_told_apart_by_their_prompts_first_words():
    pipeline = infer_pipeline(two_step(1, "We flew there.", "Amsterdam"))
    assert list(pipeline.nodes) == ["name", "say"]


def test_a_long_enough_reply_in_a_later_call_is_a_flow_by_content():
    pipeline = infer_pipeline(two_step(1, "We flew there.", "Amsterdam"))
    assert pipeline.edges == [("name", "say")]
    assert pipeline.found_by == {("name", "say"): "content"}


def test_a_short_reply_is_no_evidence_and_the_refusal_says_so():
    with pytest.raises(TraceError) as refused:
        infer_pipeline(two_step(1, "We flew there.", "Oslo"))
    assert "feed no later call" in str(refused.value)
    assert "name -> say: a text shorter than 8 characters is no evidence of flow" in \
        str(refused.value)


def test_a_reply_that_also_stands_in_the_input_is_no_evidence_either():
    with pytest.raises(TraceError, match="the text is also in the pipeline's input"):
        infer_pipeline(two_step(1, "We flew to Amsterdam.", "Amsterdam"))


def test_a_value_one_unit_returned_and_the_next_received_is_a_flow_however_short():
    pipeline = infer_pipeline(two_step(1, "We flew to Oslo.", "Oslo", units=True))
    assert pipeline.edges == [("find_city", "weather")]
    assert pipeline.found_by == {("find_city", "weather"): "structure"}


def test_a_flow_the_pipeline_showed_by_intervention_is_an_edge_the_content_lacks():
    spans = two_step(1, "We flew to Oslo.", "Oslo")
    with pytest.raises(TraceError):  # the short city is also in the input: no flow
        infer_pipeline(spans)
    pipeline = infer_pipeline(spans, flows={("Name the city.", "Say its weather.")})
    assert pipeline.edges == [("name", "say")]
    assert pipeline.found_by == {("name", "say"): "intervention"}
    assert pipeline.ambiguous == []
    # the value is a slot where the call holds it: a re-run substitutes it there
    assert pipeline.traces[0].templates["say"][0]["parts"] == ["City: ", {"slot": "name"}]


def test_a_prompt_template_is_the_prompt_and_its_variables_each_traces_own():
    spans = []
    for trace, shop in ((1, "Corner"), (2, "Deli")):
        top = root(trace, f"order at {shop}")
        spans += [top, llm(trace, top.span_id, f"You serve at {shop}.", "tea", "ok", **{
            "llm.prompt_template.template": "You serve at {shop}.",
            "llm.prompt_template.variables": json.dumps({"shop": shop})})]
    pipeline = infer_pipeline(spans)
    (node,) = pipeline.nodes.values()
    assert node.prompt == "You serve at {shop}."
    assert [t.templates[node.id]["system"] for t in pipeline.traces] == [
        {"variables": {"shop": "Corner"}}, {"variables": {"shop": "Deli"}}]


def test_a_system_message_that_varies_without_a_template_is_refused():
    spans = []
    for trace, shop in ((1, "Corner"), (2, "Deli")):
        top = root(trace, f"order at {shop}")
        spans += [top, llm(trace, top.span_id, f"You serve at {shop}.", "tea", "ok")]
    with pytest.raises(TraceError):
        infer_pipeline(spans)


def test_a_predictor_asked_again_through_another_adapter_is_one_node_its_last_call():
    top = root(1, "Lena packed 7 boxes.")
    predictor = unit(1, "Predict(NoteSentence).forward", top, json.dumps({"note": "7"}))
    chat = span(1, "ChatAdapter.__call__", predictor.span_id)
    retry = span(1, "JSONAdapter.__call__", predictor.span_id)
    system = ("Your input fields are...\nIn adhering to this structure, your objective is: "
              "\n        Give the number.")
    spans = [top, predictor, chat,
             llm(1, chat.span_id, system, "Lena packed 7 boxes.", "seven, I think"), retry,
             llm(1, retry.span_id, system.replace("fields are", "JSON fields are"),
                 "Lena packed 7 boxes.", '{"note": "7"}')]
    pipeline = infer_pipeline(spans)
    assert list(pipeline.nodes) == ["note_sentence"]
    assert pipeline.nodes["note_sentence"].prompt == "Give the number."
    assert pipeline.traces[0].values["note_sentence"] == "7"


def test_the_profiles_name_the_frameworks_machinery_and_signatures():
    for name in ("RunnableSequence", "ChatPromptTemplate", "StrOutputParser", "ChatOpenAI",
                 "ChatAdapter.__call__", "LM.__call__", "Predict(StringSignature).forward",
                 "ChatCompletion"):
        assert GENERIC_NAMES.match(name), name
    assert not GENERIC_NAMES.match("find_city")
    assert signature_name("Predict(NoteSentence).forward") == "NoteSentence"
    assert signature_name("find_city") is None
