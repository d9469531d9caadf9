"""Export and import: JSON round trip, import refusals and --as, Parquet files,
OpenTelemetry GenAI spans, and no API key in the log, the exports or the output."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from engine.cli import main
from engine.runlog.export import RUN_TABLES, read_run
from engine.runlog.schema import SCHEMA_VERSION, column_names
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]
DIAMOND = str(ROOT / "sample_graphs" / "diamond.yaml")
DEMO = str(ROOT / "sample_graphs" / "demo.yaml")
ALL_TABLES = (*RUN_TABLES, "llm_cache")
# (no gen_ai.response.model: a scripted reply names no model)
GEN_AI = ("gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
          "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
          "gen_ai.request.temperature", "gen_ai.request.max_tokens")


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("source") / "src.duckdb"
    asyncio.run(execute(RunConfig(graph=DIAMOND, db=str(db), run_id="r1", steps=2, train=8,
                                  val=8, test=4)))
    return db


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def sorted_rows(tables: dict[str, list[dict]]) -> dict[str, list[dict]]:
    return {t: sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
            for t, rows in tables.items()}


def contents(db: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: sorted(con.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
                for t in ALL_TABLES}
    finally:
        con.close()


# --- json ------------------------------------------------------------------------------


def test_json_export_imports_into_a_fresh_log_with_every_row_equal(source, tmp_path, capsys):
    exported, fresh = tmp_path / "r1.json", tmp_path / "fresh.duckdb"
    code, out, _ = cli(capsys, "export", "r1", "--db", source, "--format", "json",
                       "--out", exported)
    assert code == 0 and str(exported) in out
    document = json.loads(exported.read_text())
    assert document["run_id"] == "r1" and document["schema_version"] == SCHEMA_VERSION
    assert set(document["tables"]) == set(ALL_TABLES)
    assert all(document["tables"][t] for t in ALL_TABLES if not t.startswith("probe")), \
        "an empty table in the export"

    code, out, err = cli(capsys, "import", exported, "--db", fresh)
    assert code == 0, err
    original, imported = sorted_rows(read_run(source, "r1")), sorted_rows(read_run(fresh, "r1"))
    for table in ALL_TABLES:
        assert imported[table] == original[table], table
    # The whole run, not a sample: row counts straight from the source file.
    con = duckdb.connect(str(source), read_only=True)
    try:
        for table in RUN_TABLES:
            n = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = 'r1'").fetchall()
            assert len(imported[table]) == n[0][0], table
    finally:
        con.close()


def test_import_refuses_an_existing_run_id_and_accepts_a_new_one(source, tmp_path, capsys):
    exported, db = tmp_path / "r1.json", tmp_path / "log.duckdb"
    assert cli(capsys, "export", "r1", "--db", source, "--out", exported)[0] == 0
    assert cli(capsys, "import", exported, "--db", db)[0] == 0
    before = contents(db)

    code, out, err = cli(capsys, "import", exported, "--db", db)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ")
    assert "already exists" in err and "--as" in err
    assert contents(db) == before

    code, out, err = cli(capsys, "import", exported, "--db", db, "--as", "copy")
    assert code == 0, err
    original, copy = read_run(db, "r1"), read_run(db, "copy")
    assert copy["runs"][0]["run_id"] == "copy"
    assert json.loads(copy["runs"][0]["config"])["run_id"] == "copy"
    for table in RUN_TABLES:
        strip = ("run_id", "call_id", "config")
        assert Counter(json.dumps({k: v for k, v in r.items() if k not in strip},
                                  sort_keys=True) for r in copy[table]) == \
            Counter(json.dumps({k: v for k, v in r.items() if k not in strip},
                               sort_keys=True) for r in original[table]), table
    # Call ids stay unique in the file, and the copy's references point at its own calls.
    con = duckdb.connect(str(db), read_only=True)
    try:
        assert con.execute("SELECT count(*) - count(DISTINCT call_id) FROM llm_calls"
                           ).fetchall()[0][0] == 0
        dangling = con.execute("""SELECT count(*) FROM node_outputs o WHERE o.call_id IS NOT
            NULL AND NOT EXISTS (SELECT 1 FROM llm_calls c WHERE c.call_id = o.call_id
            AND c.run_id = o.run_id)""").fetchall()[0][0]
        cache_rows = con.execute("SELECT count(*), count(DISTINCT key) FROM llm_cache"
                                 ).fetchall()[0]
    finally:
        con.close()
    assert dangling == 0
    assert cache_rows[0] == cache_rows[1]  # the copy did not duplicate cache entries


@pytest.mark.parametrize("text, words", [
    ("not json at all {", "not JSON"),
    ('{"hello": "world"}', "not a run export"),
    (json.dumps({"format": "semback-run", "schema_version": SCHEMA_VERSION + 1,
                 "tables": {"runs": [{"run_id": "x"}]}}), "newer"),
    (json.dumps({"format": "semback-run", "schema_version": SCHEMA_VERSION,
                 "tables": {"runs": []}}), "exactly one run"),
])
def test_import_refuses_a_file_that_is_not_a_run_export(tmp_path, capsys, text, words):
    bad, db = tmp_path / "bad.json", tmp_path / "log.duckdb"
    bad.write_text(text)
    code, out, err = cli(capsys, "import", bad, "--db", db)
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not db.exists()


def test_default_output_paths_are_named_after_the_run(source, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for fmt in ("json", "parquet", "otel"):
        assert cli(capsys, "export", "r1", "--db", source, "--format", fmt)[0] == 0
    assert (tmp_path / "r1.json").is_file()
    assert (tmp_path / "r1_parquet").is_dir()
    assert (tmp_path / "r1.otel.jsonl").is_file()


# --- parquet ---------------------------------------------------------------------------


def test_parquet_export_writes_one_readable_file_per_table(source, tmp_path, capsys):
    folder = tmp_path / "pq"
    assert cli(capsys, "export", "r1", "--db", source, "--format", "parquet",
               "--out", folder)[0] == 0
    assert sorted(p.name for p in folder.iterdir()) == sorted(f"{t}.parquet"
                                                              for t in ALL_TABLES)
    tables = read_run(source, "r1")
    for table in ALL_TABLES:
        data = pq.read_table(folder / f"{table}.parquet")
        assert data.column_names == column_names(table)
        assert data.num_rows == len(tables[table]), table
    steps = pq.read_table(folder / "steps.parquet").to_pylist()
    assert [s["step"] for s in steps] == [0, 1, 2]


# --- otel ------------------------------------------------------------------------------


def decode(attributes: list[dict]) -> dict:
    out = {}
    for item in attributes:
        (kind, value), = item["value"].items()
        out[item["key"]] = int(value) if kind == "intValue" else value
    return out


def spans_of(path: Path) -> list[dict]:
    spans = []
    for line in path.read_text().splitlines():
        for resource in json.loads(line)["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                spans.extend(scope["spans"])
    return spans


def test_otel_export_has_one_gen_ai_span_per_call_under_its_step_span(source, tmp_path, capsys):
    path = tmp_path / "r1.otel.jsonl"
    assert cli(capsys, "export", "r1", "--db", source, "--format", "otel",
               "--out", path)[0] == 0
    spans = spans_of(path)
    calls = {c["call_id"]: c for c in read_run(source, "r1")["llm_calls"]}
    call_spans = [s for s in spans if decode(s["attributes"]).get("gen_ai.operation.name")]
    assert len(call_spans) == len(calls)
    assert len({s["spanId"] for s in spans}) == len(spans)
    assert len({s["traceId"] for s in spans}) == 1 and len(spans[0]["traceId"]) == 32

    roots = [s for s in spans if "parentSpanId" not in s]
    assert len(roots) == 1
    step_spans = {s["spanId"]: s for s in spans if s.get("parentSpanId") == roots[0]["spanId"]
                  and s["name"].startswith("step ")}
    assert sorted(s["name"] for s in step_spans.values()) == ["step 0", "step 1", "step 2"]
    by_id = {s["spanId"]: s for s in spans}

    def step_of(span: dict) -> dict:  # the step span above a call (phase, example between)
        while span["spanId"] not in step_spans:
            span = by_id[span["parentSpanId"]]
        return span

    seen_calls = set()
    for span in call_spans:
        attrs = decode(span["attributes"])
        assert set(GEN_AI) <= set(attrs), set(GEN_AI) - set(attrs)
        call = calls[attrs["semback.call_id"]]
        seen_calls.add(call["call_id"])
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == call["backend"] == "scripted"
        assert attrs["gen_ai.request.model"] == call["model"]
        # a cache hit cost no provider tokens (tests/test_otel_export.py)
        paid = 0 if call["cache_hit"] else 1
        assert attrs["gen_ai.usage.input_tokens"] == paid * call["prompt_tokens"]
        assert attrs["gen_ai.usage.output_tokens"] == paid * call["completion_tokens"]
        assert attrs["gen_ai.request.max_tokens"] == call["max_tokens"]
        assert attrs["gen_ai.request.temperature"] == call["temperature"]
        assert step_of(span)["name"] == f"step {call['step']}"
        start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
        assert start == pytest.approx(call["started_at"] * 1e9, abs=1e3) and end >= start
        assert span["status"]["code"] == (2 if call["error"] else 1)
        assert span["kind"] == 3  # client
    assert seen_calls == set(calls)


# --- secrets ---------------------------------------------------------------------------

SECRET = "sk-test-SECRET-7f3a9c2e5b1d4a6f"


def python_m_engine(tmp_path: Path, *argv: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-m", "engine", *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr


def assert_no_secret(db: Path, files: list[Path], output: str) -> None:
    needle = SECRET.split("sk-test-")[1]
    assert needle not in output
    for path in [db, db.with_name(db.name + ".wal"), *files]:
        paths = sorted(path.rglob("*")) if path.is_dir() else [path]
        for p in paths:
            if p.is_file():
                assert needle.encode() not in p.read_bytes(), p
    # DuckDB compresses strings on disk, so also look at every value through SQL.
    con = duckdb.connect(str(db), read_only=True)
    try:
        for (table,) in con.execute("SELECT table_name FROM information_schema.tables"
                                    ).fetchall():
            for row in con.execute(f"SELECT * FROM {table}").fetchall():
                assert needle not in repr(row), table
    finally:
        con.close()


def run_and_export(tmp_path: Path, run_id: str, backend_args: list[str], env: dict
                   ) -> tuple[list[Path], str]:
    db = tmp_path / "secret.duckdb"
    output = python_m_engine(tmp_path, "run", DEMO, "--db", str(db), "--run-id", run_id,
                             "--steps", "1", "--train", "4", "--val", "4", "--test", "2",
                             *backend_args, env=env)
    files = []
    for fmt, name in (("json", f"{run_id}.json"), ("otel", f"{run_id}.otel.jsonl")):
        output += python_m_engine(tmp_path, "export", run_id, "--db", str(db), "--format",
                                  fmt, "--out", str(tmp_path / name), env=env)
        files.append(tmp_path / name)
    return files, output


def test_the_api_key_is_never_written(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_API_KEY": SECRET}
    env.pop("OPENAI_BASE_URL", None)
    db = tmp_path / "secret.duckdb"
    files, output = run_and_export(tmp_path, "scripted", ["--backend", "scripted"], env)
    assert_no_secret(db, files, output)

    from tests.support.fake_openai import FakeOpenAIServer

    with FakeOpenAIServer(latency=0.0) as server:
        more, more_output = run_and_export(
            tmp_path, "openai", ["--backend", "openai", "--base-url", server.base_url], env)
        used = list(server.authorizations)
    assert used and all(SECRET in (a or "") for a in used), "the key did not reach the server"
    assert_no_secret(db, files + more, output + more_output)
