"""The one-click demo on the embedded model: before and after structured replies.

Runs sample_graphs/demo.yaml with `--backend local --steps 1` (what the dashboard's
"Run the demo" button starts) on the default seed, twice, each into a temporary run log:

- before: `--structured off --allow-copies` and no KV-state cache: the text formats and
  parsers, no copy detection, as before structured replies;
- after: `--structured on` (grammar-constrained JSON replies), copy detection on, the
  KV-state cache on (the defaults, with `auto` made strict).

- serial: the same as after, with `--concurrency 1`: one call at a time (one llama-server
  slot, or one in-process llama context with every core).

Each run's model is served as `--serving` says (default auto: llama-server when it is
installed, engine/llm/server.py; else in-process). For each it prints the wall time, the
share of backward and update replies read by a fallback rule (goal: 0 with --structured
on), the proposals flagged as copying training examples, the validation scores, one
gradient and one proposed prompt, and the peak RSS of this process and its children (the
server) together (goal on the default model: at most 3 GB). The process's CPU time is
printed too: on a busy machine it varies less than the wall time (it leaves out the
server's).

For the forward model's calls and the optimizer's apart, it prints their time at the
model summed (latency less the wait for a turn, `llm_calls.queued_ms`), the wall time in
which one or more of them was at the model, and the ratio of the two: how many calls the
server decoded at once on average (1.00 at `--concurrency 1`).

By default it runs `after` and `serial` and prints both walls, their ratio (goal: at most
0.5) and whether every score is the same (at temperature 0 it should be in-process; a
server decoding several calls in one batch may differ in the last bits of a logit).

    .venv/bin/python benchmarks/demo_local.py [--steps 1] [--seed 0] [--model NAME|PATH]
                                              [--serving auto|server|in-process]
                                              [--only before|after|serial]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peak_rss import PeakRSS  # noqa: E402
from engine.core.copies import COPY_REASON  # noqa: E402
from engine.core.graph import load_graph  # noqa: E402
from engine.events import CallRecord, Gradient, Proposal, StepFinished  # noqa: E402
from engine.prompts import structured as S  # noqa: E402
from engine.prompts import templates as P  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402

SETTINGS = {
    "before": {"structured": "off", "allow_copies": True, "kv_cache": False},
    "after": {"structured": "on", "allow_copies": False, "kv_cache": True},
    "serial": {"structured": "on", "allow_copies": False, "kv_cache": True, "concurrency": 1},
}
DEFAULT_RUNS = ("after", "serial")


def run_demo(name: str, steps: int, seed: int, model: str | None,
             serving: str) -> tuple[object, float, float, int]:
    """(result, wall seconds, CPU seconds, peak RSS bytes of this process and the server)."""
    from engine.llm.factory import make_backend

    settings = SETTINGS[name]
    concurrency = settings.get("concurrency")
    backend = make_backend("local", model=model, contexts=concurrency, serving=serving)
    if not settings["kv_cache"] and hasattr(backend, "kv_cache_bytes"):
        backend.kv_cache_bytes = 0  # the in-process backend's saved prompt states
    with tempfile.TemporaryDirectory() as tmp, PeakRSS() as rss:
        graph = ROOT / "sample_graphs" / "demo.yaml"
        config = RunConfig(graph=str(graph), backend="local", model=model,
                           local_serving=serving,
                           **{**load_graph(str(graph)).run_defaults(), "steps": steps},
                           seed=seed, db=str(Path(tmp) / "runs.duckdb"),
                           structured=settings["structured"],
                           allow_copies=settings["allow_copies"], concurrency=concurrency)
        started, cpu = time.perf_counter(), time.process_time()
        result = asyncio.run(execute(config, forward_backend=backend))
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(f"({name}: {backend!r})")
    return result, wall, cpu, rss.peak


def decoded_together(result, purposes: tuple[str, ...]) -> str:
    """How well the calls of `purposes` used the model's slots: their time at the model
    summed (each call's latency less its wait for a turn, `queued_ms`), the wall time in
    which at least one of them was at the model, the ratio of the two (calls at the model
    at once, on average), and their summed wait for a turn."""
    calls = [c for c in result.events.of(CallRecord)
             if c.purpose in purposes and not c.cache_hit]
    spans = sorted((c.started_at + c.queued_ms / 1000, c.started_at + c.latency_ms / 1000)
                   for c in calls)
    busy, end = 0.0, float("-inf")
    for start, stop in spans:  # the union of the calls' times at the model
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    summed = sum(stop - start for start, stop in spans)
    waited = sum(c.queued_ms for c in calls) / 1000
    at_once = f"{summed / busy:.2f} at the model at once on average" if busy else "none"
    return (f"{len(calls)} calls, {summed:.1f} s at the model summed over {busy:.1f} s of "
            f"wall with one or more at it ({at_once}); {waited:.1f} s waiting for a turn "
            "summed")


def fallback_shares(result) -> tuple[tuple[int, int], tuple[int, int]]:
    """((backward replies read by a fallback, backward replies), (the same for updates))."""
    calls = {c.call_id: c for c in result.events.of(CallRecord)}
    backward: dict[str, bool] = {}
    for g in result.events.of(Gradient):
        if g.kind == "gradient" and g.call_id in calls and calls[g.call_id].purpose == "backward":
            backward[g.call_id] = backward.get(g.call_id, False) or g.parse_error is not None
    updates = [c for c in calls.values() if c.purpose == "update" and not c.error]
    fell_back = sum(P.parse_prompt(S.reply_text(c.response, "update"))[2] is not None
                    for c in updates)
    return (sum(backward.values()), len(backward)), (fell_back, len(updates))


def share(pair: tuple[int, int]) -> str:
    done, total = pair
    return f"{done}/{total} ({done / total:.0%})" if total else "0/0"


def report(name: str, result, wall: float, cpu: float) -> None:
    settings = SETTINGS[name]
    print(f"== {name}: --structured {settings['structured']}"
          f"{' --allow-copies' if settings['allow_copies'] else ''}"
          f"{' --concurrency 1' if settings.get('concurrency') == 1 else ''}, KV-state cache "
          f"{'on' if settings['kv_cache'] else 'off'}")
    stats = result.stats
    print(f"wall time {wall:.1f} s (CPU time {cpu:.1f} s), {result.status}: {stats.calls} calls, "
          f"{stats.completion_tokens} generated tokens")
    for label, purposes in (("forward (0.5B)", ("forward",)),
                            ("optimizer (1.5B)", ("backward", "update"))):
        print(f"{label}: {decoded_together(result, purposes)}")
    backward, updates = fallback_shares(result)
    print(f"replies read by a fallback rule: backward {share(backward)}, update "
          f"{share(updates)}")
    proposals = result.events.of(Proposal)
    copies = [p for p in proposals if p.reject_reason == COPY_REASON]
    copying_text = sum(1 for p in proposals if p.reject_reason != COPY_REASON
                       and _would_flag(p, result))
    print(f"proposals flagged as copying training examples: {len(copies)} of {len(proposals)}"
          + (f" (unflagged, {copying_text} would be)" if settings["allow_copies"] else ""))
    for step in result.events.of(StepFinished):
        print(f"step {step.step}: train {step.train_score:.3f}  val {step.val_score:.3f}"
              f"{'  accepted' if step.accepted else ''}")
    for p in proposals:
        verdict = "accepted" if p.accepted else f"rejected ({p.reject_reason or p.parse_error})"
        print(f"  step {p.step} {p.node_id}: {verdict}; val {p.val_before} -> {p.val_after}")
    if result.test_score is not None:
        print(f"test score: {result.test_score:.3f}")
    grads = [g for g in result.events.of(Gradient)
             if g.kind == "gradient" and g.from_node_id not in (None, "loss") and g.content]
    if grads:
        g = grads[0]
        print(f"one gradient ({g.from_node_id} -> {g.node_id}, parse: "
              f"{g.parse_error or 'clean'}):\n  {g.content[:400]!r}")
    if proposals:
        p = proposals[0]
        print(f"one update ({p.node_id}):\n  old {p.old_prompt!r}\n  new {p.new_prompt[:400]!r}")


def _would_flag(p, result) -> bool:
    """Whether copy detection would have flagged proposal `p`: the engine's rule, on the
    examples back-propagated in p's step (those the update call saw)."""
    from engine.core.copies import find_copies
    from engine.data.datasets import load_examples, with_target

    graph = load_graph(str(ROOT / "sample_graphs" / "demo.yaml"))
    by_id = {e.id: e for e in with_target(
        load_examples(graph.dataset, graph_dir=str(ROOT / "sample_graphs")), graph.target_field)}
    sampled = {g.example_id for g in result.events.of(Gradient)
               if g.step == p.step and g.from_node_id == "loss"}
    examples = [({f: by_id[e].fields[f] for f in graph.input_fields}, by_id[e].target)
                for e in sampled if e in by_id]
    return bool(find_copies({p.node_id: (p.new_prompt, p.old_prompt)}, examples))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=tuple(SETTINGS))
    parser.add_argument("--model", default=None,
                        help="a model's name or a GGUF file's path (default: the default)")
    parser.add_argument("--serving", choices=("auto", "server", "in-process"), default="auto",
                        help="--local-serving of every run")
    args = parser.parse_args()
    print(f"uptime: {os.popen('uptime').read().strip()}")
    walls, scores = {}, {}
    for name in ([args.only] if args.only else DEFAULT_RUNS):
        result, wall, cpu, peak = run_demo(name, args.steps, args.seed, args.model, args.serving)
        report(name, result, wall, cpu)
        print(f"peak RSS (this process and its children) {peak / 2**30:.2f} GiB")
        walls[name], scores[name] = wall, score_table(result)
    if set(DEFAULT_RUNS) <= set(walls):
        after, serial = walls["after"], walls["serial"]
        same = "the same" if scores["after"] == scores["serial"] else "DIFFERENT"
        print(f"demo wall: default settings {after:.1f} s, --concurrency 1 {serial:.1f} s "
              f"(ratio {after / serial:.2f}); scores {same}")


def score_table(result) -> list[tuple]:
    """Every step's train and validation score, and every proposal's gate scores."""
    return ([(s.step, s.train_score, s.val_score, s.accepted)
             for s in result.events.of(StepFinished)]
            + [(p.step, p.node_id, p.val_before, p.val_after, p.accepted)
               for p in result.events.of(Proposal)])


if __name__ == "__main__":
    main()
