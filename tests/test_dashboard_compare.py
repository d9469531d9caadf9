"""The method comparison under AppTest: a finished `blame --method ... --json` job of the
step is shown on the Learn tour's siblings stage and on the Graph page, per node each
method's flips/probed with the report's 90% interval, and one sentence of what it means;
the button starts that blame in the background."""

from __future__ import annotations

import contextlib
import io
import json
import time
from dataclasses import asdict
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard import jobs
from engine.cli import main
from tests.support.dashboard_log import build_run_log, open_page

STEP = 1


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    built = build_run_log(tmp_path_factory.mktemp("compare"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["blame", built.demo, "--db", str(built.db), "--step", str(STEP),
                     "--method", ",".join(jobs.COMPARE_METHODS), "--json"]) == 0
    return built, out.getvalue()


@pytest.fixture(autouse=True)
def _env(monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("SEMBACK_DB", "")


def finished_compare(run_id: str, db: Path, printed: str) -> jobs.Job:
    """A comparison job record as `jobs.launch` saves it, its log holding the JSON."""
    cmd = jobs.compare_command(run_id, str(db), STEP)
    job = jobs.Job(run_id, str(db), 999_999_990, str(jobs.jobs_dir(db) / "compare-x.log"),
                   cmd, time.time(), 0, returncode=0, kind="compare")
    Path(job.log).write_text("$ " + " ".join(cmd) + "\n" + printed)
    job.record.write_text(json.dumps(asdict(job)), encoding="utf-8")  # as launch saves it
    return job


def page(db: Path, screen: str, **query) -> AppTest:
    return open_page(db, screen, **query)


def comparison(at: AppTest):
    tables = [t.value for t in at.table if "semantic-nosibling" in t.value.columns]
    assert tables, "no method comparison shown"
    return tables[0]


def expected(printed: str) -> dict[tuple[str, str], str]:
    report = json.loads(printed)
    return {(r["node"], r["method"]): f"{r['flips']}/{r['probed']} "
            f"[{r['interval'][0]:.0%}, {r['interval'][1]:.0%}]" for r in report["methods"]}


def text(at: AppTest) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption") for e in getattr(at, kind)
                     ).replace("\\", "")


@pytest.mark.parametrize("screen, query", [
    ("screens/learn.py", {"tour": "Without siblings"}),
    ("screens/graph.py", {}),
])
def test_both_pages_show_each_methods_efficacy_with_its_interval(log, screen, query):
    built, printed = log
    finished_compare(built.demo, built.db, printed)
    at = page(built.db, screen, run=built.demo, step=STEP, **query)
    table = comparison(at)
    want = expected(printed)
    assert {m for _, m in want} == set(jobs.COMPARE_METHODS)
    assert want[("mood", "semantic")] == "1/2 [12%, 88%]"  # the scripted run's numbers
    for (node, method), cell in want.items():
        assert table.loc[node, method] == cell
    assert "the evidence cannot rank the methods" in text(at)
    assert "n = 2" in text(at)


def test_without_a_finished_comparison_the_button_starts_one(log, tmp_path, monkeypatch):
    built, _ = log
    commands = []
    monkeypatch.setattr(jobs, "launch", lambda cmd, *a, **k: commands.append(cmd) or
                        jobs.Job(built.demo, str(built.db), 999_999_991,
                                 str(tmp_path / "c.log"), cmd, time.time(), 0, returncode=0,
                                 kind="compare"))
    at = page(built.db, "screens/learn.py", run=built.demo, step=STEP, tour="Without siblings")
    assert not [t for t in at.table if "semantic-nosibling" in t.value.columns]
    at.button(key="learn_compare").click().run()
    assert commands[-1][2:5] == ["engine", "blame", built.demo]
    assert commands[-1][-3:] == ["--method", ",".join(jobs.COMPARE_METHODS), "--json"]
