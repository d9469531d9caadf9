"""`python -m engine mcp`: the real server over stdio, driven by the `mcp` SDK's own client,
on a run log made by a real scripted run of the demo (its scripted model obeys prompts
literally, so `note`'s known fix makes every answer right). Each tool answers what its
command answers; blame's estimate spends nothing and a budget refuses before spending;
validate_prompts calls a difference an improvement only when its paired interval clears
zero; a bad run id is the command line's one-line error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from contextlib import asynccontextmanager

import duckdb
import pytest

from engine.mcp.commands import run_command
from tests.support.graphs import REPO

pytest.importorskip("mcp")
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402

TOOLS = {"list_runs", "show_run", "failing_examples", "blame", "probe", "diff", "propose",
         "prompts", "validate_prompts"}
FIX = "Write one number about the text."  # the demo's known fix of `note`


def engine(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[str, str]:
    """(run log, run id) of one scripted demo run."""
    db = str(tmp_path_factory.mktemp("mcp") / "runs.duckdb")
    done = engine("run", "sample_graphs/demo.yaml", "--backend", "scripted",
                  "--scripted-responder", "sample_graphs/demo_responder.py:demo_responder",
                  "--db", db)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = engine("runs", "--db", db, "--json")
    return db, json.loads(listed.stdout)[0]["run_id"]


@asynccontextmanager
async def connected(db: str):
    params = StdioServerParameters(command=sys.executable,
                                   args=["-m", "engine", "mcp", "--db", db], cwd=str(REPO))
    with open(os.devnull, "w") as server_log:
        async with stdio_client(params, errlog=server_log) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, tool: str, arguments: dict, **kwargs) -> tuple:
    """(is_error, the JSON answer, or the error's text)."""
    result = await session.call_tool(tool, arguments, **kwargs)
    (block,) = result.content
    return bool(result.is_error), (block.text if result.is_error else json.loads(block.text))


def model_calls(db: str) -> int:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT count(*) FROM llm_calls").fetchone()[0]


@pytest.mark.slow  # a server and engine commands as processes: the file takes ~40 s
def test_the_tools_resources_and_list_runs(demo):
    db, run_id = demo

    async def scenario():
        async with connected(db) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            error, runs = await call(session, "list_runs", {})
            graph = await session.read_resource(f"semback://runs/{run_id}/graph")
            verdict = await session.read_resource("semback://docs/reading-a-verdict")
            return names, error, runs, graph.contents[0].text, verdict.contents[0].text

    names, error, runs, graph, verdict = asyncio.run(scenario())
    assert names == TOOLS
    assert not error and runs == json.loads(engine("runs", "--db", db, "--json").stdout)
    assert [r["run_id"] for r in runs] == [run_id]
    graph = json.loads(graph)
    assert [n["id"] for n in graph["nodes"]] == ["note", "thing", "answer"]
    assert {(e["from"], e["to"]) for e in graph["edges"]} == {("note", "answer"),
                                                              ("thing", "answer")}
    assert graph["nodes"][0]["prompt"] == "Write one word about the text."
    assert verdict.startswith("#") and "Then the verdict" in verdict


@pytest.mark.slow  # a server and engine commands as processes: the file takes ~40 s
def test_show_run_scores_carry_n_and_interval_and_failing_examples_their_traces(demo):
    db, run_id = demo

    async def scenario():
        async with connected(db) as session:
            return (await call(session, "show_run", {"run_id": run_id}),
                    await call(session, "failing_examples", {"run_id": run_id, "split": "val"}))

    (error, run), (failing_error, failing) = asyncio.run(scenario())
    assert not error and not failing_error
    assert [s["step"] for s in run["steps"]] == [0, 1]
    val = run["steps"][0]["val"]
    assert val["n"] == 24 and val["score"] == 0.0 and val["interval"][0] == 0.0
    assert 0.1 < val["interval"][1] < 0.2  # Wilson's 95% upper bound of 0 of 24
    assert failing["step"] == 1 and failing["failing"] == failing["examples"] == 24
    trace = failing["items"][0]["trace"]
    assert [t["node"] for t in trace] == ["note", "thing", "answer"]
    assert all(t["input"] and t["output"] is not None for t in trace)


@pytest.mark.slow  # a server and engine commands as processes: the file takes ~40 s
def test_blame_estimates_for_free_refuses_over_budget_and_matches_the_command(demo):
    db, run_id = demo
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async def scenario():
        async with connected(db) as session:
            before = model_calls(db)
            estimate = await call(session, "blame", {"run_id": run_id, "estimate_only": True})
            refused = await call(session, "blame", {"run_id": run_id, "max_calls": 1})
            spent = model_calls(db) - before
            report = await call(session, "blame", {"run_id": run_id},
                                progress_callback=progress)
            return estimate, refused, spent, report

    (error, estimate), (refused, message), spent, (blame_error, report) = \
        asyncio.run(scenario())
    assert not error and spent == 0
    assert estimate["estimate"].startswith("blame: up to")
    assert estimate["probes"] > 0 and estimate["calls"] > 1
    assert f"about {estimate['calls']} model calls" in estimate["estimate"]
    assert refused and message.startswith("error:") and "max_calls 1" in message
    assert estimate["estimate"] in message and "nothing was spent" in message
    direct = engine("blame", run_id, "--db", db, "--json")
    assert not blame_error and report["verdict"] == json.loads(direct.stdout)["verdict"]
    assert seen and all(total and 0 <= done <= total for done, total, _ in seen)
    assert [d for d, _, _ in seen] == sorted({d for d, _, _ in seen})  # always increasing
    assert all(message and message.startswith("probes ") for _, _, message in seen)


@pytest.mark.slow  # a server and engine commands as processes: the file takes ~40 s
def test_validate_prompts_names_an_improvement_only_beyond_noise(demo, tmp_path):
    db, run_id = demo
    # a fork whose last step kept `note`'s fix: the baseline is that kept prompt, re-run
    forked = str(tmp_path / "forked.duckdb")
    shutil.copy(db, forked)
    (tmp_path / "fix.txt").write_text(FIX, encoding="utf-8")
    done = engine("run", "--fork", run_id, "--from-step", "1", "--steps", "0",
                  "--set-prompt", f"note=@{tmp_path / 'fix.txt'}", "--db", forked)
    assert done.returncode == 0, done.stderr[-2000:]
    (fork,) = [r["run_id"] for r in json.loads(engine("runs", "--db", forked, "--json").stdout)
               if r["run_id"] != run_id]

    async def scenario():
        async with connected(db) as session:
            answers = [await call(session, "validate_prompts",
                                  {"run_id": run_id, "prompts": {"note": prompt}})
                       for prompt in (FIX, "Write one word about the text.")]
            answers.append(await call(session, "validate_prompts", {
                "run_id": run_id, "prompts": {"note": FIX, "thing": "Say 1."}}))
            answers.append(await call(session, "validate_prompts", {
                "run_id": fork, "prompts": {"note": "Write one word about the text."},
                "db": forked}))
            _, failing = await call(session, "failing_examples",
                                    {"run_id": run_id, "split": "val"})
            two = ",".join(item["example_id"] for item in failing["items"][:2])
            answers.append(await call(session, "validate_prompts", {
                "run_id": run_id, "prompts": {"note": FIX}, "examples": two}))
            return answers

    (fix_error, fixed), (noop_error, noop), (several, message), (back_error, back), \
        (few_error, few) = asyncio.run(scenario())
    assert not fix_error and not noop_error and not back_error and not few_error
    assert fixed["n"] == 24 and fixed["node"] == "note"
    assert fixed["before"]["score"] == 0.0 and fixed["after"]["score"] == 1.0
    assert fixed["difference"]["counts"]["after_only"] == 24
    assert fixed["difference"]["interval"][0] > 0 and fixed["improvement"] is True
    assert "note" not in fixed
    low, high = noop["difference"]["interval"]
    assert noop["difference"]["value"] == 0.0 and low < 0 < high
    assert noop["improvement"] is False and "noise" in noop["note"]
    assert several and message.startswith("error: only one node at a time")
    # against the fork's kept fix, the old prompt is worse, beyond noise
    assert "re-run" in back["baseline"] and back["before"]["score"] == 1.0
    assert back["after"]["score"] == 0.0 and back["difference"]["interval"][1] < 0
    assert back["improvement"] is False and back["note"].startswith("worse")
    # the fix on two examples: fixed both, but at n = 2 that is not beyond noise
    assert few["n"] == 2 and few["difference"]["value"] == 1.0
    assert few["difference"]["interval"][0] < 0 < few["difference"]["interval"][1]
    assert few["improvement"] is False and "noise" in few["note"]


@pytest.mark.slow  # the traces walkthrough, then the server: about 30 s
def test_on_an_imported_pipeline_run_blame_names_the_call_at_fault(tmp_path):
    """An imported run (docs/traces.md's walkthrough: a plain-Python pipeline's traces,
    imported and back-propagated against the scripted server, whose `numbers` prompt is at
    fault): the tools see it, blame's estimate spends nothing, and blame names `numbers`,
    re-calling the run's model as the command does."""
    from benchmarks.traces_blame import RUN_ID, main
    from tests.support.fake_openai import FakeOpenAIServer
    from tests.support.traced_pipeline import responder

    with FakeOpenAIServer(responder=responder) as server:
        assert main(["--base-url", server.base_url, "--sentences", "4",
                     "--dir", str(tmp_path)]) == 0
        db = str(tmp_path / "traces.duckdb")

        async def scenario():
            async with connected(db) as session:
                listed = await call(session, "list_runs", {})
                shown = await call(session, "show_run", {"run_id": RUN_ID})
                before = model_calls(db)
                estimate = await call(session, "blame", {"run_id": RUN_ID,
                                                         "estimate_only": True})
                spent = model_calls(db) - before
                report = await call(session, "blame", {"run_id": RUN_ID})
                return listed, shown, estimate, spent, report

        (_, runs), (_, run), (error, estimate), spent, (blame_error, report) = \
            asyncio.run(scenario())
    assert RUN_ID in [r["run_id"] for r in runs]
    assert "numbers" in json.dumps(run)  # the imported graph's call sites
    assert not error and spent == 0 and estimate["estimate"].startswith("blame: up to")
    assert not blame_error and report["verdict"]["node"] == "numbers"


@pytest.mark.slow  # a server and engine commands as processes: the file takes ~40 s
def test_a_bad_run_id_is_the_command_lines_one_line_error(demo):
    db, _ = demo

    async def scenario():
        async with connected(db) as session:
            return [await call(session, tool, {"run_id": "no-such-run"})
                    for tool in ("blame", "show_run", "prompts")]

    direct = engine("blame", "no-such-run", "--db", db, "--json")
    (line,) = [ln for ln in direct.stderr.splitlines() if ln.startswith("error:")]
    for error, text in asyncio.run(scenario()):
        assert error and text == line
        assert "Traceback" not in text and "\n" not in text


def test_without_the_mcp_package_the_command_says_what_to_install():
    hidden = ("import sys; sys.modules['mcp'] = None; from engine.cli import main; "
              "sys.exit(main(['mcp']))")
    done = subprocess.run([sys.executable, "-c", hidden], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: python -m engine mcp needs the mcp extra: "
                                   "pip install .[mcp]")


CHILD = """
import os, sys, time
sys.stderr.write("setup\\nprobes 1/4 done\\rprobes 2/4 done\\rprobes 2/4 done\\n")
sys.stderr.flush()
open(sys.argv[1], "w").write(str(os.getpid()))
time.sleep(float(sys.argv[2]))
print('{"ok": true}')
"""


def test_progress_lines_are_forwarded_as_they_come_and_a_cancelled_call_stops_the_child(
        tmp_path):
    pid_file = tmp_path / "pid"
    seen: list[tuple[int, int, str]] = []

    async def progress(done: int, total: int, line: str) -> None:
        seen.append((done, total, line))

    finished = asyncio.run(run_command([sys.executable, "-c", CHILD, str(pid_file), "0"],
                                       progress))
    assert finished.returncode == 0 and json.loads(finished.stdout) == {"ok": True}
    assert seen == [(1, 4, "probes 1/4 done"), (2, 4, "probes 2/4 done")]

    async def cancelled() -> None:
        task = asyncio.ensure_future(
            run_command([sys.executable, "-c", CHILD, str(pid_file), "60"]))
        while not pid_file.read_text():
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    pid_file.write_text("")
    asyncio.run(cancelled())
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
