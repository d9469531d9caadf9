"""A run log written before the house was tidied (commit 0c0e385, 2026-12-07: the demo
graph on the scripted backend, one step, then `blame`) opens on every page: the pages'
data, views and widgets read what an older engine wrote. The log is committed gzipped
(tests/dashboard/data/), a copy is opened."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.support.dashboard_log import like_a_live_server
from tests.test_dashboard_app import texts

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
LOG = Path(__file__).resolve().parent / "data" / "run-log-2026-12-07.duckdb.gz"
RUN = "before-refactor"
PAGES = ("runs", "graph", "step", "inspect", "examples", "history", "curves", "compare",
         "learn", "traces")


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("old-log") / "runs.duckdb"
    with gzip.open(LOG) as packed, path.open("wb") as out:
        shutil.copyfileobj(packed, out)
    return path


@pytest.mark.parametrize("page", PAGES)
def test_every_page_opens_a_run_log_from_before(db, page, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_DB", str(db))
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params.update(run=RUN, step="1", example="ct-01", node="note")
        at.run()
        at.switch_page(f"screens/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    shown = texts(at)
    if page != "traces":  # the Traces page has no run picker: it lists collected spans
        assert at.selectbox(key="run").value == RUN
    if page == "runs":
        assert RUN in shown
    if page == "graph":  # the blame the old engine logged: its edit probes, per node
        assert "note" in shown and "answer" in shown
