"""How much a teaching graph's score depends on its prompts, on an embedded model (--model).

Scores a graph's forward pass (the engine's own forward calls, parser and grader; no
optimizer calls) on every example of its dataset with each of its prompt sets: the graph's
starting prompts, the hand fix, and (the method-case graphs) the generic rewrites, each with
its 95% Wilson interval.

- sample_graphs/demo.yaml (the default): the hand-fixed prompts of
  sample_graphs/data/demo_fixed_prompts.yaml (what a person writes in the What-if and Fork
  panels). Goal: starting prompts at most 0.35, fixed prompts at least 0.75, on at least 24
  examples, so that the demo has a fix to find. Prints first, exactly,

      starting prompts X, fixed prompts Y on N examples

- the method-case graphs (sample_graphs/case_rooms.yaml, case_orders.yaml; issue: the
  method's case): data/<graph>_prompts.yaml holds `fixed` (the hand fix of the node at
  fault) and `generic` (rewrites of the kind an edit made without gradients writes). Goal:
  the hand fix high and every generic rewrite low, their intervals apart, so that only an
  edit that writes what the successor needs and the sibling does not give repairs it.

`--backend scripted` scores the demo's prompts on sample_graphs/demo_responder.py, the
scripted model that plays the demo in the browser tests (starting prompts 0, fixed prompts
1: a check of that model, in seconds).

Local models are served as a run serves them (`--local-serving`, default auto: llama-server
when installed): the two sample differently (llama-server counts the prompt in its
repeat-penalty window), and only the run's serving tells what the demo will do.

    .venv/bin/python benchmarks/demo_prompts.py [--graph sample_graphs/case_rooms.yaml]
        [--examples N] [--backend local|scripted] [--local-serving auto|server|in-process]
"""

from __future__ import annotations

import argparse
import asyncio
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
from engine.data.stats import Z95, wilson  # noqa: E402

GRAPH = ROOT / "sample_graphs" / "demo.yaml"
FIXED = ROOT / "sample_graphs" / "data" / "demo_fixed_prompts.yaml"



def fixed_prompts() -> dict[str, str]:
    """The hand-fixed prompt of every LLM node of the demo graph."""
    return {str(k): str(v) for k, v in yaml.safe_load(FIXED.read_text()).items()}


def prompt_sets(graph_path: Path) -> list[tuple[str, dict[str, str]]]:
    """(label, prompts replacing the graph's) for each set to score, the starting prompts
    first: the demo's hand fix, or a method-case graph's `fixed` and `generic` sets from
    data/<graph>_prompts.yaml."""
    sets: list[tuple[str, dict[str, str]]] = [("starting prompts", {})]
    if graph_path.resolve() == GRAPH.resolve():
        return [*sets, ("fixed prompts", fixed_prompts())]
    spec = yaml.safe_load((graph_path.parent / "data" / f"{graph_path.stem}_prompts.yaml")
                          .read_text("utf-8"))
    sets.append(("fixed prompts", {str(k): str(v) for k, v in spec["fixed"].items()}))
    for i, generic in enumerate(spec.get("generic") or [], 1):
        sets.append((f"generic rewrite {i}", {str(k): str(v) for k, v in generic.items()}))
    return sets


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
                model: str | None = None, serving: str = "auto",
                graph_path: Path = GRAPH) -> tuple[float, int]:
    from engine.llm.client import LLMClient

    graph = load_graph(str(graph_path))
    examples = with_target(load_examples(graph.dataset, graph_dir=str(graph_path.parent)),
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
    parser.add_argument("--graph", type=Path, default=GRAPH,
                        help="the demo (default) or a method-case graph "
                             "(sample_graphs/case_rooms.yaml, case_orders.yaml)")
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
    if args.backend == "scripted" and args.graph.resolve() != GRAPH.resolve():
        parser.error("--backend scripted plays the demo graph only")
    started = time.perf_counter()
    scores = []
    for label, prompts in prompt_sets(args.graph):
        value, n = asyncio.run(score(prompts, args.examples, args.backend, args.model,
                                     args.local_serving, args.graph))
        scores.append((label, value, n))
    (_, start, n), (_, fixed, _) = scores[:2]
    print(f"starting prompts {start:.2f}, fixed prompts {fixed:.2f} on {n} examples")
    print(f"{args.graph.name}, {args.backend} backend, 95% Wilson intervals:")
    for label, value, n in scores:
        low, high = wilson(value * n, n, Z95)
        print(f"  {label:<20} {value:.2f} ({round(value * n)}/{n})  [{low:.2f}, {high:.2f}]")
    fixed_low = wilson(fixed * n, n, Z95)[0]
    generic = [(label, wilson(v * n, n, Z95)[1]) for label, v, _ in scores[2:]]
    if generic:
        apart = all(high < fixed_low for _, high in generic)
        print(f"hand fix apart from every generic rewrite: {'yes' if apart else 'NO'}")
    print(f"wall {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
