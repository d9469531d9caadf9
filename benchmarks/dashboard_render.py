"""Server-side render time of every dashboard page on a run with ~20,000 activations.

    python benchmarks/dashboard_render.py [--activations 20000] [--examples 10000]
                                          [--db PATH] [--keep]
    python benchmarks/dashboard_render.py --demo   # every page on the demo run (goal 1.5 s)

Builds a synthetic run log (six nodes: five analysis nodes feeding a final one, as in the
LIAR graph) by inserting DataFrames through engine.runlog.writer.insert_rows, then renders
each page with Streamlit's AppTest, twice: "cold" (caches cleared: the sidebar's and the
page's queries, the graph parse, the drawing's data) and "warm" (a rerun, as after a click).
The Learn page shows its tour only for runs of the demo graph; here it renders its
"no demo run" state. Then the Examples page (table, trace, filtered search) on a second
run log with --examples examples per step (default 10,000). Prints one line per page. The goal is
under one second per page; this script reports, it does not assert.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.runlog.schema import connect, ensure_schema  # noqa: E402
from engine.runlog.writer import insert_rows  # noqa: E402

RUN = "bench-semantic"
ANALYSES = ["statement", "party", "job", "source", "state"]
NODES = [*ANALYSES, "final"]
GRAPH = "\n".join([
    "name: bench", "input_fields: [text]", "target_field: label", "metric: yes_no",
    "nodes:",
    *[f"  - {{id: {n}, prompt: Analyse the {n} in at most two sentences., inputs: [text]}}"
      for n in ANALYSES],
    f"  - {{id: final, prompt: 'Is the statement a lie? Answer Yes or No.', "
    f"inputs: [text, {', '.join(ANALYSES)}], output: true}}", ""])
PAGES = ["runs", "graph", "step", "inspect", "curves", "compare", "learn", "examples",
         "examples?view=trace", "examples?view=table&failing=1&q=record", "history"]


def _messages(prompt: str, body: str) -> str:
    return json.dumps([{"role": "system", "content": "You are one step in a pipeline."},
                       {"role": "user", "content": f"## Task\n{prompt}\n\n## Inputs\n{body}"}])


def build(db: Path, activations: int, seed: int = 0, steps: int = 11) -> dict[str, str]:
    """Write one finished run; returns the deep-link parameters of an interesting view."""
    rng = random.Random(seed)
    per_step = max(2, activations // (steps * len(NODES)))
    n_train = per_step // 2
    examples = [f"ex{i:05d}" for i in range(per_step)]
    split = {e: ("train" if i < n_train else "val") for i, e in enumerate(examples)}
    rows: dict[str, list[dict]] = {t: [] for t in (
        "runs", "steps", "examples", "prompt_versions", "node_outputs", "losses", "gradients",
        "updates", "llm_calls", "metrics")}
    now = time.time()
    rows["runs"].append({
        "run_id": RUN, "graph_name": "bench", "graph_yaml": GRAPH, "method": "semantic",
        "backend": "scripted", "model": "scripted", "optimizer_model": "scripted", "seed": 0,
        "config": json.dumps({"steps": steps - 1}), "status": "finished", "started_at": now,
        "ended_at": now + 600, "error": None})
    for i, e in enumerate(examples):
        rows["examples"].append({"run_id": RUN, "split": split[e], "example_id": e,
                                 "position": i, "fields": json.dumps({"text": f"claim {i}"}),
                                 "target": rng.choice(["Yes", "No"])})
    prompts = {n: f"Analyse the {n} in at most two sentences." for n in NODES}
    version = {n: 0 for n in NODES}
    for n in NODES:
        rows["prompt_versions"].append({"run_id": RUN, "node_id": n, "version": 0,
                                        "prompt": prompts[n], "step": 0, "accepted": True})
    call = 0
    val = 0.4
    for step in range(steps):
        scores = {}
        for e in examples:
            outputs = {}
            for n in NODES:
                call += 1
                cid = f"c{call}"
                text = f"{n} analysis of {e} at step {step}: " + " ".join(
                    rng.choice(["likely", "unclear", "partisan", "sourced", "false"])
                    for _ in range(25))
                outputs[n] = text
                rows["node_outputs"].append({
                    "run_id": RUN, "step": step, "split": split[e], "example_id": e,
                    "node_id": n, "prompt_version": version[n],
                    "input_text": f'<input name="text">\nclaim {e}\n</input>',
                    "output_text": text, "raw_text": text, "call_id": cid})
                rows["llm_calls"].append({
                    "call_id": cid, "run_id": RUN, "step": step, "example_id": e, "node_id": n,
                    "purpose": "forward", "backend": "scripted", "model": "scripted",
                    "messages": _messages(prompts[n], f"claim {e}"), "response": text,
                    "prompt_tokens": 90, "completion_tokens": 40, "latency_ms": 300.0,
                    "cache_hit": False, "retries": 0, "started_at": now, "cost_usd": 1e-5})
            score = float(rng.random() < val)
            scores[e] = score
            rows["losses"].append({"run_id": RUN, "step": step, "split": split[e],
                                   "example_id": e, "prediction": "Yes", "target": "No",
                                   "score": score,
                                   "feedback": 'The expected output is: "No".'})
        failing = [e for e in examples[:n_train] if scores[e] < 1][:2]
        accepted = step > 0 and rng.random() < 0.5
        for e in failing if step > 0 else []:
            call += 1
            cid = f"c{call}"
            rows["llm_calls"].append({
                "call_id": cid, "run_id": RUN, "step": step, "example_id": e,
                "node_id": "final", "purpose": "backward", "backend": "scripted",
                "model": "scripted", "messages": _messages("backward", "all five analyses"),
                "response": "gradients", "prompt_tokens": 600, "completion_tokens": 200,
                "latency_ms": 900.0, "cache_hit": False, "retries": 0, "started_at": now,
                "cost_usd": 1e-4})
            rows["gradients"].append({"run_id": RUN, "step": step, "example_id": e,
                                      "node_id": "final", "from_node_id": "loss",
                                      "method": "semantic", "content": "Expected No.",
                                      "kind": "gradient"})
            for n in NODES:
                if n != "final":
                    rows["gradients"].append({
                        "run_id": RUN, "step": step, "example_id": e, "node_id": n,
                        "from_node_id": "final", "method": "semantic", "call_id": cid,
                        "content": f"The {n} analysis should weigh the speaker's record.",
                        "kind": "gradient"})
                rows["gradients"].append({
                    "run_id": RUN, "step": step, "example_id": e, "node_id": n,
                    "from_node_id": None, "method": "semantic", "kind": "aggregate",
                    "content": f"Aggregated feedback for {n}."})
        if step > 0:
            for n in NODES:
                new = prompts[n] + " Weigh the speaker's record."
                rows["updates"].append({"run_id": RUN, "step": step, "node_id": n,
                                        "old_prompt": prompts[n], "new_prompt": new,
                                        "accepted": accepted, "val_before": val,
                                        "val_after": val + (0.05 if accepted else -0.02),
                                        "reasoning": "Failures ignore the speaker."})
                rows["prompt_versions"].append({"run_id": RUN, "node_id": n,
                                                "version": step, "prompt": new, "step": step,
                                                "accepted": accepted})
                if accepted:
                    prompts[n], version[n] = new, step
            val = min(val + (0.05 if accepted else 0.0), 0.95)
        rows["steps"].append({"run_id": RUN, "step": step, "train_score": val - 0.05,
                              "val_score": val, "accepted": accepted, "started_at": now,
                              "ended_at": now + 1})
    with connect(db) as con:
        ensure_schema(con, str(db))
        con.execute("BEGIN TRANSACTION")
        for table, items in rows.items():
            insert_rows(con, table, items)
        second = dict(rows["runs"][0], run_id="bench-textgrad", method="textgrad",
                      started_at=now - 10)
        insert_rows(con, "runs", [second])
        insert_rows(con, "steps", [dict(r, run_id="bench-textgrad") for r in rows["steps"]])
        con.execute("COMMIT")
    example = next(g["example_id"] for g in rows["gradients"] if g["step"] == 1)
    print(f"run log: {len(rows['node_outputs']):,} activations, {len(rows['llm_calls']):,} "
          f"calls, {len(rows['gradients']):,} gradients, {db.stat().st_size / 1e6:.1f} MB")
    return {"run": RUN, "step": "1", "example": example, "node": "party"}


def render(db: Path, params: dict[str, str], pages: list[str] = PAGES
           ) -> list[tuple[str, float, float]]:
    import streamlit as st
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.testing.v1 import AppTest

    original = PagesManager.__init__

    def init(self, *args, **kwargs):  # run pages as a live server does (see tests)
        original(self, *args, **kwargs)
        PagesManager.uses_pages_directory = False

    PagesManager.__init__ = init
    from streamlit import logger

    logger.set_log_level("error")  # AppTest's bare-mode notices
    # clearing caches outside a server notes that it has no runtime: expected here
    logger.get_logger("streamlit.runtime.caching.cache_data_api").disabled = True
    os.environ["SEMBACK_DB"] = str(db)
    at = AppTest.from_file(str(ROOT / "dashboard" / "app.py"), default_timeout=120)
    at.query_params.update(params)
    at.run()  # imports and the entry file, outside the measurements
    results = []
    for label in pages:
        page, _, query = label.partition("?")
        for key, value in (p.split("=") for p in query.split("&") if p):
            at.query_params[key] = value
        at.switch_page(f"screens/{page}.py")
        st.cache_data.clear()  # cold: every query, the graph parse and the drawing's data
        timings = []
        for _ in range(2):
            start = time.perf_counter()
            at.run()
            timings.append(time.perf_counter() - start)
        if at.exception:
            raise RuntimeError(f"{page}: {at.exception[0].value}")
        results.append((label, *timings))
    PagesManager.__init__ = original
    return results


def report(results: list[tuple[str, float, float]], goal: float = 1.0) -> None:
    print(f"{'page':<42}{'cold (s)':>10}{'warm (s)':>10}")
    for page, cold, warm in results:
        flag = "" if cold < goal else f"  (over the {goal:g} s goal)"
        print(f"{page:<42}{cold:>10.3f}{warm:>10.3f}{flag}")


def build_demo(db: Path) -> dict[str, str]:
    """The demo run as a new user makes it (sample_graphs/demo.yaml, its own settings: one
    step), on the scripted backend with the demo's responder (the embedded pair's log has
    the same shape; only its texts differ), then blame on its validation examples, as the
    Graph page's button runs it: the pages' deep link."""
    import asyncio

    from engine.probes.blame import blame
    from engine.runs.execute import RunConfig, execute

    responder = f"{ROOT / 'sample_graphs' / 'demo_responder.py'}:demo_responder"
    config = RunConfig(graph=str(ROOT / "sample_graphs" / "demo.yaml"), backend="scripted",
                       scripted_responder=responder, db=str(db), run_id="demo-bench")
    result = asyncio.run(execute(config))
    asyncio.run(blame(str(db), result.run_id, 1, "val"))
    with connect(db, read_only=True) as con:
        example = con.execute("SELECT example_id FROM examples WHERE run_id = ? AND split = "
                              "'val' ORDER BY position LIMIT 1", [result.run_id]).fetchone()[0]
    return {"run": result.run_id, "step": "1", "example": example, "node": "note"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", type=int, default=20_000)
    parser.add_argument("--examples", type=int, default=10_000,
                        help="examples per step of the second run log, for the Examples "
                             "page (0: skip it)")
    parser.add_argument("--db", help="where to write the run log (default: a temp file)")
    parser.add_argument("--keep", action="store_true", help="keep the temp run log")
    parser.add_argument("--demo", action="store_true",
                        help="only: every page on the demo run (one step and a blame), as a "
                             "newcomer first sees them")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    if args.demo:
        db = Path(args.db) if args.db else folder / "demo.duckdb"
        db.unlink(missing_ok=True)
        params = build_demo(db)
        print("the demo run (scripted demo model), blame on its validation examples; deep "
              "link: " + "&".join(f"{k}={v}" for k, v in params.items()))
        report(render(db, params), goal=1.5)
        return
    db = Path(args.db) if args.db else folder / "bench.duckdb"
    db.unlink(missing_ok=True)
    started = time.perf_counter()
    params = build(db, args.activations)
    print(f"built in {time.perf_counter() - started:.1f} s; deep link: "
          + "&".join(f"{k}={v}" for k, v in params.items()))
    report(render(db, params))
    if args.examples:
        wide = folder / "wide.duckdb"
        wide.unlink(missing_ok=True)
        started = time.perf_counter()
        # two steps (0 and 1) of `examples` examples each, six nodes per example
        params = build(wide, args.examples * 2 * len(NODES), seed=1, steps=2)
        print(f"built in {time.perf_counter() - started:.1f} s ({args.examples:,} examples "
              "per step); Examples page:")
        report(render(wide, params, [p for p in PAGES if p.startswith("examples")]))
    if not (args.keep or args.db):
        for path in folder.iterdir():
            path.unlink()
        folder.rmdir()


if __name__ == "__main__":
    main()
