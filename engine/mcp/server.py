"""The Model Context Protocol server of `python -m engine mcp` (docs/mcp.md).

A tool is the engine's own command. Each runs `python -m engine COMMAND ... --json` as a
child process (commands.py) on the server's run log (`--db`, or the tool's `db` argument)
and returns the JSON that command prints, as it printed it: a tool answers what the command
answers, and a failing probe never takes the server down. The child's `error:` line (an
unknown run id, a step the run lacks) is the tool's error, one line, never a traceback; its
progress lines (`probes 12/36 done, about 2 s left`) become MCP progress notifications as
they arrive; a cancelled call stops the child.

What no command prints is read from the run log in a worker thread, through
engine.runlog.reader: `show_run` (the graph, each step's scores with n and 95% intervals),
`failing_examples` (each with its trace) and blame's estimate (`estimate_from_log`, which
spends nothing). `validate_prompts` is one `probe --edit` on the validation split compared
pair by pair, and calls a difference an improvement only when the paired 95% interval lies
wholly above zero.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.types import CallToolResult, TextContent

from engine.data.stats import Z95, score_interval
from engine.experiment.results import paired_difference
from engine.mcp.commands import CommandError, Progress, engine_argv, run_json

TOOL_NAMES = ("list_runs", "show_run", "failing_examples", "blame", "probe", "diff",
              "propose", "prompts", "validate_prompts")
ESTIMATE = re.compile(r"up to (\d+) probes, about (\d+) model calls")
DOCS = Path(__file__).resolve().parents[2] / "docs"
INSTRUCTIONS = (
    "Debug an LLM pipeline from its run log. list_runs, then show_run (graph, scores with "
    "intervals) and failing_examples (traces). Before blame, ask blame with estimate_only "
    "(it spends nothing) or give max_calls. validate_prompts tests one node's new prompt "
    "on the validation split and says improvement only when the paired interval clears "
    "zero. Resource semback://docs/reading-a-verdict explains blame's report.")


class Tools:
    """The tools, each on the server's run log unless given `db`."""

    def __init__(self, db: str) -> None:
        self.db = db

    async def list_runs(self, ctx: Context, db: str | None = None) -> CallToolResult:
        """Every run in the run log, newest first: run_id, graph, method, model, status,
        steps, best_val (`python -m engine runs --json`)."""
        return as_result(await self._command(ctx, db, "runs", "--json"))

    async def show_run(self, run_id: str, db: str | None = None) -> CallToolResult:
        """A run: its graph (nodes with kind, inputs, current and original prompt; edges
        from node to reader), its steps with each split's score, n and 95% interval
        (train at step S: the prompts in force when S began; val at S: the prompts kept
        after it), the edits each step accepted, and its split sizes."""
        return as_result(await read_log(run_view, self._db(db), run_id))

    async def failing_examples(self, run_id: str, step: int | None = None,
                               split: Literal["train", "val", "test"] = "train",
                               db: str | None = None) -> CallToolResult:
        """The examples of `split` that fail at `step` (default: the last), each with its
        target, prediction, score and trace: per node, in graph order, its input and output
        and the prompt version it ran."""
        return as_result(await read_log(failing_view, self._db(db), run_id, step, split))

    async def blame(self, ctx: Context, run_id: str, step: int | None = None,
                    examples: str = "failing", estimate_only: bool = False,
                    max_calls: int | None = None, db: str | None = None) -> CallToolResult:
        """Which node is at fault: follow every LLM node's gradient (and its edit) on the
        failing examples and name the node that fixes them, with 90% intervals (`python -m
        engine blame RUN [--step S] --examples E --json`; step: default every backward
        step, pooled; examples: failing|sampled|val|all|ID,ID). It makes model calls:
        estimate_only returns {estimate, probes, calls} from the run log, spending
        nothing; max_calls refuses, spending nothing, when the estimate's calls exceed it.
        Progress is reported as probes finish."""
        db = self._db(db)
        if estimate_only or max_calls is not None:
            estimate = await read_log(blame_estimate, db, run_id, step, examples)
            if estimate_only:
                return as_result(estimate)
            if estimate["calls"] > max_calls:
                raise ToolError(f"error: blame would make up to {estimate['calls']} model calls, "
                                f"over max_calls {max_calls}; nothing was spent. Estimate: "
                                f"{estimate['estimate']}")
        args = [run_id, *optional("--step", step), "--examples", examples, "--json"]
        return as_result(await self._command(ctx, db, "blame", *args))

    async def probe(self, ctx: Context, run_id: str, step: int, node: str,
                    kind: Literal["output", "gradient", "edit"], example: str | None = None,
                    text: str | None = None, examples: str = "failing",
                    db: str | None = None) -> CallToolResult:
        """Intervene on one node of a logged step and re-run what depends on it (`python -m
        engine probe --json`): kind output (text: the node's new output, on `example`),
        gradient (rewrite its output as its gradient says, on `example`) or edit (text: a
        new prompt, or none for the step's proposed one, on `examples`: failing|sampled|val|
        ID,ID). One row per example: before/after output and score, flipped, leaks."""
        with tempfile.TemporaryDirectory(prefix="semback-mcp-") as folder:
            args = [run_id, "--step", str(step), "--node", node,
                    *intervention(kind, text, Path(folder)), *optional("--example", example),
                    "--examples", examples, "--json"]
            return as_result(await self._command(ctx, db, "probe", *args))

    async def diff(self, ctx: Context, run_a: str, run_b: str | None = None,
                   step_a: int | None = None, step_b: int | None = None,
                   split: Literal["train", "val"] = "val", examples: str = "differing",
                   bound: int | None = None, db: str | None = None) -> CallToolResult:
        """Why two runs (or two steps of one run: run_b omitted, step_b = step_a - 1) score
        examples differently: patch node changes from A into B and find the smallest set
        that reproduces A's score (`python -m engine diff --json`)."""
        args = [run_a, *([run_b] if run_b else []), *optional("--step-a", step_a),
                *optional("--step-b", step_b), "--split", split, "--examples", examples,
                *optional("--bound", bound), "--json"]
        return as_result(await self._command(ctx, db, "diff", *args))

    async def propose(self, ctx: Context, run_id: str, db: str | None = None
                      ) -> CallToolResult:
        """Back-propagate the run's failing examples at its last step and propose prompts
        (`python -m engine backprop RUN --json`). Spends model calls on the run's backends
        and logs the result as a new step of the run."""
        return as_result(await self._command(ctx, db, "backprop", run_id, "--json"))

    async def prompts(self, ctx: Context, run_id: str, db: str | None = None
                      ) -> CallToolResult:
        """The prompts the run keeps, per node: prompt, original, changed, the step that
        kept it and its evidence (`python -m engine prompts RUN --format json`)."""
        return as_result(await self._command(ctx, db, "prompts", run_id, "--format", "json"))

    async def validate_prompts(self, ctx: Context, run_id: str, prompts: dict[str, str],
                               examples: str = "val", db: str | None = None
                               ) -> CallToolResult:
        """Score a prompt set (node -> prompt text) against the run's kept prompts on the
        same examples (default: its validation split), pair by pair: n, before and after
        (mean, 95% interval), the paired difference with its 95% interval, and improvement
        true only when that interval lies wholly above zero (else a note). ONE NODE AT A
        TIME: it runs `probe --edit` at the run's last step on the one node whose prompt
        differs from the run's; several differing nodes are refused. Where that step kept a
        new prompt for the node, the kept prompt is probed too, as the baseline."""
        db = self._db(db)
        kept = (await self._command(ctx, db, "prompts", run_id, "--format", "json"))["nodes"]
        step = await read_log(last_step, db, run_id)
        node, prompt = changed_node(kept, prompts, run_id)
        # the probes' baseline is the prompts the step began with: where the step kept a
        # new prompt for this node, the kept prompt is re-run alongside as the baseline
        moved = [n for n, info in kept.items() if step > 0 and info.get("step") == step]
        if set(moved) - {node}:
            raise ToolError(f"error: run '{run_id}' kept a new prompt for {', '.join(moved)} "
                            f"at its last step {step}, and a probe changes one node at a time: "
                            f"no probe compares {node} against the kept prompts")
        rows = await self._edit_probe(ctx, db, run_id, step, node, prompt, examples)
        baseline = f"the run's prompts as logged at step {step}"
        if node in moved:
            rows = rebased(rows, await self._edit_probe(ctx, db, run_id, step, node,
                                                        kept[node]["prompt"], examples))
            baseline = f"the run's kept prompts, re-run at step {step} (which kept {node}'s)"
        return as_result({"run_id": run_id, "step": step, "node": node, "examples": examples,
                          "baseline": baseline, **paired_comparison(rows)})

    async def _edit_probe(self, ctx: Context, db: str, run_id: str, step: int, node: str,
                          prompt: str, examples: str) -> list[dict]:
        with tempfile.TemporaryDirectory(prefix="semback-mcp-") as folder:
            path = Path(folder) / "prompt.txt"
            path.write_text(prompt, encoding="utf-8")
            return await self._command(ctx, db, "probe", run_id, "--step", str(step), "--node",
                                       node, "--edit", f"@{path}", "--examples", examples,
                                       "--json")

    def _db(self, db: str | None) -> str:
        return db or self.db

    async def _command(self, ctx: Context, db: str | None, command: str, *args: str) -> Any:
        argv = engine_argv(command, *args, "--db", self._db(db))
        try:
            return await run_json(argv, progress_to(ctx))
        except CommandError as exc:
            raise ToolError(str(exc)) from None


# --- what the tools hand back ----------------------------------------------------------


def as_result(value: Any) -> CallToolResult:
    """The JSON as the tool's one text block (what an agent reads), and as structured
    content (an object: a list goes under `result`)."""
    text = json.dumps(value, ensure_ascii=False, indent=1)
    structured = value if isinstance(value, dict) else {"result": value}
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=structured)


def progress_to(ctx: Context | None) -> Progress | None:
    if ctx is None:
        return None

    async def report(done: int, total: int, line: str) -> None:
        await ctx.report_progress(done, total, line)

    return report


def optional(flag: str, value: Any) -> list[str]:
    return [] if value is None else [flag, str(value)]


def intervention(kind: str, text: str | None, folder: Path) -> list[str]:
    """The probe command's intervention flags; a text goes through a file (`@FILE`), so a
    text that starts with @ is never read as a file name."""
    if kind == "gradient":
        return ["--gradient"]
    if kind == "edit" and text is None:
        return ["--edit", "proposed"]
    if text is None:
        raise ToolError("error: an output probe needs `text`: the node's new output")
    path = folder / f"{kind}.txt"
    path.write_text(text, encoding="utf-8")
    return [f"--{kind}", f"@{path}"]


async def read_log(read: Callable[..., Any], *args: Any) -> Any:
    """`read(*args)` in a worker thread; its refusal (no such log, run or step) is the
    tool's one-line error, as the command line prints it."""
    from engine.core.graph import GraphError
    from engine.runlog.lake import LakeError
    from engine.runlog.schema import RunLogError

    try:
        return await asyncio.to_thread(read, *args)
    except (RunLogError, LakeError, GraphError, ValueError, FileNotFoundError) as exc:
        raise ToolError("error: " + " ".join(str(exc).split())) from None


# --- reading the run log ---------------------------------------------------------------


def require_run(db: str, run_id: str) -> dict:
    """The run's row; RunLogError as every command says it when the log or run is missing."""
    from engine.runlog.reader import run_record
    from engine.runlog.schema import RunLogError, check_readable

    check_readable(db)
    record = run_record(db, run_id)
    if record is None:
        raise RunLogError(f"{db}: no run '{run_id}' (see: python -m engine runs --db {db})")
    return record


def run_view(db: str, run_id: str) -> dict:
    from engine.runlog import reader

    record = require_run(db, run_id)
    history = reader.prompt_history(db, run_id)
    steps = [step_view(db, run_id, row, history)
             for row in reader.step_table(db, run_id).itertuples(index=False)]
    return {**{k: plain(record.get(k)) for k in (
                "run_id", "graph_name", "method", "backend", "model", "optimizer_model",
                "status", "parent_run_id", "fork_step")},
            "splits": reader.split_sizes(db, run_id), "graph": graph_of(db, run_id, record),
            "steps": steps}


def graph_of(db: str, run_id: str, record: dict | None = None) -> dict:
    """The run's graph: nodes with their current (kept) and original prompts, and edges."""
    from engine.runlog.reader import kept_prompt_rows

    record = record or require_run(db, run_id)
    kept = {row["node_id"]: row for row in kept_prompt_rows(db, run_id)}
    doc = yaml.safe_load(record.get("graph_yaml") or "") or {}
    nodes = [n for n in doc.get("nodes") or [] if isinstance(n, dict)]
    ids = {str(n.get("id")) for n in nodes}
    return {"name": doc.get("name", record.get("graph_name")),
            "input_fields": doc.get("input_fields"), "target_field": doc.get("target_field"),
            "metric": doc.get("metric"),
            "nodes": [node_view(n, kept.get(str(n.get("id")))) for n in nodes],
            "edges": [{"from": str(i), "to": str(n.get("id"))} for n in nodes
                      for i in n.get("inputs") or [] if str(i) in ids]}


def node_view(node: dict, kept: dict | None) -> dict:
    view = {"id": str(node.get("id")), "kind": node.get("kind", "llm"),
            "inputs": [str(i) for i in node.get("inputs") or []],
            "prompt": kept["prompt"] if kept else node.get("prompt"),
            "original_prompt": node.get("prompt") or (kept or {}).get("original"),
            "prompt_kept_at_step": plain(kept["step"]) if kept else None,
            "trainable": node.get("trainable", True), "output": bool(node.get("output"))}
    if node.get("function"):
        view["function"] = node["function"]
    return view


def step_view(db: str, run_id: str, row: Any, history: Any) -> dict:
    from engine.runlog.reader import step_examples

    scores = split_scores(step_examples(db, run_id, int(row.step)))
    kept = history[(history["step"] == row.step) & history["accepted"].fillna(False).astype(bool)]
    return {"step": int(row.step), **scores, "accepted": bool(row.accepted),
            "proposed_edits": int(row.proposed),
            "accepted_edits": [] if row.step == 0 else
            [{"node": n, "prompt": p} for n, p in kept[["node_id", "prompt"]]
             .itertuples(index=False)]}


def split_scores(frame: Any) -> dict:
    """Per split: the mean score, n and its 95% interval (an example that errored counts
    as failing)."""
    out = {}
    for split, group in frame.groupby("split", sort=False):
        scores = group["score"].astype(float).fillna(0.0)
        out[str(split)] = scored(float(scores.mean()), len(scores))
    return {s: out[s] for s in ("train", "val", "test") if s in out} | out


def scored(mean: float, n: int) -> dict:
    interval = score_interval(mean, n)
    return {"score": round(mean, 4), "n": n,
            "interval": [round(v, 4) for v in interval] if interval else None}


def failing_view(db: str, run_id: str, step: int | None, split: str) -> dict:
    from engine.runlog.reader import step_examples

    record = require_run(db, run_id)
    step = check_step(db, run_id, step)
    frame = step_examples(db, run_id, step)
    frame = frame[frame["split"] == split]
    failing = frame[(frame["score"].astype(float).fillna(0.0) < 1.0) | frame["error"].notna()]
    order = [str(n.get("id")) for n in (yaml.safe_load(record.get("graph_yaml") or "") or {})
             .get("nodes") or [] if isinstance(n, dict)]
    traces = node_traces(db, run_id, step, split, set(failing["example_id"]), order)
    items = [{"example_id": r.example_id, "target": plain(r.target),
              "prediction": plain(r.prediction), "score": plain(r.score),
              "error": plain(r.error), "back_propagated": bool(r.gradients),
              "trace": traces.get(r.example_id, [])} for r in failing.itertuples(index=False)]
    return {"run_id": run_id, "step": step, "split": split, "examples": len(frame),
            "failing": len(items), "items": items}


def check_step(db: str, run_id: str, step: int | None) -> int:
    """`step`, or the run's last; ValueError when the run has no such complete step."""
    from engine.runlog.reader import step_table

    steps = [int(s) for s in step_table(db, run_id)["step"]]
    if not steps:
        raise ValueError(f"run '{run_id}' has no complete step")
    if step is None:
        return steps[-1]
    if step not in steps:
        raise ValueError(f"run '{run_id}' has no step {step} (steps {steps[0]}..{steps[-1]})")
    return step


def last_step(db: str, run_id: str) -> int:
    require_run(db, run_id)
    return check_step(db, run_id, None)


def node_traces(db: str, run_id: str, step: int, split: str, examples: set[str],
                order: list[str]) -> dict[str, list[dict]]:
    """example -> per node (in `order`): its input, output and error at the step."""
    from engine.runlog.reader import node_activations

    traces: dict[str, list[dict]] = {}
    for node in order:
        acts = node_activations(db, run_id, node)
        acts = acts[(acts["step"] == step) & (acts["split"] == split)
                    & acts["example_id"].isin(examples)]
        for r in acts.itertuples(index=False):
            traces.setdefault(r.example_id, []).append({
                "node": node, "prompt_version": plain(r.prompt_version),
                "input": plain(r.input_text), "output": plain(r.output_text),
                "error": plain(r.error) or plain(r.parse_error)})
    return traces


def plain(value: Any) -> Any:
    """A DataFrame cell as JSON: NaN and NA as None, numpy numbers as Python's."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if hasattr(value, "item"):
        return plain(value.item())
    return None if str(value) in ("<NA>", "NaT") else value


def blame_estimate(db: str, run_id: str, step: int | None, examples: str) -> dict:
    """What blame would spend at most, from the run log alone (no model call)."""
    from engine.probes.estimate import estimate_from_log
    from engine.runlog.probing import optimization_steps

    require_run(db, run_id)
    steps = [step] if step is not None else optimization_steps(db, run_id)
    if not steps:
        raise ValueError(f"run '{run_id}' has no backward step to blame")
    lines = [estimate_from_log(db, run_id, s, examples, len(steps) == 1) for s in steps]
    found = [ESTIMATE.search(line) for line in lines]
    if not all(found):
        raise ValueError(f"cannot read the estimate: {lines[0]}")
    text = lines[0] if len(lines) == 1 else \
        "\n".join(f"step {s}: {line}" for s, line in zip(steps, lines))
    return {"estimate": text, "probes": sum(int(m.group(1)) for m in found),
            "calls": sum(int(m.group(2)) for m in found)}


# --- validate_prompts: one node's edit, paired per example -------------------------------


def changed_node(kept: dict[str, dict], prompts: dict[str, str], run_id: str
                 ) -> tuple[str, str]:
    """The one node whose given prompt differs from the run's (a no-op set: its first
    node); ToolError for an unknown node or several changed nodes."""
    if not prompts:
        raise ToolError("error: give one node's prompt: {node: prompt text}")
    unknown = [n for n in prompts if n not in kept]
    if unknown:
        raise ToolError(f"error: run '{run_id}' has no prompted node {unknown[0]!r} "
                        f"(nodes: {', '.join(kept)})")
    changed = {n: p for n, p in prompts.items() if p != kept[n]["prompt"]}
    if len(changed) > 1:
        raise ToolError(f"error: only one node at a time: {', '.join(changed)} all differ from "
                        "the run's prompts, and a probe re-runs one changed node and what "
                        "depends on it; validate them one by one")
    return next(iter((changed or prompts).items()))


def rebased(rows: list[dict], baseline: list[dict]) -> list[dict]:
    """`rows` with each example's score before taken from `baseline` (the kept prompt's
    probe on the same example); an example whose baseline failed has none."""
    base = {r["example_id"]: r for r in baseline}
    return [{**r, "before_score": None if r["example_id"] not in base
             or base[r["example_id"]].get("error") else base[r["example_id"]]["after_score"]}
            for r in rows]


def paired_comparison(rows: list[dict]) -> dict:
    """n, before and after (mean, 95% interval), the paired difference after - before with
    its 95% interval, and improvement only when that interval lies above zero. A probe
    that failed counts as failing after; an example with no score before is left out."""
    pairs = [(float(r["before_score"]), 0.0 if r.get("error") else float(r["after_score"] or 0))
             for r in rows if r.get("before_score") is not None]
    n = len(pairs)
    if not n:
        raise ToolError("error: no example has a logged score to compare against")
    before, after = (sum(p[i] for p in pairs) / n for i in (0, 1))
    difference = (paired_binary(pairs) if all(v in (0.0, 1.0) for p in pairs for v in p)
                  else paired_graded(pairs))
    low = difference["interval"][0] if difference["interval"] else None
    out = {"n": n, "before": scored(before, n), "after": scored(after, n),
           "difference": difference, "errors": sum(1 for r in rows if r.get("error")),
           "left_out": len(rows) - n, "improvement": low is not None and low > 0}
    if not out["improvement"]:
        out["note"] = noise_note(difference, n)
    return out


def paired_binary(pairs: list[tuple[float, float]]) -> dict:
    counts = {"both": 0, "before_only": 0, "after_only": 0, "neither": 0}
    for b, a in pairs:
        counts["both" if a and b else "after_only" if a else "before_only" if b
               else "neither"] += 1
    value, low, high = paired_difference(counts["both"], counts["after_only"],
                                         counts["before_only"], counts["neither"])
    return {"value": round(value, 4), "interval": [round(low, 4), round(high, 4)],
            "counts": counts, "method": "paired 0/1 scores: Agresti-Min adjusted Wald, 95%"}


def paired_graded(pairs: list[tuple[float, float]]) -> dict:
    diffs = [a - b for b, a in pairs]
    n, mean = len(diffs), sum(diffs) / len(diffs)
    interval = None
    if n > 1:
        sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
        half = t95(n - 1) * sd / math.sqrt(n)
        interval = [round(mean - half, 4), round(mean + half, 4)]
    return {"value": round(mean, 4), "interval": interval,
            "method": "graded scores: mean paired difference, Student t, 95%"}


def t95(df: int) -> float:
    """The two-sided 95% quantile of Student's t: a table to 9 degrees of freedom, then the
    Cornish-Fisher expansion (within 0.001 from 10 on)."""
    table = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262)
    if df <= len(table):
        return table[df - 1]
    z = Z95
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def noise_note(difference: dict, n: int) -> str:
    interval = difference["interval"]
    if interval is None:
        return f"one example gives no interval: not distinguishable from noise at n = {n}"
    span = f"[{interval[0]:.2f}, {interval[1]:.2f}]"
    if interval[1] < 0:
        return f"worse: the paired difference's 95% interval {span} lies below zero"
    return (f"not an improvement: the difference is not distinguishable from noise at this n "
            f"({n} examples; its 95% interval {span} includes zero)")


# --- resources and the server ----------------------------------------------------------


def verdict_section(text: str) -> str:
    """How to read a blame verdict, from docs/probes.md: the section under a heading that
    names the verdict, else the one that holds "Then the verdict:" (blame's tables and
    verdict), to the next heading of its level or above."""
    lines, fenced, heads = text.splitlines(), False, []
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            heads.append((i, len(line) - len(line.lstrip("#"))))
    named = [h for h in heads if "verdict" in lines[h[0]].lower()]
    marker = next((i for i, ln in enumerate(lines)
                   if ln.strip().lower().startswith("then the verdict")), None)
    above = [h for h in heads if marker is not None and h[0] < marker]
    if not (named or above):
        raise ResourceError("docs/probes.md no longer explains how to read blame's verdict")
    start, level = named[0] if named else above[-1]
    end = next((i for i, lv in heads if i > start and lv <= level), len(lines))
    return "\n".join(lines[start:end]).strip() + "\n"


def refusal_as_result(tool: Callable[..., Any]) -> Callable[..., Any]:
    """The tool, its ToolError answered as an error result whose text is the one line
    alone (raised through the SDK, it would read "Error executing tool NAME: ...")."""
    @functools.wraps(tool)
    async def call(*args: Any, **kwargs: Any) -> CallToolResult:
        try:
            return await tool(*args, **kwargs)
        except ToolError as exc:
            return CallToolResult(content=[TextContent(type="text", text=str(exc))],
                                  is_error=True)

    return call


def build_server(db: str) -> MCPServer:
    """The server: the tools on run log `db` and the two resources."""
    server = MCPServer("semback", instructions=INSTRUCTIONS)
    tools = Tools(db)
    for name in TOOL_NAMES:
        tool = getattr(tools, name)
        server.add_tool(refusal_as_result(tool), name=name,
                        description=" ".join(tool.__doc__.split()))

    @server.resource("semback://runs/{run_id}/graph", mime_type="application/json",
                     description="a run's graph: nodes with their prompts and inputs, edges")
    async def run_graph(run_id: str) -> str:
        try:
            return json.dumps(await read_log(graph_of, db, run_id), ensure_ascii=False, indent=1)
        except ToolError as exc:
            raise ResourceError(str(exc)) from None

    @server.resource("semback://docs/reading-a-verdict", mime_type="text/markdown",
                     description="how to read blame's report and its verdict (docs/probes.md)")
    def reading_a_verdict() -> str:
        path = DOCS / "probes.md"
        if not path.is_file():
            raise ResourceError(f"{path}: not installed with this copy of the engine")
        return verdict_section(path.read_text(encoding="utf-8"))

    return server


def serve(db: str, port: int | None = None) -> None:
    """Serve on stdio, or with `port` on streamable HTTP at http://127.0.0.1:PORT/mcp."""
    server = build_server(db)
    if port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=port)
