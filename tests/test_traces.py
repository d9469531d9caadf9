"""import-traces: a pipeline's OTLP JSON spans become a run (engine/traces)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import duckdb
import pytest

from engine.cli.commands import main
from tests.support.otlp_traces import (
    SYSTEMS,
    chain_span,
    hex_id,
    llm_span,
    three_call_trace,
    write_lines,
)

SENTENCES = [("Lena packed 7 boxes for the trip.", "7"),
             ("Omar planted 12 trees in the garden.", "12"),
             ("The bus waited for 5 minutes.", "5"),
             ("Nina baked 9 pies for the fair.", "9")]


def example_spans(right: int = 0) -> list[dict]:
    """Four traces of the three-call pipeline; the first `right` count the number right."""
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES):
        value = int(n) if i < right else 2 * int(n)
        spans += three_call_trace(i, sentence, f"The number is {value}.",
                                  f"Topic: {sentence.split()[1]} and things", str(value))
    return spans


def targets_file(tmp_path: Path) -> Path:
    path = tmp_path / "targets.jsonl"
    path.write_text("".join(json.dumps({"input": s, "target": n}) + "\n"
                            for s, n in SENTENCES), encoding="utf-8")
    return path


def run_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_example_shape_imports_as_three_calls_and_two_flows(tmp_path, capsys):
    traces = write_lines(tmp_path / "t.jsonl", example_spans(right=1))
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(traces), "--db", str(db),
                   "--targets", str(targets_file(tmp_path)), "--metric", "numeric")
    assert [(n["id"], n["calls"], n["prompt"]) for n in got["nodes"]] == [
        ("you_count", 4, SYSTEMS["count"]), ("you_name", 4, SYSTEMS["topic"]),
        ("you_give", 4, SYSTEMS["answer"])]
    assert got["edges"] == [["you_count", "you_give"], ["you_name", "you_give"]]
    assert (got["traces"], got["scored"], got["failing"], got["ambiguous"]) == (4, 4, 3, [])
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT example_id, node_id, output_text FROM node_outputs "
                           "WHERE run_id = ? AND node_id = 'you_give' ORDER BY example_id",
                           [got["run_id"]]).fetchall()
        scores = con.execute("SELECT score FROM losses WHERE run_id = ? ORDER BY example_id",
                             [got["run_id"]]).fetchall()
        inputs = {r[0] for r in con.execute(
            "SELECT json_extract_string(fields, '$.input') FROM examples WHERE run_id = ?",
            [got["run_id"]]).fetchall()}
    assert sorted(r[2] for r in rows) == ["10", "18", "24", "7"]  # the recorded replies
    assert sorted(s[0] for s in scores) == [0.0, 0.0, 0.0, 1.0]
    assert inputs == {s for s, _ in SENTENCES}  # the root span's input.value


def test_the_recorded_messages_are_the_nodes_forward_messages(tmp_path, capsys):
    """Rendering a node's template with the logged values gives back the recorded call:
    the run's calls carry the pipeline's own messages, answered from the trace."""
    traces = write_lines(tmp_path / "t.jsonl", example_spans())
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(traces), "--db", str(db))
    with duckdb.connect(str(db), read_only=True) as con:
        calls = con.execute("SELECT node_id, messages, response, backend, model FROM llm_calls "
                            "WHERE run_id = ? AND example_id = ? ORDER BY node_id",
                            [got["run_id"], hex_id("trace-0", 32)]).fetchall()
        splits = con.execute("SELECT DISTINCT split FROM examples WHERE run_id = ?",
                             [got["run_id"]]).fetchall()
        # the pipeline read each reply whole: no output-tag fallback is reported
        fallbacks = con.execute("SELECT count(*) FROM node_outputs WHERE run_id = ? AND "
                                "parse_error IS NOT NULL", [got["run_id"]]).fetchall()
    answer = next(c for c in calls if c[0] == "you_give")
    assert json.loads(answer[1]) == [
        {"role": "system", "content": SYSTEMS["answer"]},
        {"role": "user", "content": "Count note: The number is 14.\nTopic: Topic: packed and things"}]
    assert answer[2:] == ("14", "openai", "fake-model")
    assert (got["scored"], got["failing"], splits) == (0, 0, [("unscored",)])
    assert fallbacks == [(0,)]


def _keyed_spans(template: bool) -> list[dict]:
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES[:2]):
        trace = f"k{i}"
        for j, (site, system, user, out) in enumerate([
                ("counter", f"Count for request {i}.", sentence, f"The number is {n}."),
                ("final", f"Answer for request {i}.", f"Note: The number is {n}.", n)]):
            extra = {"app.step": site}
            if template:  # OpenInference's using_prompt_template records these
                extra.update({"llm.prompt_template.template": system.replace(str(i), "{request}"),
                              "llm.prompt_template.variables": json.dumps({"request": str(i)})})
            spans.append(llm_span(trace, "chat", system, user, out, j + 1, extra=extra))
    return spans


def test_a_system_message_that_varies_without_a_template_is_refused_not_frozen(
        tmp_path, existing_log, capsys):
    """Each trace sends its own system message ("...request 0.", "...request 1."): taking
    the first trace's as the node's prompt would send request 0's text for every trace."""
    traces = write_lines(tmp_path / "t.jsonl", _keyed_spans(template=False))
    out = _refused(capsys, existing_log, str(traces), "--node-key", "app.step")
    assert "call 'counter': its prompt differs across traces" in out
    assert "using_prompt_template" in out


def test_a_node_key_attribute_names_the_call_sites_and_a_template_is_the_prompt(
        tmp_path, capsys):
    traces = write_lines(tmp_path / "t.jsonl", _keyed_spans(template=True))
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(traces), "--db", str(db),
                   "--node-key", "app.step")
    assert [n["id"] for n in got["nodes"]] == ["counter", "final"]
    assert got["edges"] == [["counter", "final"]]
    assert [n["prompt"] for n in got["nodes"]] == ["Count for request {request}.",
                                                   "Answer for request {request}."]
    # each trace's call is sent again with its own variables, never trace 0's
    with duckdb.connect(str(db), read_only=True) as con:
        sent = con.execute("SELECT example_id, messages FROM llm_calls WHERE run_id = ? AND "
                           "node_id = 'counter' ORDER BY example_id",
                           [got["run_id"]]).fetchall()
    systems = {e: json.loads(m)[0]["content"] for e, m in sent}
    assert systems == {hex_id("k0", 32): "Count for request 0.",
                       hex_id("k1", 32): "Count for request 1."}


def test_ambiguous_flows_are_reported_not_guessed(tmp_path, capsys):
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES[:2]):
        trace = f"a{i}"
        same = f"The sentence counts {n} things."
        spans += [llm_span(trace, "chat", "First reader.", sentence, same, 1),
                  llm_span(trace, "chat", "Second reader.", sentence, same, 2),
                  llm_span(trace, "chat", "Short one.", sentence, "ok", 3),
                  llm_span(trace, "chat", "Final.", f"Notes: {same} / ok", n, 4)]
    traces = write_lines(tmp_path / "t.jsonl", spans)
    code = main(["import-traces", str(traces), "--db", str(tmp_path / "r.duckdb"), "--json"])
    said = capsys.readouterr()
    out = said.err
    # with both flows refused, three calls feed nothing: no final call can be named; the
    # error itself says why each flow was not taken, and its JSON lists them
    assert code == 2 and out.startswith("error:")
    assert "first, second, short" in out and "Flows considered and not taken" in out
    assert "--edge FROM:TO" in out
    assert "the same text came from 2 calls" in out
    assert "a text shorter than 8 characters is no evidence of flow" in out
    error = json.loads(said.out)
    assert error["error"] in out and {a["reason"] for a in error["ambiguous"]} == {
        "the same text came from 2 calls",
        "a text shorter than 8 characters is no evidence of flow"}


def test_an_ambiguous_flow_beside_clear_ones_is_listed_in_the_json(tmp_path, capsys):
    """In one trace the reader's reply is too short to be evidence; another trace shows the
    flow plainly: the edge comes from that trace, the doubt is listed with its trace."""
    spans = []
    for i, reply in enumerate(["It counts 7 things here.", "ok"]):
        trace = f"b{i}"
        spans += [llm_span(trace, "chat", "Reader.", SENTENCES[i][0], reply, 1),
                  llm_span(trace, "chat", "Final.", f"Note: {reply}", SENTENCES[i][1], 2)]
    traces = write_lines(tmp_path / "t.jsonl", spans)
    got = run_json(capsys, "import-traces", str(traces), "--db", str(tmp_path / "r.duckdb"))
    assert got["edges"] == [["reader", "final"]]
    assert got["ambiguous"] == [{"trace_id": hex_id("b1", 32), "from": ["reader"],
                                 "to": "final", "text": "ok", "reason": "a text shorter than "
                                 "8 characters is no evidence of flow"}]


def test_a_reply_that_repeats_the_input_is_no_evidence_of_flow(tmp_path, capsys):
    """A small model's `who` call echoed the sentence: the echo stands in `numbers`'s
    message only because the sentence does. Seen on the embedded model."""
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES[:2]):
        trace = f"e{i}"
        who = sentence if i == 0 else f"It is about someone, case {i}."
        numbers = f"The numbers are {n} and {n}."
        spans += [chain_span(trace, "pipeline", sentence),
                  llm_span(trace, "chat", "Who.", f"Text: {sentence}", who, 1),
                  llm_span(trace, "chat", "Numbers.", f"Text: {sentence}", numbers, 2),
                  llm_span(trace, "chat", "Total.", f"Note: {who}\nNumbers: {numbers}", n, 3)]
    traces = write_lines(tmp_path / "t.jsonl", spans)
    got = run_json(capsys, "import-traces", str(traces), "--db", str(tmp_path / "r.duckdb"))
    assert got["edges"] == [["numbers", "total"], ["who", "total"]]
    assert {(a["from"][0], a["to"], a["reason"]) for a in got["ambiguous"]} == {
        ("who", "numbers", "the text is also in the pipeline's input"),
        ("who", "total", "the text is also in the pipeline's input")}


def test_re_runs_ask_for_the_token_limit_the_pipeline_asked_for(tmp_path, capsys):
    """The run's forward limit is the largest max_tokens the calls' invocation parameters
    recorded (the replayed calls are keyed with it, so a probe's re-run asks for it too);
    the settings for the user's model given to import-traces are the run's."""
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES[:2]):
        trace = f"m{i}"
        note = f"The number is {n}."
        spans += [llm_span(trace, "chat", "Counter.", sentence, note, 1, extra={
                      "llm.invocation_parameters": json.dumps({"max_tokens": 48})}),
                  llm_span(trace, "chat", "Final.", f"Note: {note}", n, 2, extra={
                      "llm.invocation_parameters": json.dumps({"max_tokens": 64,
                                                               "temperature": 0})})]
    traces = write_lines(tmp_path / "t.jsonl", spans)
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(traces), "--db", str(db), "--concurrency",
                   "4", "--timeout", "600", "--optimizer-max-tokens", "256")
    with duckdb.connect(str(db), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs WHERE run_id = ?",
                                        [got["run_id"]]).fetchone()[0])
        limits = con.execute("SELECT DISTINCT max_tokens FROM llm_calls WHERE run_id = ?",
                             [got["run_id"]]).fetchall()
    assert limits == [(64,)]
    assert (config["max_tokens"], config["concurrency"], config["timeout"],
            config["optimizer_max_tokens"]) == (64, 4, 600.0, 256)


# --- bad input: one line, status 2, the run log untouched --------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def existing_log(tmp_path, capsys) -> Path:
    """A run log with one imported run in it already."""
    db = tmp_path / "log.duckdb"
    traces = write_lines(tmp_path / "ok.jsonl", example_spans())
    assert main(["import-traces", str(traces), "--db", str(db)]) == 0
    capsys.readouterr()
    return db


def _refused(capsys, db: Path, *argv: str) -> str:
    before = _digest(db)
    assert main(["import-traces", *argv, "--db", str(db)]) == 2
    captured = capsys.readouterr()
    out = captured.err
    assert out.startswith("error: ") and out.count("\n") == 1 and not captured.out, out
    assert _digest(db) == before
    return out


def test_a_file_that_is_not_otlp_is_refused(tmp_path, existing_log, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text('{"spans": []}\n', encoding="utf-8")
    assert "not OTLP JSON" in _refused(capsys, existing_log, str(path))
    path.write_text("hello\n", encoding="utf-8")
    assert "x.jsonl:1: not OTLP JSON" in _refused(capsys, existing_log, str(path))


def test_spans_without_llm_calls_are_refused(tmp_path, existing_log, capsys):
    path = write_lines(tmp_path / "x.jsonl", [chain_span("c", "pipeline", "hello")])
    assert "no LLM spans" in _refused(capsys, existing_log, str(path))


def test_several_unrelated_pipelines_are_refused(tmp_path, existing_log, capsys):
    other = [llm_span(f"o{i}", "chat", "Translate to French.", f"Sentence {i} here.",
                      f"Phrase {i} ici.", 1) for i in range(2)]
    path = write_lines(tmp_path / "x.jsonl", example_spans() + other)
    assert "several unrelated pipelines" in _refused(capsys, existing_log, str(path))


def test_a_trace_whose_content_flows_in_a_cycle_is_refused(tmp_path, existing_log, capsys):
    spans = [llm_span("cy", "chat", "Draft.", "Write about boats.", "Boats float on water.", 1),
             llm_span("cy", "chat", "Edit.", "Edit: Boats float on water.",
                      "Boats float well on water.", 2),
             llm_span("cy", "chat", "Draft.", "Write about: Boats float well on water.",
                      "Boats float on rivers too.", 3)]
    path = write_lines(tmp_path / "x.jsonl", spans)
    out = _refused(capsys, existing_log, str(path))
    assert "trace " + hex_id("cy", 32) in out and "is called again after 'edit'" in out


def test_content_flowing_both_ways_across_traces_is_a_cycle(tmp_path, existing_log, capsys):
    spans = [llm_span("c1", "chat", "Alpha.", "Start here please.", "Alpha says hello there.", 1),
             llm_span("c1", "chat", "Beta.", "Alpha says hello there.", "Beta answers back.", 2),
             llm_span("c2", "chat", "Beta.", "Start here please.", "Beta goes first now.", 1),
             llm_span("c2", "chat", "Alpha.", "Beta goes first now.", "Alpha follows after.", 2)]
    path = write_lines(tmp_path / "x.jsonl", spans)
    assert "content flows in a cycle" in _refused(capsys, existing_log, str(path))


def test_a_target_file_that_matches_nothing_is_refused(tmp_path, existing_log, capsys):
    traces = write_lines(tmp_path / "t.jsonl", example_spans())
    targets = tmp_path / "targets.jsonl"
    targets.write_text(json.dumps({"trace_id": "0" * 32, "target": "7"}) + "\n" +
                       json.dumps({"input": "no such sentence", "target": "3"}) + "\n")
    out = _refused(capsys, existing_log, str(traces), "--targets", str(targets))
    assert "no line matches a trace" in out
    targets.write_text("not json\n")
    assert "targets.jsonl:1: expected a JSON object" in _refused(
        capsys, existing_log, str(traces), "--targets", str(targets))


def test_traces_that_do_not_all_make_the_same_calls_are_refused(tmp_path, existing_log,
                                                                 capsys):
    spans = example_spans()
    # the last trace lacks its topic call
    spans = [s for s in spans if not (s["traceId"] == hex_id("trace-3", 32) and any(
        a["value"].get("stringValue") == SYSTEMS["topic"] for a in s["attributes"]))]
    path = write_lines(tmp_path / "x.jsonl", spans)
    out = _refused(capsys, existing_log, str(path))
    assert f"trace {hex_id('trace-3', 32)} does not call you_name" in out


def test_more_bad_input_is_refused(tmp_path, existing_log, capsys):
    """The other refusals docs/traces.md lists: a --node-key no span carries, --metric judge,
    a run id already in the log, a file that is not there, a --val that leaves no trace
    for training."""
    traces = write_lines(tmp_path / "t.jsonl", example_spans())
    assert "has no attribute 'app.step'" in _refused(capsys, existing_log, str(traces),
                                                       "--node-key", "app.step")
    assert "--metric judge is not available" in _refused(capsys, existing_log, str(traces),
                                                         "--metric", "judge")
    assert "already exists" in _refused(capsys, existing_log, str(traces), "--run-id",
                                        _run_ids(existing_log)[0])
    assert "no such file" in _refused(capsys, existing_log, str(tmp_path / "none.jsonl"))
    assert "no trace is scored, so none can be held out" in _refused(
        capsys, existing_log, str(traces), "--val", "1")
    targets = tmp_path / "targets.jsonl"
    targets.write_text(json.dumps({"trace_id": hex_id("trace-1", 32), "target": "7"}) + "\n")
    assert "--val 1: hold out fewer traces than the 1 scored ones" in _refused(
        capsys, existing_log, str(traces), "--targets", str(targets), "--val", "1")


def test_refused_input_creates_no_run_log(tmp_path, capsys):
    path = tmp_path / "x.jsonl"
    path.write_text("hello\n", encoding="utf-8")
    db = tmp_path / "new.duckdb"
    assert main(["import-traces", str(path), "--db", str(db)]) == 2
    assert capsys.readouterr().err.startswith("error: ")
    assert not db.exists() and not (tmp_path / "new.duckdb.wal").exists()
    traces = write_lines(tmp_path / "t.jsonl", example_spans())  # fine, but --val is not
    assert main(["import-traces", str(traces), "--db", str(db), "--val", "1"]) == 2
    assert capsys.readouterr().err.startswith("error: --val 1: ")
    assert not db.exists() and not (tmp_path / "new.duckdb.wal").exists()


def _run_ids(db: Path) -> list[str]:
    with duckdb.connect(str(db), read_only=True) as con:
        return [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]


def test_targets_by_trace_id_leave_the_other_traces_unscored(tmp_path, capsys):
    traces = write_lines(tmp_path / "t.jsonl", example_spans())
    targets = tmp_path / "targets.jsonl"
    targets.write_text(json.dumps({"trace_id": hex_id("trace-1", 32), "target": "24"}) + "\n")
    got = run_json(capsys, "import-traces", str(traces), "--db", str(tmp_path / "r.duckdb"),
                   "--targets", str(targets), "--metric", "numeric")
    assert (got["traces"], got["scored"], got["failing"]) == (4, 1, 0)


# --- a run of this project, exported as spans and imported again ---------------------------


def test_a_run_exported_as_otel_imports_with_its_graphs_nodes_and_edges(tmp_path, capsys):
    from engine.core.graph import load_graph
    from tests.support.otlp_traces import exported_diamond_run

    graph, spans = exported_diamond_run(tmp_path)
    capsys.readouterr()
    got = run_json(capsys, "import-traces", str(spans), "--db", str(tmp_path / "back.duckdb"))
    original = load_graph(graph)
    assert sorted(n["id"] for n in got["nodes"]) == sorted(original.node_ids)
    assert sorted(tuple(e) for e in got["edges"]) == sorted(
        (up, n.id) for n in original.nodes for up in original.predecessors(n.id))
    assert got["traces"] == 8 and got["ambiguous"] == []  # step 0: 4 train, 4 val examples


def test_a_python_metric_grades_the_final_output(tmp_path, capsys):
    metric = tmp_path / "metric.py"
    metric.write_text("def twice(example, prediction):\n"
                      "    return float(prediction == str(2 * int(example['target'])))\n")
    traces = write_lines(tmp_path / "t.jsonl", example_spans(right=1))
    got = run_json(capsys, "import-traces", str(traces), "--db", str(tmp_path / "r.duckdb"),
                   "--targets", str(targets_file(tmp_path)), "--metric", f"{metric}:twice")
    assert (got["scored"], got["failing"]) == (4, 1)  # three traces doubled the count
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs").fetchall()[0][0])
    assert config["code"]["metric"]["qualname"] == "twice"


def test_traces_of_one_call_each_are_named_as_two_instrumentors_splitting_a_pipeline(
        tmp_path, existing_log, capsys):
    """LangChain's and OpenAI's instrumentors on one pipeline start a trace per call: the
    refusal says so instead of only blaming unrelated pipelines."""
    spans = [llm_span(f"s{i}", "chat", system, f"Text {i}", f"Reply {i} is long enough.", 1)
             for i, system in enumerate(["Count.", "Answer.", "Count.", "Answer."])]
    out = _refused(capsys, existing_log, str(write_lines(tmp_path / "x.jsonl", spans)))
    assert "several unrelated pipelines" in out and "two instrumentors" in out


def test_a_short_value_a_template_variable_received_is_a_flow(tmp_path, capsys):
    """`name` replies one short word ("Chen", also in the customer's message); `greet`'s
    template receives it as a variable: a flow however short, and a re-run of `greet` with
    another upstream value renders that value into its system message."""
    spans = []
    for i, who in enumerate(["Chen", "Ruiz"]):
        trace = f"v{i}"
        template = "Greet {customer} warmly."
        spans += [chain_span(trace, "pipeline", f"Hello, this is {who} calling."),
                  llm_span(trace, "chat", "Name the caller.", f"Hello, this is {who} calling.",
                           who, 1),
                  llm_span(trace, "chat", f"Greet {who} warmly.", "Write the greeting.",
                           f"Good morning, dear {who}!", 2,
                           extra={"llm.prompt_template.template": template,
                                  "llm.prompt_template.variables":
                                      json.dumps({"customer": who})})]
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(write_lines(tmp_path / "t.jsonl", spans)),
                   "--db", str(db))
    assert [n["id"] for n in got["nodes"]] == ["name", "greet"]
    assert got["edges"] == [["name", "greet"]]
    with duckdb.connect(str(db), read_only=True) as con:
        fields = con.execute("SELECT fields FROM examples WHERE run_id = ? ORDER BY position",
                             [got["run_id"]]).fetchall()
    spec = json.loads(json.loads(fields[0][0])["recorded_calls"])["greet"]
    assert spec["system"] == {"variables": {"customer": {"slot": "name"}}}
    from engine.prompts.recorded import recorded_messages

    messages = recorded_messages("Greet {customer} warmly.", json.loads(fields[0][0])[
        "recorded_calls"], "greet", {"name": "Okafor"})
    assert messages[0] == ("system", "Greet Okafor warmly.")


def _unit(trace: str, name: str, parent: str | None, received: dict, returned: dict,
          start: int) -> dict:
    """A CHAIN span as DSPy's instrumentor records a predictor: its fields in and out."""
    from tests.support.otlp_traces import _attrs

    span = {"traceId": hex_id(trace, 32), "spanId": hex_id(f"{trace}/{name}", 16),
            "name": name, "kind": 1, "startTimeUnixNano": str(start * 10**9),
            "endTimeUnixNano": str(start * 10**9 + 9 * 10**8),
            "attributes": _attrs({"openinference.span.kind": "CHAIN",
                                  "input.value": json.dumps(received),
                                  "output.value": json.dumps(returned)})}
    if parent:
        span["parentSpanId"] = hex_id(f"{trace}/{parent}", 16)
    return span


def test_two_units_that_return_the_same_text_each_flow_to_the_field_named_for_them(
        tmp_path, capsys):
    """A small model's two predictors echoed the same sentence: the third predictor received
    it as `facts` and as `coupon`; each is a flow from the unit that returned that field,
    and each occurrence in the message is its own slot, in the fields' order."""
    spans = []
    for i, (sentence, n) in enumerate(SENTENCES[:2]):
        t = f"d{i}"
        same = sentence if i == 0 else f"Case {i} has {n} things."
        other = same if i == 0 else f"Nothing is taken off in case {i}."
        spans.append(_unit(t, "Program.forward", None, {"sentence": sentence}, {"total": n}, 0))
        for j, (unit, field, value) in enumerate([("Predict(First).forward", "facts", same),
                                                  ("Predict(Second).forward", "coupon", other)]):
            spans.append(_unit(t, unit, "Program.forward", {"sentence": sentence},
                               {field: value}, j + 1))
            spans.append(llm_span(t, "LM.__call__", f"Find the {field}.",
                                  f"[[ ## sentence ## ]]\n{sentence}",
                                  f"[[ ## {field} ## ]]\n{value}\n\n[[ ## completed ## ]]",
                                  j + 1, parent=hex_id(f"{t}/{unit}", 16)))
        spans.append(_unit(t, "Predict(Third).forward", "Program.forward",
                           {"facts": same, "coupon": other}, {"total": n}, 3))
        spans.append(llm_span(t, "LM.__call__", "Add them up.",
                              f"[[ ## facts ## ]]\n{same}\n\n[[ ## coupon ## ]]\n{other}",
                              f"[[ ## total ## ]]\n{n}\n\n[[ ## completed ## ]]", 3,
                              parent=hex_id(f"{t}/Predict(Third).forward", 16)))
    db = tmp_path / "r.duckdb"
    got = run_json(capsys, "import-traces", str(write_lines(tmp_path / "t.jsonl", spans)),
                   "--db", str(db))
    assert [n["id"] for n in got["nodes"]] == ["first", "second", "third"]
    assert got["edges"] == [["first", "third"], ["second", "third"]]
    with duckdb.connect(str(db), read_only=True) as con:
        fields = con.execute("SELECT fields FROM examples WHERE run_id = ? ORDER BY position",
                             [got["run_id"]]).fetchall()
    echoed = json.loads(json.loads(fields[0][0])["recorded_calls"])["third"]
    slots = [p["slot"] for m in echoed["messages"] for p in m["parts"] if isinstance(p, dict)]
    assert slots == ["first", "second"]
    assert all("their input" not in a["reason"] for a in got["ambiguous"])
