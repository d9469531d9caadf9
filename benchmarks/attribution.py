"""Attribution benchmark: does `blame` name the node where a fault was planted?

Seven graphs, each with a planted fault whose culprit is known: chains of depth 2, 3 and 4
(the fault first, in the middle), a diamond, a fault with two successors, a fault fed
through a Python function, and two faults at once. The two-successor and function graphs
also have a harmless sibling of the fault, which reads only the person's name (the
example's `name` field), so it cannot carry the number on. A faulty node is told to copy
the first word of its input (a name; on `copy`: to say how the person feels), so the
numbers never reach the last node. Two tasks for that
last node (`--task`): `sum` ("Ann has 3 apples and gets 4 more." -> 7: add the numbers),
the default on the scripted model; `copy` ("Ann has 7 apples in the basket." -> 7: repeat
the number), the default on `--backend local`, whose 0.5B forward model cannot add. On
`copy` every gradient that fixes the fault carries the answer (a leak, never credit), so
the edit probes decide there and the method columns, which follow gradients only, name
no node by construction.

The model is `planted_fault_responder`, a scripted model that obeys prompts literally (so
the planted fault decides every answer) and back-propagates honestly: each backward call
tells an input to carry the numbers when its value has none (unless the input only says
who the sentence is about), and that it needs no change otherwise. Because its gradients ignore the context a method adds (siblings, the task),
every method gets the same gradients here: the method rows check the machinery, they do
not rank methods. Ranking methods needs a real model: `--backend local` runs the same
graphs on the default embedded pair (Qwen2.5-Coder-0.5B forward, 1.5B optimizer; about six
minutes a graph on two cores). Its figures are in benchmarks/results/2026-12-attribution.md
(docs/probes.md gives the latest).

Each graph: one optimization step with method semantic, then `blame` (pooled, every
failing example) with --method semantic,textgrad,semantic-nosibling. Scored per graph:
top-1 attribution of the probes, of the gradients' own claims, and of each method (right
when the named node is a culprit, or when blame ties on exactly the planted culprits, as
two_faults' two repairs each pass the number on; "no node" and any other tie are wrong),
with the calls and tokens blame spent.

    .venv/bin/python benchmarks/attribution.py [--backend scripted|local] [--task sum|copy]
        [--examples failing|val] [--val N] [--train N] [--proposals N] [--keep DIR [--reblame]]
        [--step-method METHOD] [--json] [GRAPH ...]

`--examples val` blames on the failing validation examples instead of the failing training
ones (`--val N` of them per graph, 6 by default): there every edit flip counts (the update
call never saw them), where on the 6 training examples the 2 back-propagated are in-sample
and often only 2 fail at all. `--train N` gives each graph N training examples instead of
6, so that the edit probes on the failing training examples have N - 2 out of sample.

(GRAPH names some of the graphs, e.g. `chain2 diamond` on the slower embedded model.)

`--step-method METHOD` runs each graph's step with another method (any of `run`'s, e.g.
`gtbp`, target propagation) instead of semantic backpropagation; blame's edit probes then
test that method's edits (its gradient probes use the three methods above either way).

`--keep DIR --reblame` blames again the runs a `--keep DIR` run left there, without running
their steps again: after a change to blame's rule, the same runs scored the new way.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine.core.graph import parse_graph  # noqa: E402
from engine.llm.base import LLMError, LLMRequest  # noqa: E402
from engine.llm.scripted import ScriptedBackend  # noqa: E402
from engine.methods import METHODS as STEP_METHODS  # noqa: E402
from engine.probes.blame import blame  # noqa: E402
from engine.probes.verdict import Verdict  # noqa: E402
from engine.runlog.schema import RunLogError  # noqa: E402
from engine.runlog.state import run_exists  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402

METHODS = ["semantic", "textgrad", "semantic-nosibling"]
FAULT = "<the task's planted fault>"  # in GRAPHS: the chosen task's fault (FAULTS)
# The planted fault, per task: a prompt whose output never carries the numbers. On `copy`,
# which runs on the 0.5B, "Copy the first word" is ignored in many runs (the 0.5B passes the
# whole sentence on, number and all, so no training example fails and nothing is learnt);
# asked for the person's mood, it dropped the number in 12 of 12 trial sentences.
FAULTS = {"sum": "Copy the first word of the text.",
          "copy": "How does the person feel? Answer in one short sentence about their mood."}
MOOD = "how does the person feel"  # the copy task's fault, as the scripted model reads it
WHO = "<the task's harmless step>"  # in GRAPHS: a sibling that never carries the numbers
# On `copy` the 0.5B answers "Say who the sentence is about." by repeating the sentence,
# number and all (12 of 12 trial sentences), which repairs the fault's sibling path and
# leaves nothing failing; asked for the name only, it gave the name (0 of 12 with a digit).
WHOS = {"sum": "Say who the sentence is about.",
        "copy": "What is the person's name? Reply with the name only."}
RELAY = "Repeat the text you are given."
# The task: (the last node's prompt, example i -> (text, answer)). `sum` asks the last node
# to add two numbers; `copy` to repeat the one number it is given, which the default
# embedded forward model (Qwen2.5-Coder-0.5B) does reliably and cannot do for sums (it
# added 4 + 11 as 16). On `copy` a fix of the fault carries the answer itself, so every
# gradient probe that fixes it leaks (never credit) and the edit probes decide. Its prompt
# is one the 0.5B follows on every graph's inputs: asked "Reply with the number of apples
# stated in your input.", it answered "2" for diamond's two copies of the sentence (2 of 8
# right) and 2 of 8 for through_function's name and digits; this one answered 8 of 8 on
# each graph's repaired inputs, and no input without the number gave the answer (a plain
# trial of forward calls in the engine's format, 2026-12-04).
COPY_TOTAL = "Copy the number written in your inputs. Reply with that number only, or 0 " \
    "if there is none."
TASKS: dict[str, tuple[str, Callable[[int], tuple[str, int]]]] = {
    "sum": ("Add up the numbers you are given, each distinct number once, and reply with "
            "the sum.", lambda i: (f"{NAMES[i % len(NAMES)]} has {i + 2} apples and gets "
                                   f"{3 * i + 5} more.", 4 * i + 7)),
    "copy": (COPY_TOTAL,
             lambda i: (f"{NAMES[i % len(NAMES)]} has {4 * i + 7} apples in the basket.",
                        4 * i + 7)),
}
TOTAL = "<the task's last step>"  # in GRAPHS: the chosen task's prompt
HARMLESS = {"who", "text_note"}  # say who the sentence is about: never asked for numbers
# The harmless siblings read the example's `name` field, never the sentence: a sibling that
# reads the number is a second place to repair the graph, not a harmless one. Reading the
# sentence, through_function's `text_note` was rewritten by the 1.5B to reply with the
# number (2026-12-04), which fixed every failing example alone: a true tie with `fault`,
# and no right answer for blame to find.
NAMES = ["Ann", "Bob", "Cleo", "Dev", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jo", "Kai", "Lu"]

# name -> (nodes as (id, prompt, inputs[, kind/function]), culprits)
GRAPHS: dict[str, tuple[list[tuple], set[str]]] = {
    "chain2": ([("fault", FAULT, ["text"]), ("total", TOTAL, ["fault"])], {"fault"}),
    "chain3": ([("fault", FAULT, ["text"]), ("relay", RELAY, ["fault"]),
                ("total", TOTAL, ["relay"])], {"fault"}),
    "chain4": ([("first", RELAY, ["text"]), ("fault", FAULT, ["first"]),
                ("relay", RELAY, ["fault"]), ("total", TOTAL, ["relay"])], {"fault"}),
    "diamond": ([("fault", FAULT, ["text"]), ("left", RELAY, ["fault"]),
                 ("right", RELAY, ["fault"]), ("total", TOTAL, ["left", "right"])], {"fault"}),
    "two_successors": ([("who", WHO, ["name"]),
                        ("fault", FAULT, ["text"]), ("add", RELAY, ["fault"]),
                        ("check", RELAY, ["fault"]), ("total", TOTAL, ["who", "add", "check"])],
                       {"fault"}),
    "through_function": ([("fault", FAULT, ["text"]),
                          ("digits", None, ["fault"], "function", "keep_digits"),
                          ("total", TOTAL, ["text_note", "digits"]),
                          ("text_note", WHO, ["name"])],
                         {"fault"}),
    "two_faults": ([("fault_a", FAULT, ["text"]), ("fault_b", FAULT, ["text"]),
                    ("total", TOTAL, ["fault_a", "fault_b"])], {"fault_a", "fault_b"}),
}


def keep_digits(text: str) -> str:
    """The Python tool of `through_function`: passes on the numbers of its input."""
    return " ".join(re.findall(r"\d+", text))


def _values(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(
        r'<input name="([^"]+)">\s*(.*?)\s*</input>', text, flags=re.S)}


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+", text)


def planted_fault_responder() -> Callable[[LLMRequest], str | None]:
    """The scripted model of this benchmark: forward calls obey their prompt (copy the
    first word, repeat, write the numbers, add distinct numbers); backward calls are
    honest; probe rewrites follow "numbers" in the feedback; updates replace a
    first-word prompt with one asking for the numbers."""

    def respond(request: LLMRequest) -> str | None:
        role = request.meta.get("role", "")
        if request.purpose == "forward":
            task, _, rest = request.user_text.partition("## Inputs")
            values = _values(rest or request.user_text)
            joined = " ".join(values.values())
            task = task.lower()
            if "first word" in task:
                words = re.findall(r"[A-Za-z]+", joined)
                out = words[0] if words else "nobody"
            elif MOOD in task:
                words = re.findall(r"[A-Za-z]+", joined)
                out = f"{words[0] if words else 'Nobody'} feels fine."
            elif "add up" in task:
                out = str(sum(int(n) for n in dict.fromkeys(_numbers(joined))))
            elif "copy the number written" in task:
                out = (_numbers(joined) or ["0"])[0]
            elif "numbers" in task:
                out = " and ".join(_numbers(joined))
            elif "who" in task or "person's name" in task:
                words = re.findall(r"[A-Za-z]+", joined)
                out = words[0] if words else "nobody"
            else:
                out = joined
            return f"<output>{out}</output>"
        if request.purpose == "backward":
            values = _values(request.user_text)
            blocks = []
            for name in request.meta.get("inputs", []):
                value = values.get(name, "")
                text = ("No change is needed: this input carries the numbers."
                        if _numbers(value) else
                        "No change is needed: the name does not affect the sum."
                        if name in HARMLESS else
                        "This input should give the numbers in the text, not a name.")
                blocks.append(f'<gradient input="{name}">{text}</gradient>')
            return "\n".join(blocks)
        if request.purpose == "probe" and role == "probe_rewrite":
            feedback = request.meta.get("feedback", "")
            quoted = re.search(r'expected output is: "([^"]*)"', feedback)
            if quoted:
                return f"<output>{quoted.group(1)}</output>"
            if "number" in feedback.lower() and "no change" not in feedback.lower():
                inputs = request.user_text.split("It produced this output:")[0]
                return f"<output>{' and '.join(_numbers(inputs))}</output>"
            return f"<output>{request.meta.get('output', '')}</output>"
        if request.purpose == "update":
            prompt = request.meta.get("prompt", "")
            new = "Write the numbers of the text." if "first word" in prompt.lower() or \
                MOOD in prompt.lower() else prompt
            return f"<prompt>{new}</prompt>"
        return None

    return respond


TRAIN = 6  # training examples per graph by default (2 of the failing ones are back-propagated)


def graph_yaml(name: str, nodes: list[tuple], data: Path, task: str = "sum",
               val: int = 6, train: int = TRAIN) -> str:
    fields = ["text"] + (["name"] if any("name" in n[2] for n in nodes) else [])
    lines = [f"name: {name}", f"dataset: {data}", f"input_fields: [{', '.join(fields)}]",
             "target_field: answer", "metric: numeric",
             f"splits: {{train: {train}, val: {val}, test: 0}}", "nodes:"]
    order = {n[0]: i for i, n in enumerate(nodes)}
    for node in sorted(nodes, key=lambda n: _depth(n, nodes, order)):
        node_id, prompt, inputs = node[0], node[1], node[2]
        prompt = {TOTAL: TASKS[task][0], FAULT: FAULTS[task], WHO: WHOS[task]}.get(prompt,
                                                                                 prompt)
        lines.append(f"  - id: {node_id}")
        if len(node) > 3:
            lines += [f"    kind: {node[3]}", f"    function: {node[4]}"]
        else:
            lines.append(f"    prompt: {prompt}")
        lines.append(f"    inputs: [{', '.join(inputs)}]")
        if node_id == "total":
            lines.append("    output: true")
    return "\n".join(lines) + "\n"


def _depth(node: tuple, nodes: list[tuple], order: dict[str, int]) -> tuple[int, int]:
    by_id = {n[0]: n for n in nodes}
    depth = 0
    for name in node[2]:
        if name in by_id:
            depth = max(depth, _depth(by_id[name], nodes, order)[0] + 1)
    return depth, order[node[0]]


def dataset(path: Path, task: str = "sum", n: int = 12) -> None:
    """`n` sentences, names cycling, every answer distinct; each with its person's name
    apart (`name`), which the harmless siblings read."""
    rows = [{"id": f"p{i:02d}", "text": text, "name": NAMES[i % len(NAMES)],
             "answer": str(answer)}
            for i, (text, answer) in ((i, TASKS[task][1](i)) for i in range(n))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def is_right(found: Verdict, culprits: set[str]) -> bool:
    """A verdict is right when it names a culprit, or ties on exactly the planted culprits
    (a tie that leaves one out, or takes in a harmless node, is wrong)."""
    return found.node in culprits or bool(found.tied) and set(found.tied) == culprits


async def one(name: str, nodes: list[tuple], culprits: set[str], work: Path,
              backend: str, task: str = "sum", examples: str = "failing",
              val: int = 6, reblame: bool = False, train: int = TRAIN,
              proposals: int = 1, step_method: str = "semantic") -> dict:
    data = work / f"planted-{task}-{train + val}-named.jsonl"
    graph = work / f"{name}.yaml"
    db = str(work / f"{name}.duckdb")
    if not reblame:
        if not data.exists():
            dataset(data, task, train + val)
        graph.write_text(graph_yaml(name, nodes, data, task, val, train), encoding="utf-8")

    def model():
        return ScriptedBackend(responder=planted_fault_responder()) if backend == "scripted" \
            else None

    config = RunConfig(graph=str(graph), db=db, steps=1, run_id=name, backend=backend,
                       failures_per_step=2, train=train, val=val, test=0,
                       proposals=proposals, method=step_method)
    # the Python tool comes from an importable module, so that blame can import it again
    tools = {"keep_digits": importlib.import_module("attribution").keep_digits}
    if not reblame:
        spec = parse_graph(graph.read_text(encoding="utf-8"), str(graph), tools)
        await execute(config, forward_backend=model(), graph=spec)
    started = time.perf_counter()
    report = await blame(db, name, None, examples, methods=METHODS,
                         forward_backend=model())
    verdicts = {"probes": report.verdict, **report.method_verdicts}
    named = {k: v.named if v.node or v.tied else None for k, v in verdicts.items()}
    named = {"probes": named["probes"], "claims": report.claimed, **named}
    right = {"claims": report.claimed in culprits,
             **{k: is_right(v, culprits) for k, v in verdicts.items()}}
    return {"graph": name, "task": task, "culprits": sorted(culprits),
            "probed": examples, "examples": len(report.examples),
            "named": named, "right": right,
            "evidence": report.evidence,
            "calls": report.calls, "model_calls": report.model_calls, "tokens": report.tokens,
            "seconds": round(time.perf_counter() - started, 2),
            "reason": report.verdict.reason, "evidence_note": report.evidence_note}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="scripted", choices=("scripted", "local"))
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--task", choices=tuple(TASKS),
                        help="the last node's task: sum (the default on the scripted model) "
                             "or copy (the default on --backend local, whose 0.5B forward "
                             "model cannot add)")
    parser.add_argument("--keep", metavar="DIR",
                        help="write the graphs and run logs to DIR and keep them (default: a "
                             "temporary folder)")
    parser.add_argument("--reblame", action="store_true",
                        help="with --keep DIR: blame again the runs an earlier --keep left in "
                             "DIR, without running their steps again (the probes' calls come "
                             "from each run log's reply cache where they are the same)")
    parser.add_argument("--examples", choices=("failing", "val"), default="failing",
                        help="what blame probes: the step's failing training examples (the "
                             "default; the update call saw 2 of them, so their edit flips "
                             "are in-sample) or the failing validation examples (out of "
                             "sample, one backward pass each: slower)")
    parser.add_argument("--val", type=int, default=6,
                        help="validation examples per graph (default 6)")
    parser.add_argument("--train", type=int, default=TRAIN,
                        help=f"training examples per graph (default {TRAIN}); with more, "
                             "blame's edit probes have more failing examples the update "
                             "call never saw (it sees 2)")
    parser.add_argument("--proposals", type=int, default=1,
                        help="candidate prompt sets of each graph's step (run's --proposals; "
                             "default 1): blame probes the kept edit, else the best-scored")
    parser.add_argument("--step-method", default="semantic", choices=sorted(STEP_METHODS),
                        help="the method of each graph's optimization step, whose edits "
                             "blame's edit probes test (default semantic); blame's gradient "
                             "probes use semantic, textgrad and semantic-nosibling either way")
    parser.add_argument("graphs", nargs="*", metavar="GRAPH",
                        help=f"graphs to run (default: all of {', '.join(GRAPHS)})")
    args = parser.parse_args()
    task = args.task or ("copy" if args.backend == "local" else "sum")
    unknown = sorted(set(args.graphs) - set(GRAPHS))
    if unknown:
        parser.error(f"unknown graph {', '.join(unknown)} (choose from {', '.join(GRAPHS)})")
    if args.val < 1:
        parser.error("--val must be at least 1")
    if args.proposals < 1:
        parser.error("--proposals must be at least 1")
    if args.train < 2:
        parser.error("--train must be at least 2")
    if args.reblame:
        if not args.keep:
            parser.error("--reblame needs --keep DIR, the folder of the runs to blame again")
        missing = [name for name in (args.graphs or GRAPHS)
                   if not (Path(args.keep) / f"{name}.duckdb").exists()
                   or not run_exists(str(Path(args.keep) / f"{name}.duckdb"), name)]
        if missing:
            parser.error(f"no run to blame again in {args.keep} for {', '.join(missing)} "
                         "(run without --reblame first)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        rows, failed = [], None
        for name, (nodes, culprits) in GRAPHS.items():
            if name not in (args.graphs or GRAPHS):
                continue
            started = time.perf_counter()
            try:
                rows.append(asyncio.run(one(name, nodes, culprits, work, args.backend, task,
                                            args.examples, args.val, args.reblame,
                                            args.train, args.proposals,
                                            args.step_method)))
            except (LLMError, RunLogError) as exc:  # the model server died, no model file
                failed = f"error: {name}: {exc}"
                break
            print(f"{name}: {rows[-1]['named']['probes'] or 'no node'} "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    if failed:
        kept = f"; the run logs are kept in {args.keep}" if args.keep else ""
        print(f"{failed} (stopped there: the graphs before it are scored below{kept})",
              file=sys.stderr)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 2 if failed else 0
    if rows:
        report(rows, args, task)
    return 2 if failed else 0


def report(rows: list[dict], args: argparse.Namespace, task: str) -> None:
    """The table: each graph's named node per scorer, top-1 accuracy, and why a miss."""
    scorers = ["probes", "claims", *METHODS]
    print(f"attribution benchmark, backend {args.backend}, task {task} ({TASKS[task][0]!r}; "
          f"planted fault {FAULTS[task]!r}), "
          f"blame on the {'failing training' if args.examples == 'failing' else 'failing validation'}"
          f" examples ({args.train} training, {args.val} validation"
          + (f", {args.proposals} candidates a step" if args.proposals > 1 else "")
          + (f", step method {args.step_method}" if args.step_method != "semantic" else "")
          + "): top-1 (named node / "
          "right?)")
    header = f"{'graph':<17}{'n':>3}  " + "".join(f"{s:<22}" for s in scorers) + \
        f"{'calls':>7}{'model':>7}{'tokens':>8}"
    print(header)
    for r in rows:
        cells = "".join(f"{(r['named'][s] or 'no node') + (' ok' if r['right'][s] else ' x'):<22}"
                        for s in scorers)
        print(f"{r['graph']:<17}{r['examples']:>3}  {cells}{r['calls']:>7}"
              f"{r['model_calls']:>7}{r['tokens']:>8}")
    accuracy = "".join(f"{sum(r['right'][s] for r in rows)}/{len(rows):<20}" for s in scorers)
    print(f"{'top-1 accuracy':<22}{accuracy}")
    calls = sum(r["calls"] for r in rows) / len(rows)
    tokens = sum(r["tokens"] for r in rows) / len(rows)
    print(f"per attribution (one blame with 3 methods): {calls:.0f} calls, {tokens:.0f} tokens "
          "(calls include cache hits; tokens are of calls the model answered)")
    for r in rows:
        if r["evidence"] == "edit" and r["named"]["probes"]:
            print(f"  {r['graph']}: named by the edit probes: {r['evidence_note']}")
        if not r["right"]["probes"]:
            print(f"  {r['graph']}: {r['reason']}")


if __name__ == "__main__":
    sys.exit(main())
