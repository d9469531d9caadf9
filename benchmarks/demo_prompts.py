"""How much the demo's score depends on its prompts, on an embedded model (--model).

Scores sample_graphs/demo.yaml's forward pass (the engine's own forward calls, parser and
grader; no optimizer calls) on every example of its dataset, twice: with the graph's
starting prompts, and with the hand-fixed prompts in sample_graphs/data/demo_fixed_prompts.yaml
(what a person writes in the What-if and Fork panels). Goal: starting prompts at most
0.35, fixed prompts at least 0.75, on at least 24 examples, so that the demo has a fix to
find. Prints exactly

    starting prompts X, fixed prompts Y on N examples

then each score's 95% Wilson interval and the wall time. `--backend scripted` scores the
same prompts on sample_graphs/demo_responder.py, the scripted model that plays the demo in
the browser tests (starting prompts 0, fixed prompts 1: a check of that model, in seconds).

Local models are served as a run serves them (`--local-serving`, default auto: llama-server
when installed): the two sample differently (llama-server counts the prompt in its
repeat-penalty window), and only the run's serving tells what the demo will do.

    .venv/bin/python benchmarks/demo_prompts.py [--examples N] [--backend local|scripted]
        [--local-serving auto|server|in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.core.forward import Prompts, RunContext  # noqa: E402
from engine.core.graph import load_graph  # noqa: E402
from engine.core.optimizer import evaluate  # noqa: E402
from engine.data.datasets import load_examples, with_target  # noqa: E402

GRAPH = ROOT / "sample_graphs" / "demo.yaml"
FIXED = ROOT / "sample_graphs" / "data" / "demo_fixed_prompts.yaml"


def fixed_prompts() -> dict[str, str]:
    """The hand-fixed prompt of every LLM node of the demo graph."""
    return {str(k): str(v) for k, v in yaml.safe_load(FIXED.read_text()).items()}


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def make_backend(kind: str, model: str | None = None, serving: str = "auto"):
    if kind == "scripted":
        from engine.llm.scripted import ScriptedBackend
        from sample_graphs.demo_responder import demo_responder

        return ScriptedBackend(responder=demo_responder())
    from engine.llm.factory import make_backend as engine_backend

    # the serving a run uses (llama-server when installed): the two sample differently, so
    # a score measured in-process says little about the demo run
    return engine_backend("local", model=model, serving=serving)


async def score(prompts: dict[str, str], limit: int | None, backend_kind: str = "local",
                model: str | None = None, serving: str = "auto") -> tuple[float, int]:
    from engine.llm.client import LLMClient

    graph = load_graph(str(GRAPH))
    examples = with_target(load_examples(graph.dataset, graph_dir=str(GRAPH.parent)),
                           graph.target_field)[:limit]
    backend = make_backend(backend_kind, model, serving)
    client = LLMClient(forward_backend=backend,
                       forward_model=getattr(backend, "model_name", backend_kind))
    ctx = RunContext(graph, client, lambda event: None, "demo-prompts", 0, max_tokens=128)
    initial = Prompts.initial(graph)
    try:
        value, _, _ = await evaluate(ctx, Prompts({**initial.text, **prompts},
                                                  initial.version), examples, "val")
    finally:
        await client.aclose()
    return float(value or 0.0), len(examples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=None,
                        help="score only the first N examples (default: all)")
    parser.add_argument("--backend", choices=("local", "scripted"), default="local",
                        help="the embedded model (default), or the demo's scripted model")
    parser.add_argument("--model", default=None,
                        help="with --backend local: smollm2-135m, qwen2.5-coder-0.5b (the "
                             "default), qwen2.5-coder-1.5b or a GGUF file's path")
    parser.add_argument("--local-serving", choices=("auto", "server", "in-process"),
                        default="auto", help="with --backend local: as `run`'s flag (default "
                                             "auto: llama-server when installed, as a run)")
    args = parser.parse_args()
    started = time.perf_counter()
    start, n = asyncio.run(score({}, args.examples, args.backend, args.model,
                                   args.local_serving))
    fixed, _ = asyncio.run(score(fixed_prompts(), args.examples, args.backend, args.model,
                                   args.local_serving))
    print(f"starting prompts {start:.2f}, fixed prompts {fixed:.2f} on {n} examples")
    (a, b), (c, d) = wilson(start * n, n), wilson(fixed * n, n)
    print(f"95% intervals: starting [{a:.2f}, {b:.2f}], fixed [{c:.2f}, {d:.2f}]; "
          f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
