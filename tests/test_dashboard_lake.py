"""The dashboard's view of a lake run log: its stamp is the lake's newest
snapshot (read at most every LAKE_STAMP_SECONDS), a lake that cannot be read never serves
a stale page, and the jobs it starts get the lake's URL as typed, not a path made of it
(the browser test is test_dashboard_browser_lake.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from dashboard import data, jobs
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]
GRAPH = str(ROOT / "sample_graphs" / "diamond.yaml")


def run_into(db: str, run_id: str) -> None:
    config = RunConfig(graph=GRAPH, backend="scripted", steps=1, train=2, val=2, test=0,
                       db=db, run_id=run_id)
    assert asyncio.run(execute(config)).status == "finished"


@pytest.mark.postgres
def test_a_lakes_stamp_moves_with_its_commits_and_the_pages_read_them(lake, monkeypatch):
    monkeypatch.setattr(data, "LAKE_STAMP_SECONDS", 0.0)
    assert data.exists(lake)
    run_into(lake, "first")
    before = data.stamp(lake)
    assert len(before) == 1 and before[0] > 0  # the snapshot id
    assert data.stamp(lake) == before  # nothing written: the cached pages stand
    assert list(data.runs(lake)["run_id"]) == ["first"]
    run_into(lake, "second")
    after = data.stamp(lake)
    assert after[0] > before[0]
    assert set(data.runs(lake)["run_id"]) == {"first", "second"}  # re-read, not cached
    assert list(data.steps(lake, "second")["step"]) == [0, 1]


@pytest.mark.postgres
def test_a_lakes_stamp_is_read_at_most_every_half_second(lake, monkeypatch):
    monkeypatch.setattr(data, "LAKE_STAMP_SECONDS", 3600.0)
    run_into(lake, "first")
    seen = data.stamp(lake)
    run_into(lake, "second")
    assert data.stamp(lake) == seen  # within the window: no query of the catalog
    monkeypatch.setattr(data, "LAKE_STAMP_SECONDS", 0.0)
    assert data.stamp(lake) > seen


def test_a_lake_out_of_reach_has_a_new_stamp_each_time(monkeypatch):
    """No page is served from the cache of a lake that cannot be read: its reads run (and
    say why they fail)."""
    monkeypatch.setenv("PGPASSWORD", "x")
    db = "ducklake:postgres:dbname=none host=127.0.0.1 port=1 user=nobody connect_timeout=2"
    first, second = data.stamp(db), data.stamp(db)
    assert first[0] == second[0] == -1 and first != second


def test_a_lake_exists_as_its_catalog(tmp_path):
    catalog = tmp_path / "team.ducklake"
    assert not data.exists(f"ducklake:{catalog}")  # a file catalog not made yet
    catalog.write_bytes(b"")
    assert data.exists(f"ducklake:{catalog}")
    assert data.exists("ducklake:postgres:dbname=team host=db.example")  # asked on reading
    # an address the lake refuses is read, so the sidebar shows the refusal
    assert data.exists("ducklake:postgres:dbname=team password=x")
    assert not data.exists(str(tmp_path / "runs.duckdb")) and not data.exists("")


def test_jobs_get_the_lakes_url_not_a_path_made_of_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    team = "ducklake:postgres:dbname=team host=db.example port=5432 user=ana"
    assert jobs.absolute(team) == team
    assert jobs.absolute("ducklake:team.ducklake") == f"ducklake:{tmp_path / 'team.ducklake'}"
    assert jobs.absolute("ducklake:duckdb:team.ducklake") == \
        f"ducklake:duckdb:{tmp_path / 'team.ducklake'}"
    assert jobs.absolute("runs.duckdb") == str(tmp_path / "runs.duckdb")
    spec = jobs.RunSpec(graph=GRAPH, db=team, backend="scripted", run_id="r")
    command = jobs.build_command(jobs.RunSpec(**{**spec.__dict__, "db": jobs.absolute(team)}))
    assert command[command.index("--db") + 1] == team
    # the jobs of one lake share a folder wherever the dashboard was started
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    here = jobs.jobs_dir(team)
    monkeypatch.chdir(ROOT)
    assert jobs.jobs_dir(team) == here


def test_a_started_run_gets_the_lakes_password_and_data_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PGPASSWORD", "from-the-environment")
    monkeypatch.setenv("SEMBACK_DATA_PATH", "lake-data")
    env = jobs.child_env()
    assert env["PGPASSWORD"] == "from-the-environment"
    assert env["SEMBACK_DATA_PATH"] == str(tmp_path / "lake-data")  # the job runs in ROOT
    monkeypatch.setenv("SEMBACK_DATA_PATH", "s3://bucket/team/")
    assert jobs.child_env()["SEMBACK_DATA_PATH"] == "s3://bucket/team/"
