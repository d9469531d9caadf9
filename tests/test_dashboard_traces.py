"""The Traces page without a browser: what it counts of collected spans (per service, per
trace, from one function), the receiver and import processes it starts (their command
lines, their one-line errors), that the receiver ends with the dashboard's process even
when that is killed, and the page under AppTest (the real browser, a real pipeline and the
import are in test_dashboard_browser_collect.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import jobs, trace_jobs
from dashboard.views.collected import ago, collected_overview
from engine.runlog.collected import SpanStore, collected_heads, open_for_collecting
from engine.traces.collect import span_row
from engine.traces.otlp import Span
from tests.support.dashboard_log import like_a_live_server

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "dashboard" / "app.py"
T1, T2, T3 = "a" * 32, "b" * 32, "c" * 32


def span(trace: str, n: int, parent: str = "", **attributes) -> Span:
    return Span(trace, f"{n:016x}", parent, f"span {n}", n, n + 1, attributes)


def store_spans(db: Path, rows: list[tuple], received_at: float) -> None:
    """One request's spans, as the receiver stores them."""
    open_for_collecting(db)
    store = SpanStore(db)
    try:
        store.store(rows, received_at)
    finally:
        store.close()


def collect_some(db: Path) -> None:
    """Two traces of `shop` (one still arriving: its root is not in yet) and one of `bank`,
    in three requests."""
    store_spans(db, [
        span_row("shop", span(T1, 1, "", **{"openinference.span.kind": "CHAIN",
                                             "input.value": '{"text": "two apples"}'})),
        span_row("shop", span(T1, 2, f"{1:016x}", **{"openinference.span.kind": "LLM"})),
        span_row("shop", span(T1, 3, f"{1:016x}", **{"gen_ai.operation.name": "chat"})),
    ], received_at=100.0)
    store_spans(db, [span_row("bank", span(T2, 4, "", **{"input.value": "pay 3"})),
                     span_row("bank", span(T2, 5, f"{4:016x}"))], received_at=200.0)
    store_spans(db, [span_row("shop", span(T3, 6, f"{9:016x}",
                                           **{"openinference.span.kind": "LLM"}))],
                received_at=300.0)


def test_services_and_traces_are_counted_once_from_the_run_logs_rows(tmp_path):
    db = tmp_path / "runs.duckdb"
    collect_some(db)
    seen = collected_overview(collected_heads(db))
    assert seen.line() == "3 traces · 6 spans · 3 LLM calls from 2 services"
    assert [(s.service, s.traces, s.spans, s.llm_calls, s.last_received)
            for s in seen.services] == [("shop", 2, 4, 3, 300.0), ("bank", 1, 2, 0, 200.0)]
    # newest first; a JSON object of one text is that text, as the importer keys examples
    assert [(t.trace_id, t.service, t.spans, t.llm_calls, t.root_input)
            for t in seen.traces] == [(T3, "shop", 1, 1, None), (T2, "bank", 2, 0, "pay 3"),
                                      (T1, "shop", 3, 2, "two apples")]
    assert (seen.spans, seen.llm_calls) == (6, 3)


def test_traces_of_one_request_keep_their_arrival_order_newest_first(tmp_path):
    db = tmp_path / "runs.duckdb"
    store_spans(db, [span_row("s", span(t, i)) for i, t in enumerate((T1, T2, T3))],
                received_at=5.0)
    assert [t.trace_id for t in collected_overview(collected_heads(db)).traces] == \
        [T3, T2, T1]


def test_ago_words():
    assert [ago(s) for s in (0.5, 12, 190, 9000)] == ["just now", "12 s ago", "3 min ago",
                                                     "2 h ago"]


def test_the_receiver_and_import_command_lines(tmp_path):
    db = tmp_path / "runs.duckdb"
    assert trace_jobs.collect_command(db, 4400)[1:] == [
        "-m", "engine", "collect", "--db", str(db), "--host", "127.0.0.1", "--port", "4400"]
    assert trace_jobs.import_command(db, "t.jsonl", "shop", "numeric")[1:] == [
        "-m", "engine", "import-traces", "--collected", "--db", str(db), "--targets",
        "t.jsonl", "--service", "shop", "--metric", "numeric", "--json"]
    assert trace_jobs.import_command(db)[-2:] == [str(db), "--json"]


@pytest.mark.parametrize("value,port", [(None, 4318), ("4400", 4400), ("x", 4318),
                                        ("70000", 4318)])
def test_the_receivers_port_is_a_setting(monkeypatch, value, port):
    if value is None:
        monkeypatch.delenv(trace_jobs.PORT_ENV, raising=False)
    else:
        monkeypatch.setenv(trace_jobs.PORT_ENV, value)
    assert trace_jobs.collect_port() == port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_port_in_use_is_one_line_in_the_dashboards_words(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    db = tmp_path / "runs.duckdb"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        job = trace_jobs.start_collect(db, port)
        assert jobs.wait(job, 30)
    assert trace_jobs.receiver(db) is None
    assert trace_jobs.failed_receiver(db) == (
        f"cannot listen on 127.0.0.1:{port}: the port is in use (start the dashboard with "
        "SEMBACK_COLLECT_PORT=N to choose another port)")


def test_a_refused_import_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    db = tmp_path / "runs.duckdb"
    job = trace_jobs.start_import(db)
    assert jobs.wait(job, 60)
    run, why = trace_jobs.import_outcome(job)
    assert run is None and why.startswith(f"{db}: ") and "no " in why, why
    assert "\n" not in why and "Traceback" not in why


def test_the_receiver_ends_with_the_dashboard_even_when_it_is_killed(tmp_path, monkeypatch):
    """A stand-in for the dashboard's server starts the receiver as the Traces page does,
    from a thread that ends at once (as Streamlit's script threads do), then is killed
    with SIGKILL: the receiver does not outlive it."""
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    port = free_port()
    script = (
        "import sys, threading, time\n"
        "from dashboard import trace_jobs\n"
        "t = threading.Thread(target=trace_jobs.start_collect, args=(sys.argv[1], "
        "int(sys.argv[2])))\n"
        "t.start(); t.join()\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n")
    env = {"SEMBACK_JOBS_DIR": str(tmp_path / "jobs"), "PATH": "/usr/bin:/bin"}
    dashboard = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "runs.duckdb"),
                                  str(port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                 text=True)
    try:
        assert dashboard.stdout.readline().strip() == "started"
        wait_for(lambda: listening(port))
        time.sleep(1.0)  # the script thread that started it has long ended: still there
        assert listening(port)
    finally:
        dashboard.send_signal(signal.SIGKILL)
        dashboard.wait()
        dashboard.stdout.close()
    try:
        wait_for(lambda: not listening(port), timeout=15)
    finally:  # a receiver left behind by a failure here must not outlive the test
        for job in jobs.list_jobs(tmp_path / "runs.duckdb", kinds=("collect",)):
            if jobs.poll(job):
                os.kill(job.pid, signal.SIGKILL)


# --- the page --------------------------------------------------------------------------


@pytest.fixture
def traces_page(monkeypatch, tmp_path):
    """traces_page(db) -> AppTest on the Traces page of that run log."""
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv(trace_jobs.PORT_ENV, "4999")

    def run(db: Path) -> AppTest:
        monkeypatch.setenv("SEMBACK_DB", str(db))
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.run()
        at.switch_page("screens/traces.py").run()
        assert not at.exception, [e.value for e in at.exception]
        return at

    with like_a_live_server():
        yield run


def test_the_page_on_an_empty_run_log_offers_the_switch(traces_page, tmp_path):
    at = traces_page(tmp_path / "none.duckdb")
    (switch,) = at.toggle
    assert switch.label == "Receive traces (OTLP on 127.0.0.1:4999)" and not switch.value
    assert "no spans received yet" in [m.value for m in at.markdown]
    assert not at.dataframe
    assert at.button(key="import_collected").label == "Import as a run"


def test_the_page_lists_services_and_whole_trace_ids(traces_page, tmp_path):
    db = tmp_path / "runs.duckdb"
    collect_some(db)
    at = traces_page(db)
    assert "**3 traces · 6 spans · 3 LLM calls from 2 services**" in [m.value for m in
                                                                        at.markdown]
    services, traces = (d.value for d in at.dataframe)
    assert list(services["service"]) == ["shop", "bank"]
    assert list(services["traces"]) == [2, 1] and list(services["LLM calls"]) == [3, 0]
    assert list(traces["trace id"]) == [T3, T2, T1]
    assert list(traces["root input"]) == ["", "pay 3", "two apples"]
    # two services: the import asks which
    assert at.selectbox(key="import_service").options == ["all services", "shop", "bank"]


def test_a_refused_import_shows_one_line_on_the_page(traces_page, tmp_path):
    db = tmp_path / "runs.duckdb"
    collect_some(db)
    at = traces_page(db)
    at.selectbox(key="import_service").set_value("bank").run()
    at.button(key="import_collected").click().run()
    (job,) = jobs.list_jobs(db, kinds=("import",))
    assert job.command[1:] == trace_jobs.import_command(str(db), None, "bank",
                                                       "exact_match")[1:]
    assert jobs.wait(job, 60)
    at.run()
    assert not at.exception
    (error,) = at.error  # bank's trace holds no LLM call: nothing to import
    assert error.value.startswith("Import refused: ") and "no LLM spans" in error.value
    assert "\n" not in error.value and "Traceback" not in error.value
    assert not at.success


def test_switching_on_with_the_port_taken_says_why_and_stays_off(traces_page, tmp_path,
                                                                 monkeypatch):
    db = tmp_path / "runs.duckdb"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv(trace_jobs.PORT_ENV, str(port))
        at = traces_page(db)
        at.toggle(key="receive_traces").set_value(True).run()
        (job,) = trace_jobs.receivers(db)
        assert job.command[1:] == trace_jobs.collect_command(str(db), port)[1:]
        assert jobs.wait(job, 30)
    at.run()
    assert not at.exception and at.toggle(key="receive_traces").value is False
    (error,) = at.error
    assert error.value.replace("\\", "") == (  # as Markdown shows it, escapes dropped
        f"The receiver stopped: cannot listen on 127.0.0.1:{port}: the port is in use (start "
        "the dashboard with SEMBACK_COLLECT_PORT=N to choose another port)")


def test_switching_off_stops_the_receiver(traces_page, tmp_path, monkeypatch):
    db = tmp_path / "runs.duckdb"
    port = free_port()
    monkeypatch.setenv(trace_jobs.PORT_ENV, str(port))
    at = traces_page(db)
    at.toggle(key="receive_traces").set_value(True).run()
    (job,) = trace_jobs.receivers(db)
    try:
        wait_for(lambda: trace_jobs.listening_on(job) is not None)
        at.run()
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{port}" in [c.value for c in
                                                                         at.code]
        at.toggle(key="receive_traces").set_value(False).run()
        assert jobs.wait(job, 30) and job.returncode == 0
        assert not listening(port)
        at.run()
        assert at.toggle(key="receive_traces").value is False and not at.error
    finally:
        jobs.stop(job)
