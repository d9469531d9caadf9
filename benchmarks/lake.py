"""A team's lake against a local file, on the same runs: each step's commit, and the
dashboard's pages (docs/team.md).

    .venv/bin/python benchmarks/lake.py [--data-dir ../shared/datasets] [--runs 2]
        [--steps 3] [--train 16] [--val 16] [--repeat 5] [--pg-fsync on|off]

The runs: `sample_graphs/gsm8k.yaml` and `sample_graphs/bbh.yaml` in turn (GSM8K rows and
BIG-Bench Hard's boolean_expressions, real rows through the project's loaders,
`--data-dir`), the scripted backend (its replies are a function of the whole request: a
changed prompt gets another reply), the run settings' defaults otherwise (the reply cache
on), the same run ids and seeds on both sides. They are written once into an empty DuckDB
file and once into an empty lake, `ducklake:postgres:…`, whose catalog is a real
PostgreSQL on 127.0.0.1 (tests/support/postgres.py, here with fsync on, as a production
server runs, unless --pg-fsync off) and whose data path is a local folder beside the file.

Commit: every step's write, RunLogWriter.flush of a StepFinished (the step's rows and its
new cache entries in one transaction; over a lake, then the read of the replies other
writers committed since the previous step), timed around the call; median and max per side.

Pages: every page of benchmarks/dashboard_render.py drawn with Streamlit's AppTest as that
benchmark draws them, "cold": st.cache_data cleared before each draw, so every query of
the page runs again (the sidebar's, the page's, the graph's parse), then once more
"warm" (a rerun, as after a click; over a lake the dashboard asks the catalog for its
snapshot id, the caches' stamp, at most every 0.5 s). The two logs take turns, each page
REPEAT times (`--pages` picks some); min, median and max of the cold draws per side, and
the ratio lake / file of the cold medians against the goal: no slower than 2x. The
dashboard process attaches the lake once, at its first page (a DuckDB ATTACH of the
catalog); that attachment is kept across draws, as a dashboard server keeps it, and its
cost is printed apart. This script reports; it does not assert.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dashboard_render import PAGES  # noqa: E402
from engine.runlog import lake as lakes  # noqa: E402
from engine.runlog import writer as runlog_writer  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402
from tests.support.postgres import (  # noqa: E402
    PASSWORD,
    Postgres,
    start_postgres,
    stop_postgres,
)

DATA = ROOT.parent / "shared" / "datasets"
GRAPHS = [ROOT / "sample_graphs" / "gsm8k.yaml", ROOT / "sample_graphs" / "bbh.yaml"]
GOAL = 2.0
# the Examples page's filtered search: a word of the GSM8K questions
SEARCH = "how"


@dataclass
class Written:
    """One side's runs: each step's commit (seconds, rows) and the runs' wall time."""

    commits: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    wall: float = 0.0
    run_ids: list[str] = field(default_factory=list)


def timed_flush(sink: list[Written]):
    """RunLogWriter.flush, timed when it writes a step (the step's one transaction)."""
    original = runlog_writer.RunLogWriter.flush

    def flush(self, step=None, metrics=None):
        if step is None:
            return original(self, step, metrics)
        rows = sum(len(v) for v in self._buffer.values()) + (
            len(self.cache.pending) if self.cache is not None else 0)
        started = time.perf_counter()
        try:
            return original(self, step, metrics)
        finally:
            sink[-1].commits.append(time.perf_counter() - started)
            sink[-1].rows.append(rows)

    runlog_writer.RunLogWriter.flush = flush
    return original


def write_runs(db: str, args: argparse.Namespace, sink: list[Written]) -> Written:
    """The runs, one after another, into the empty run log `db`."""
    sink.append(Written())
    started = time.perf_counter()
    for i in range(args.runs):
        graph = GRAPHS[i % len(GRAPHS)]
        run_id = f"lake-bench-{i}-{graph.stem}"
        config = RunConfig(graph=str(graph), backend="scripted", steps=args.steps,
                           train=args.train, val=args.val, test=0, data_dir=args.data_dir,
                           db=db, run_id=run_id, seed=i)
        result = asyncio.run(execute(config))
        if result.status != "finished":
            raise SystemExit(f"error: run {run_id} on {db} ended {result.status}: "
                             f"{result.reason}")
        sink[-1].run_ids.append(run_id)
    sink[-1].wall = time.perf_counter() - started
    return sink[-1]


def calls_a_step(db: str) -> float:
    """The median number of model calls (cache hits included) of the runs' steps."""
    with connect(db, read_only=True) as con:
        counts = [r[0] for r in con.execute("SELECT count(*) FROM llm_calls WHERE step IS "
                                            "NOT NULL GROUP BY run_id, step").fetchall()]
    return statistics.median(counts) if counts else 0.0


def deep_link(db: str, run_id: str) -> dict[str, str]:
    """The pages' selection: the first run, step 1, an example it back-propagated, a node."""
    with connect(db, read_only=True) as con:
        example = con.execute("SELECT min(example_id) FROM gradients WHERE run_id = ? AND "
                              "step = 1", [run_id]).fetchone()[0]
        if example is None:
            example = con.execute("SELECT min(example_id) FROM node_outputs WHERE run_id = ? "
                                  "AND step = 1", [run_id]).fetchone()[0]
    return {"run": run_id, "step": "1", "example": str(example), "node": "hint_a"}


def postgres(fsync: bool) -> Postgres:
    """The test cluster of tests/support/postgres.py; with `fsync`, restarted without its
    fsync=off (a commit then waits for its WAL on disk, as on a production server)."""
    server = start_postgres()
    if fsync:
        server.stop()
        server.pg_ctl("-w", "-l", str(server.folder / "server.log"), "-o",
                      f"-p {server.port} -k {server.folder} -c listen_addresses=127.0.0.1 "
                      "-c max_connections=200", "start")
    shown = server.psql("SHOW fsync").strip()
    if shown != ("on" if fsync else "off"):
        raise SystemExit(f"error: the benchmark's PostgreSQL runs with fsync={shown}")
    return server


class Dashboard:
    """One AppTest of dashboard/app.py over one run log, drawn page by page."""

    def __init__(self, db: str, params: dict[str, str]):
        from streamlit.testing.v1 import AppTest

        self.db = db
        self.at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=300)
        self.at.query_params.update(params)
        self.draw()  # imports and the entry file, outside the measurements

    def draw(self) -> float:
        os.environ["SEMBACK_DB"] = self.db  # the sidebar's run log (default_db)
        started = time.perf_counter()
        self.at.run()
        took = time.perf_counter() - started
        if self.at.exception:
            raise RuntimeError(f"{self.db}: {self.at.exception[0].value}")
        return took

    def open(self, label: str) -> None:
        page, _, query = label.partition("?")
        for key, value in (p.split("=") for p in query.split("&") if p):
            self.at.query_params[key] = value
        self.at.switch_page(f"screens/{page}.py")

    def check(self, label: str, run_id: str) -> None:
        """The page drew the run, not an empty or unreadable run log."""
        said = [e.value for e in self.at.error] + [c.value for c in self.at.caption]
        bad = [s for s in said if "No runs in this run log" in str(s)
               or str(s).startswith("Cannot read")]
        if bad or self.at.session_state["run"] != run_id:
            raise SystemExit(f"error: {label} over {self.db} did not show run {run_id}: "
                             f"{bad[:1] or 'another run'}")


def patch_pages() -> None:
    """Pages run as a live server runs them (benchmarks/dashboard_render.py, the tests)."""
    import streamlit.testing.v1  # noqa: F401 - its loggers exist before their level is set
    from streamlit import logger
    from streamlit.runtime.pages_manager import PagesManager

    original = PagesManager.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = init
    logger.set_log_level("error")  # AppTest's bare-mode notices
    # clearing caches outside a script run notes that there is none: expected here
    for name in ("streamlit.runtime.caching.cache_data_api",
                 "streamlit.runtime.scriptrunner_utils.script_run_context"):
        logger.get_logger(name).disabled = True


def time_pages(sides: dict[str, str], params: dict[str, str], pages: list[str],
               repeat: int) -> dict[str, dict[str, tuple[list[float], list[float]]]]:
    """{page: {side: (cold seconds, warm seconds)}}, the sides taking turns."""
    import streamlit as st

    patch_pages()
    boards = {side: Dashboard(db, params) for side, db in sides.items()}
    out: dict[str, dict[str, tuple[list[float], list[float]]]] = {}
    for label in pages:
        for board in boards.values():
            board.open(label)
        out[label] = {side: ([], []) for side in boards}
        for _ in range(repeat):
            for side, board in boards.items():
                st.cache_data.clear()  # cold: every query, the graph parse, the drawing's
                out[label][side][0].append(board.draw())
                out[label][side][1].append(board.draw())
                board.check(label, params["run"])
    return out


def attach_seconds(db: str) -> float:
    """What a fresh dashboard process pays once for the lake: ATTACH of its catalog."""
    lakes.forget(db)
    started = time.perf_counter()
    lakes.cursor(db).close()
    return time.perf_counter() - started


def machine() -> str:
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    pg = subprocess.run(["psql", "--version"], capture_output=True, text=True).stdout.strip()
    import duckdb

    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {platform.node()}, {os.cpu_count()} CPUs, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; Python "
            f"{platform.python_version()}, DuckDB {duckdb.__version__}, {pg or 'PostgreSQL'}")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.environ.get("SEMBACK_DATA_DIR", str(DATA)))
    parser.add_argument("--runs", type=int, default=2,
                        help="runs on each side (gsm8k.yaml and bbh.yaml in turn)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--train", type=int, default=16)
    parser.add_argument("--val", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="cold draws of each page a side")
    parser.add_argument("--pg-fsync", choices=["on", "off"], default="on",
                        help="PostgreSQL's fsync (the tests run it off)")
    parser.add_argument("--pages", nargs="*", help="only these pages (default: every page)")
    args = parser.parse_args()
    if not (Path(args.data_dir) / "gsm8k").is_dir():
        raise SystemExit(f"error: no GSM8K rows under {args.data_dir} (--data-dir)")
    print(f"machine: {machine()}")
    print(f"runs: {args.runs} ({', '.join(g.name for g in GRAPHS[:args.runs])}), "
          f"{args.steps} steps, {args.train} train + {args.val} validation real rows each, "
          "scripted backend, run defaults; the same runs into an empty file and an empty "
          f"lake (PostgreSQL catalog on 127.0.0.1, fsync {args.pg_fsync}; local data folder)")
    folder = Path(tempfile.mkdtemp(prefix="lake-bench-"))
    server = postgres(args.pg_fsync == "on")
    os.environ["PGPASSWORD"] = PASSWORD  # libpq's variable, as a team member sets it
    os.environ[lakes.DATA_PATH_ENV] = str(folder / "lake-data")
    sink: list[Written] = []
    original = timed_flush(sink)
    try:
        file_db = str(folder / "runs.duckdb")
        lake_db = f"ducklake:postgres:{server.dsn(server.create_database('team_runs'))}"
        sides = {"file": file_db, "lake": lake_db}
        written = {side: write_runs(db, args, sink) for side, db in sides.items()}
        runlog_writer.RunLogWriter.flush = original
        print(f"\nstep commit (RunLogWriter.flush: one transaction a step; "
              f"{len(written['file'].commits)} steps a side, median "
              f"{statistics.median(written['file'].rows):,.0f} rows and "
              f"{calls_a_step(file_db):,.0f} model calls a step)")
        print(f"{'log':<6}{'median ms':>10}{'max ms':>8}{'runs wall s':>13}")
        for side, w in written.items():
            print(f"{side:<6}{ms(statistics.median(w.commits)):>10}{ms(max(w.commits)):>8}"
                  f"{w.wall:>13.1f}")
        data_mb = sum(p.stat().st_size for p in (folder / "lake-data").rglob("*")
                      if p.is_file()) / 1e6
        print(f"sizes: file {Path(file_db).stat().st_size / 1e6:.1f} MB; lake data "
              f"{data_mb:.1f} MB in {sum(1 for _ in (folder / 'lake-data').rglob('*.parquet'))}"
              " Parquet files")

        params = deep_link(file_db, written["file"].run_ids[0])
        pages = [p.replace("q=record", f"q={SEARCH}") for p in PAGES]
        if args.pages:
            pages = [p for p in pages if p.split("?")[0] in args.pages or p in args.pages]
        attach = attach_seconds(lake_db)
        print(f"\npages, cold (caches cleared), {args.repeat} draws each a side, turns "
              f"taken; deep link " + "&".join(f"{k}={v}" for k, v in params.items()))
        print(f"attaching the lake, once a dashboard process: {ms(attach)} ms (not in the "
              "pages' times)")
        timings = time_pages(sides, params, pages, args.repeat)
        print(f"{'page':<40}{'file ms min/med/max':>21}{'lake ms min/med/max':>21}"
              f"{'lake/file':>10}{'warm f/l ms':>13}")
        ratios = []
        for label, by_side in timings.items():
            cells = []
            for side in sides:
                cold = by_side[side][0]
                cells.append(f"{ms(min(cold))}/{ms(statistics.median(cold))}/{ms(max(cold))}")
            ratio = (statistics.median(by_side["lake"][0])
                     / statistics.median(by_side["file"][0]))
            ratios.append(ratio)
            warm = "/".join(ms(statistics.median(by_side[s][1])) for s in sides)
            flag = "" if ratio <= GOAL else "  over 2x"
            print(f"{label:<40}{cells[0]:>21}{cells[1]:>21}{ratio:>9.2f}x{warm:>13}{flag}")
        medians = {side: statistics.median(statistics.median(t[side][0])
                                           for t in timings.values()) for side in sides}
        print("median over the pages, cold: " + ", ".join(
            f"{side} {ms(m)} ms" for side, m in medians.items()))
        over = [p for p, r in zip(timings, ratios, strict=True) if r > GOAL]
        print(f"goal: every page no slower than {GOAL:g}x over the lake: worst "
              f"{max(ratios):.2f}x, median {statistics.median(ratios):.2f}x; "
              + ("meets" if not over else f"misses on {', '.join(over)}"))
        print(f"machine at the end: {machine()}")
    finally:
        runlog_writer.RunLogWriter.flush = original
        for db in list(lakes._open):
            lakes.forget(db[0])
        stop_postgres(server)
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
