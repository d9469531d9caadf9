"""A mistyped run-log path reads as a mistake, never as an empty run log: a missing
folder is an error with nothing offered; a missing file beside run logs that exist names
them (a misspelled name); a new file in an empty folder is simply a log to be made."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from dashboard.views.runlog_path import path_problem
from tests.support.dashboard_log import like_a_live_server

APP = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"


def test_what_is_wrong_with_a_path(tmp_path):
    (tmp_path / "runs.duckdb").write_bytes(b"")
    assert path_problem(str(tmp_path / "runs.duckdb")) is None  # there
    assert path_problem(str(tmp_path / "nope" / "runs.duckdb")) == (
        f"No folder {tmp_path / 'nope'}: check the run log's path (a run writes its log into "
        "an existing folder)", False)
    said, can_make = path_problem(str(tmp_path / "rusn.duckdb"))
    assert "No run log named rusn.duckdb" in said and "runs.duckdb" in said and can_make
    assert path_problem(str(tmp_path))[1] is False  # a folder is no run log
    empty = tmp_path / "empty"
    empty.mkdir()
    assert path_problem(str(empty / "runs.duckdb")) is None  # a first run makes it
    assert "end in .duckdb" in path_problem(str(empty / "runs.dukdb"))[0]
    assert path_problem("ducklake:postgres:dbname=x", is_lake=True) is None


def runs_page(db: Path, monkeypatch, tmp_path) -> AppTest:
    monkeypatch.setenv("SEMBACK_DB", str(db))
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    with like_a_live_server():
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.run()
        at.switch_page("screens/runs.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_a_missing_folder_is_an_error_and_offers_no_demo(tmp_path, monkeypatch):
    at = runs_page(tmp_path / "typo" / "runs.duckdb", monkeypatch, tmp_path)
    assert [e.value for e in at.error] == [
        f"No folder {tmp_path / 'typo'}: check the run log's path (a run writes its log "
        "into an existing folder)"]
    assert not [b for b in at.button if b.label == "Run the demo"]
    assert not any("has no runs yet" in m.value for m in at.info)


def test_a_misspelled_name_names_the_logs_beside_it(tmp_path, monkeypatch):
    (tmp_path / "runs.duckdb").write_bytes(b"")  # a log the user meant
    at = runs_page(tmp_path / "rusn.duckdb", monkeypatch, tmp_path)
    warnings = [w.value for w in at.warning]
    assert any("No run log named rusn.duckdb" in w and "runs.duckdb" in w for w in warnings)
