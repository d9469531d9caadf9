"""Scale: `validate` and one scripted optimization step on generated DAGs of 50, 200 and
1,000 nodes.

Each generated graph is a chain of LLM nodes with skip connections (node i reads the
question, node i-1 and node i-3), so every node reaches the output, fan-in and fan-out are
two, and the critical path is as long as the graph. Prints, per size, the wall time of
`python -m engine validate` (in process) and of a scripted run's step 1 on 4 training and
4 validation examples (from the run log's `steps` table), and time per (node x example).
Goals: 200 nodes validate in under 1 s and their scripted step runs in under 10 s; time
grows roughly linearly in nodes x examples.

    .venv/bin/python benchmarks/large_graph.py [--sizes 50 200 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.cli import main as cli_main  # noqa: E402
from engine.runlog.schema import connect  # noqa: E402
from engine.runs.execute import RunConfig, execute  # noqa: E402

TRAIN = VAL = 4


def graph_yaml(n: int) -> str:
    lines = ["name: chain-" + str(n), "dataset: data.jsonl", "input_fields: [question]",
             "target_field: answer", "metric: numeric", "nodes:"]
    for i in range(n):
        inputs = ["question"] + [f"n{j}" for j in (i - 1, i - 3) if j >= 0]
        lines.append(f"  - id: n{i}")
        lines.append(f"    prompt: Step {i}. Improve the partial solution.")
        lines.append(f"    inputs: [{', '.join(inputs)}]")
        if i == n - 1:
            lines.append("    output: true")
    return "\n".join(lines) + "\n"


def measure(n: int, folder: Path) -> tuple[float, float, float]:
    graph = folder / f"chain{n}.yaml"
    graph.write_text(graph_yaml(n))
    with open(folder / "data.jsonl", "w") as fh:
        for i in range(20):
            fh.write(json.dumps({"id": f"q{i}", "question": f"What is {i} + {i}?",
                                 "answer": str(2 * i)}) + "\n")
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["validate", str(graph)])
    validate_s = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"validate failed on {n} nodes")
    db = folder / f"runs{n}.duckdb"
    config = RunConfig(graph=str(graph), backend="scripted", steps=1, train=TRAIN, val=VAL,
                       test=0, db=str(db), cache="off")
    started = time.perf_counter()
    result = asyncio.run(execute(config))
    run_s = time.perf_counter() - started
    with connect(db, read_only=True) as con:
        step_s = con.execute("SELECT ended_at - started_at FROM steps WHERE run_id = ? AND "
                             "step = 1", [result.run_id]).fetchall()[0][0]
    return validate_s, step_s, run_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 200, 1000])
    args = parser.parse_args()
    print(f"scripted backend, {TRAIN} train + {VAL} validation examples, cache off")
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            validate_s, step_s, run_s = measure(n, Path(tmp))
            per = step_s / (n * (TRAIN + VAL)) * 1000
            print(f"{n:>5} nodes: validate {validate_s:.3f} s, scripted step 1 {step_s:.2f} s "
                  f"({per:.2f} ms per node x example), whole run {run_s:.2f} s")


if __name__ == "__main__":
    main()
