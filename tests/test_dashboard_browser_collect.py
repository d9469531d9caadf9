"""Live traces in a real browser: the Traces page's one switch runs `engine collect` for the
dashboard's run log (empty at the start), sample_graphs/langchain_pipeline.py runs against
the fake OpenAI server with only OTEL_EXPORTER_OTLP_ENDPOINT set (the standard
opentelemetry-exporter-otlp-proto-http exporter behind a BatchSpanProcessor), the page
shows its traces arriving while it runs, and **Import as a run** makes a run of them,
linked to the Runs page. Stopping the dashboard stops the receiver. Same server, browser
and checks as tests/support/browser.py; the receiver's port is a free one
($SEMBACK_COLLECT_PORT). Screenshots: traces-live, traces-imported, traces-run
(test-artifacts/screenshots/)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from engine.runlog.schema import connect
from tests.support.browser import ROOT, SHOTS, dashboard, expect, free_port, no_script_ran, settle
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.pipeline_responders import langchain_responder

pytestmark = pytest.mark.browser

PIPELINE = ROOT / "sample_graphs" / "langchain_pipeline.py"
SENTENCES = 17  # every sentence of sample_graphs/data/langchain_cities.jsonl
LATENCY = 0.2  # seconds per model call: the pipeline runs for a dozen seconds
SUMMARY = re.compile(r"(\d+) traces? · (\d+) spans? · (\d+) LLM calls? from (\d+) services?")


@dataclass(frozen=True)
class EmptyLog:
    db: Path
    port: int  # the receiver's


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The dashboard on a run log that does not exist yet; (base URL, log, stop())."""
    folder = tmp_path_factory.mktemp("browser-collect")
    log = EmptyLog(folder / "runs.duckdb", free_port())
    with dashboard(log.db, folder, {"SEMBACK_COLLECT_PORT": str(log.port)}) as app:
        yield app.url, log, app.stop


def summary(main) -> tuple[int, ...] | None:
    """(traces, spans, LLM calls, services) as the page states them, or None."""
    found = SUMMARY.search(main.inner_text())
    return tuple(int(n) for n in found.groups()) if found else None


def start_pipeline(base_url: str, port: int, targets: Path, out) -> subprocess.Popen:
    """The LangChain pipeline in its own process; of OpenTelemetry's settings, only the
    endpoint (no file: the script then exports over OTLP/HTTP in batches)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    return subprocess.Popen(
        [sys.executable, str(PIPELINE), "--base-url", base_url, "--model", "fake-qwen",
         "--limit", str(SENTENCES), "--targets", str(targets)],
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def read(db: Path, sql: str, *params: object) -> list[tuple]:
    """Rows of the run log, read between the receiver's writes (which hold the file)."""
    with connect(db, read_only=True) as con:
        return con.execute(sql, list(params)).fetchall()


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_the_switch_receives_a_running_pipelines_traces_and_imports_them_as_a_run(
        server, page, tmp_path):
    base, log, stop_dashboard = server
    page.goto(f"{base}/traces")
    settle(page)
    main = page.locator("[data-testid='stMain']")
    expect(main.get_by_text("no spans received yet")).to_be_visible()
    main.get_by_text(f"Receive traces (OTLP on 127.0.0.1:{log.port})").click()
    endpoint = f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{log.port}"
    expect(main.get_by_text(endpoint)).to_be_visible(timeout=15_000)
    assert listening(log.port)

    targets = tmp_path / "targets.jsonl"
    seen_while_running: list[int] = []
    with FakeOpenAIServer(latency=LATENCY, responder=langchain_responder) as model, \
            (tmp_path / "pipeline.log").open("w") as out:
        pipeline = start_pipeline(model.base_url, log.port, targets, out)
        try:
            while pipeline.poll() is None:
                counts = summary(main)
                if counts and pipeline.poll() is None:
                    if not seen_while_running:
                        expect(main.locator("[data-testid='stDataFrame']")).to_have_count(2)
                        page.screenshot(path=str(SHOTS / "traces-live.png"), full_page=True)
                    seen_while_running.append(counts[0])
                page.wait_for_timeout(250)
        finally:
            if pipeline.poll() is None:
                pipeline.kill()
    assert pipeline.returncode == 0, (tmp_path / "pipeline.log").read_text()
    # the page showed traces while the pipeline ran, and more arrived after
    assert seen_while_running and 0 < seen_while_running[0] < SENTENCES, seen_while_running
    assert seen_while_running == sorted(seen_while_running)
    expect(main.get_by_text(re.compile(rf"^{SENTENCES} traces · "))).to_be_visible(
        timeout=15_000)
    traces, spans, calls, services = summary(main)
    assert (traces, calls, services) == (SENTENCES, 3 * SENTENCES, 1)
    stored = read(log.db, "SELECT count(*), count(DISTINCT trace_id) FROM collected_spans")
    assert stored == [(spans, SENTENCES)]  # the page's numbers are the run log's
    (newest,) = read(log.db, "SELECT trace_id FROM collected_spans GROUP BY trace_id "
                             "ORDER BY min(received_at) DESC, min(position) DESC LIMIT 1")[0]
    # the newest trace heads the table, its id whole (the grid's text is its accessible
    # copy of the canvas, which follows the canvas after a moment)
    grid = main.locator("[data-testid='stDataFrame']").last
    expect(grid).to_contain_text(f"{newest}langchain_pipeline133", timeout=10_000)
    page.screenshot(path=str(SHOTS / "traces-received.png"), full_page=True)

    main.locator("[data-testid='stFileUploader'] input[type='file']").set_input_files(
        str(targets))
    settle(page)
    main.get_by_role("button", name="Import as a run").click()
    imported = main.get_by_text(re.compile(rf"^Imported {SENTENCES} traces as run "))
    expect(imported).to_be_visible(timeout=60_000)
    run = re.search(r"as run (\S+?):", imported.inner_text())[1]
    assert read(log.db, "SELECT status FROM runs WHERE run_id = ?", run) == [("finished",)]
    expect(main.get_by_text(f"3 call sites, {SENTENCES} scored")).to_be_visible()
    assert not page.locator("[data-testid='stException']").count()
    page.screenshot(path=str(SHOTS / "traces-imported.png"), full_page=True)

    main.get_by_role("link", name=f"Open run {run}").click()
    settle(page)
    expect(page.locator("h1").first).to_have_text("Runs")
    sidebar = page.locator("[data-testid='stSidebar']")
    expect(sidebar.get_by_role("combobox", name="Run")).to_have_value(run)
    expect(main.get_by_text(re.compile(r"^1 of 1 runs"))).to_be_visible()
    page.screenshot(path=str(SHOTS / "traces-run.png"), full_page=True)
    no_script_ran(page)

    stop_dashboard()
    deadline = time.monotonic() + 10
    while listening(log.port) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not listening(log.port), "the receiver outlived the dashboard"
