"""Flows the content cannot show, on the framework instrumentors' own spans (no gateway):
a forced tool call whose arguments the code formats into the next prompt is refused with
the flows it considered, and imports with `--edge FROM:TO`; a LangChain `assign` chain's
one-word values are flows by structure (its prompt template's variables); nodes are named
by the `assign` key, by the role a prompt gives, or by the tool."""

from __future__ import annotations

import json

import pytest

from engine.cli.commands import main
from engine.traces.names import SiteName, node_ids, role_name
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.flow_pipelines import record_instrumented, responder

ORDERS = ["Please send 3 apples.", "I would like 2 pears.", "4 plums, thanks."]
CITIES = ["We spent a week in Lisbon last spring.", "Tokyo was loud and bright.",
          "The flight to Lima took all day."]


@pytest.fixture(scope="module")
def spans(tmp_path_factory):
    """The two pipelines' spans, as their instrumentors (OpenAI's, LangChain's) write them."""
    folder = tmp_path_factory.mktemp("instrumented")
    with FakeOpenAIServer(responder=responder) as server:
        record_instrumented("order", ORDERS, server.base_url, folder / "order.jsonl")
        record_instrumented("currency", CITIES, server.base_url, folder / "currency.jsonl")
    return folder


def test_a_forced_tool_call_is_refused_with_the_flows_it_considered(spans, tmp_path, capsys):
    db = tmp_path / "runs.duckdb"
    code = main(["import-traces", str(spans / "order.jsonl"), "--db", str(db), "--json"])
    said = capsys.readouterr()
    assert code == 2 and said.err.startswith("error:") and "Traceback" not in said.err
    # the arguments' values are in the price call, but "apple" is also in the input: the
    # message and the JSON both say which flow was considered and why it was not taken
    assert "order -> price: the text is also in the pipeline's input ('apple') in 3 of 3 " \
           "traces" in said.err and "--edge FROM:TO" in said.err
    error = json.loads(said.out)
    assert error["candidates"] == [{"from": "order", "to": "price", "text": "apple",
                                    "reason": "the text is also in the pipeline's input",
                                    "traces": 3}]
    assert not db.exists()  # refused before anything was written


def test_a_declared_edge_imports_the_forced_tool_call(spans, tmp_path, capsys):
    db = str(tmp_path / "runs.duckdb")
    assert main(["import-traces", str(spans / "order.jsonl"), "--db", db,
                 "--edge", "order:price", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [n["id"] for n in got["nodes"]] == ["order", "price"]
    assert got["edges"] == [["order", "price"]]
    assert got["edge_sources"] == {"order->price": "declaration"}
    assert got["ambiguous"] == []  # the declared flow answers what the content left open


@pytest.mark.parametrize("edge, says", [
    ("price:order", "trace [0-9a-f]{32} contradicts it: 'order' was called before 'price' "
                    "answered"),
    ("order:invoice", "no call site is named 'invoice' \\(the call sites: order, price\\)"),
    ("order", "expected FROM:TO")])
def test_a_declared_edge_the_traces_contradict_is_refused(spans, tmp_path, capsys, edge, says):
    import re

    db = tmp_path / "runs.duckdb"
    assert main(["import-traces", str(spans / "order.jsonl"), "--db", str(db),
                 "--edge", edge]) == 2
    err = capsys.readouterr().err
    assert re.search(says, err) and err.count("\n") == 1
    assert not db.exists()  # refused before anything was written


def test_an_assign_chain_gets_every_edge_from_its_templates_variables(spans, tmp_path,
                                                                      capsys):
    got = json.loads((main(["import-traces", str(spans / "currency.jsonl"), "--db",
                            str(tmp_path / "runs.duckdb"), "--json"]), capsys.readouterr()
                      )[1].out)
    # named by the assign keys the code gave them; the last step by what it is told to do
    assert [n["id"] for n in got["nodes"]] == ["city", "country", "currency"]
    # "Lisbon" is also in the input and "Peru" is short: the content alone could not
    # tell, the currency prompt's template variables could
    assert sorted(map(tuple, got["edges"])) == [("city", "country"), ("city", "currency"),
                                                ("country", "currency")]
    assert set(got["edge_sources"].values()) == {"structure"}
    assert got["ambiguous"] == []


@pytest.mark.parametrize("prompt, name", [
    ("You are a travel helper. Look up the weather.", "travel_helper"),
    ("You are the order assistant of {shop}.", "order_assistant"),
    ("you are an expert cashier who adds prices", "expert_cashier"),
    ("Weather lookup: call get_weather.", None)])
def test_a_role_prompt_names_its_call_by_the_role(prompt, name):
    assert role_name(prompt) == name


def test_unnamed_calls_are_named_by_role_words_or_tool_and_kept_apart():
    sites = [SiteName(("ChatCompletion", "You are a travel helper. Use the tool."),
                      "ChatCompletion", False, "You are a travel helper. Use the tool.",
                      "get_weather"),
             SiteName(("ChatCompletion", "Packing advice: answer yes or no."), "ChatCompletion",
                      False, "Packing advice: answer yes or no."),
             SiteName(("ChatCompletion", ""), "ChatCompletion", False, "", "get_weather"),
             SiteName(("unit", "city"), "city", True),
             SiteName(("summarize", "Sum up A."), "summarize", False, "Sum up A."),
             SiteName(("summarize", "Sum up B."), "summarize", False, "Sum up B.")]
    assert list(node_ids(sites).values()) == [
        "travel_helper", "packing", "get_weather", "city", "sum_up_a", "sum_up_b"]
