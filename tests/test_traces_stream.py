"""import-traces streams: the file is read a line at a time, each span kept only for what
the inference reads of it, and the replay spills its records a chunk of traces at a time
(engine.traces.importer.CHUNK), written with the step in its one transaction. Streamed in
chunks, an import is the run imported at once (benchmarks/import_traces.py measures it at
scale)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from engine.cli.commands import main
from engine.traces import TraceError, importer
from engine.traces.infer import infer_pipeline
from engine.traces.otlp import iter_spans, read_spans
from tests.support.otlp_traces import write_lines
from tests.test_traces import SENTENCES, example_spans, targets_file

# what a run's rows are, besides ids and times drawn afresh by each import
ROWS = {
    "examples": "split, example_id, position, fields, target",
    "node_outputs": "step, split, example_id, node_id, prompt_version, input_text, "
                    "output_text, error, raw_text, parse_error",
    "losses": "step, split, example_id, prediction, target, score, feedback, error",
    "llm_calls": "step, example_id, node_id, purpose, backend, model, messages, response, "
                 "prompt_tokens, completion_tokens, cache_hit, error, cache_key, temperature, "
                 "max_tokens, finish_reason",
    "prompt_versions": "node_id, version, prompt, step, accepted",
    "steps": "step, train_score, val_score, accepted",
    "metrics": "step, key, value",
}


def batched_lines(path: Path, spans: list[dict], per_line: int) -> Path:
    """The spans as a Collector's file exporter writes them: in the order they ended (a
    trace's root last), `per_line` spans an ExportTraceServiceRequest, so that a trace
    straddles two lines."""
    ordered = sorted(spans, key=lambda s: int(s["endTimeUnixNano"]))
    with path.open("w", encoding="utf-8") as fh:
        for at in range(0, len(ordered), per_line):
            fh.write(json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                                    "scopeSpans": [{"scope": {"name": "t"},
                                                                    "spans": ordered[
                                                                        at:at + per_line]}]}]})
                     + "\n")
    return path


def run_rows(db: Path, run_id: str) -> dict[str, list[tuple]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {table: sorted(con.execute(f"SELECT {columns} FROM {table} WHERE run_id = ?",
                                          [run_id]).fetchall(), key=repr)
                for table, columns in ROWS.items()}


def imported(capsys, traces: Path, db: Path, *flags: str) -> dict:
    assert main(["import-traces", str(traces), "--db", str(db), "--run-id", "r", *flags,
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_file_imported_in_chunks_is_the_run_imported_at_once(tmp_path, capsys,
                                                               monkeypatch):
    spans = example_spans(right=1)
    flags = ("--targets", str(targets_file(tmp_path)), "--metric", "numeric", "--val", "1")
    at_once = imported(capsys, write_lines(tmp_path / "one.jsonl", spans),
                       tmp_path / "one.duckdb", *flags)
    monkeypatch.setattr(importer, "CHUNK", 1)  # a trace a chunk: three spilled, then the step
    chunked = imported(capsys, batched_lines(tmp_path / "batched.jsonl", spans, 3),
                       tmp_path / "chunked.duckdb", *flags)
    assert chunked == at_once
    assert [p.name for p in tmp_path.iterdir() if ".spill-" in p.name] == []  # cleared
    # the expectations of tests/test_traces.py's example, streamed
    assert [n["id"] for n in chunked["nodes"]] == ["you_count", "you_name", "you_give"]
    assert chunked["edges"] == [["you_count", "you_give"], ["you_name", "you_give"]]
    assert (chunked["traces"], chunked["scored"], chunked["failing"], chunked["val"]) == (
        4, 4, 3, 1)
    streamed = run_rows(tmp_path / "chunked.duckdb", "r")
    assert streamed == run_rows(tmp_path / "one.duckdb", "r")
    outputs = sorted(r[6] for r in streamed["node_outputs"] if r[3] == "you_give")
    assert outputs == ["10", "18", "24", "7"]  # the recorded replies
    assert sorted(r[5] for r in streamed["losses"]) == [0.0, 0.0, 0.0, 1.0]
    assert {json.loads(r[3])["input"] for r in streamed["examples"]} == {
        s for s, _ in SENTENCES}
    assert len(streamed["llm_calls"]) == 12 and len(streamed["steps"]) == 1


def test_the_reader_reads_a_line_at_a_time(tmp_path):
    path = batched_lines(tmp_path / "t.jsonl", example_spans(), 4)
    assert [s.span_id for s in iter_spans(path)] == [s.span_id for s in read_spans(path)]
    with path.open("a", encoding="utf-8") as fh:
        fh.write("not json\n")
    spans = iter_spans(path)
    assert next(spans).trace_id  # the first line is read before the bad one is reached
    with pytest.raises(TraceError, match=r"t.jsonl:5: not OTLP JSON"):
        list(spans)
    # the inference takes the stream itself: it reads it once
    good = batched_lines(tmp_path / "good.jsonl", example_spans(), 4)
    pipeline = infer_pipeline(iter_spans(good))
    assert list(pipeline.nodes) == ["you_count", "you_name", "you_give"]
    # each trace keeps its calls' replies, not their messages (read into its templates)
    trace = next(t for t in pipeline.traces if t.root_input == SENTENCES[0][0])
    call = trace.calls["you_give"]
    assert call.messages == [] and call.output == "14"
    assert "input.value" not in call.span.attributes


def test_an_import_that_fails_part_way_leaves_no_step_written(tmp_path, capsys,
                                                              monkeypatch):
    """A metric that raises on the third trace, after two chunks were spilled: the run is
    failed with none of its step's records, as when the whole step was held at once, and
    nothing is left of the spill."""
    metric = tmp_path / "metric.py"
    metric.write_text("graded = []\n\n\n"
                      "def third(example, prediction):\n"
                      "    graded.append(example['input'])\n"
                      "    if len(graded) == 3:\n"
                      "        raise RuntimeError('no third')\n"
                      "    return 1.0\n")
    monkeypatch.setattr(importer, "CHUNK", 1)
    db = tmp_path / "r.duckdb"
    assert main(["import-traces", str(write_lines(tmp_path / "t.jsonl", example_spans())),
                 "--db", str(db), "--run-id", "r", "--targets", str(targets_file(tmp_path)),
                 "--metric", f"{metric}:third"]) == 2
    assert "no third" in capsys.readouterr().err
    rows = run_rows(db, "r")
    assert [p.name for p in tmp_path.iterdir() if ".spill-" in p.name] == []
    assert len(rows["examples"]) == 4
    assert all(not rows[t] for t in ROWS if t != "examples")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = 'r'").fetchall() == [
            ("failed",)]
