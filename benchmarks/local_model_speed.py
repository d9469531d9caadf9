"""Speed of an embedded model, served by llama-server and in-process.

    python benchmarks/local_model_speed.py --model NAME|PATH [--serving both|server|in-process]
                                           [--max-tokens 128] [--concurrent 4] [--repeat 1]

For the model (a registry name where engine/llm/models.py knows it, `smollm2-135m`, or a
GGUF file's path) and each serving mode it prints:

- load: seconds until the first one-token reply;
- alone: prompt tokens/s (a one-token request on a fresh prompt) and generation tokens/s
  (the rest of a `--max-tokens` request's time) of one request;
- N concurrent: the same for `--concurrent` requests sent at once, aggregate over them;
  with `--repeat R`, alone and concurrent are measured R times in turn, the medians are
  printed, and the concurrent/alone ratio of each repeat (its spread is the figure's
  uncertainty: on a shared two-core machine one pair swings by 10-20%);
- prefix reuse: of a second request sharing a long system prompt with a first, the prompt
  tokens the server served from its prefix cache (in-process: not reported, shown as n/a);
- peak RSS of this process and its children (the server) while that mode ran.

Each request starts with a different line, so no prompt is served from a cache except in
the prefix test. Goal (the default model): N=4 concurrent requests reach at least 2x the
aggregate generation tokens/s of one alone, served by llama-server. Prints `uptime` first:
on a shared machine the load says how far to trust the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.peak_rss import PeakRSS  # noqa: E402
from engine.llm.base import LLMError, LLMRequest  # noqa: E402
from engine.llm.local import LocalBackend, local_model_path  # noqa: E402
from engine.llm.server import served  # noqa: E402

TOPICS = ["a lighthouse keeper", "a desert caravan", "a clockmaker's shop", "a night train",
          "an orchard in autumn", "a deep-sea probe", "a mountain village", "a city library"]
SYSTEM = ("You are a careful writing assistant. You write vivid, concrete prose, with no "
          "lists and no headings, and you never stop before the length you are asked for. ")


def model_path(spec: str) -> Path:
    """The GGUF file `spec` names: a path, `smollm2-135m`, or a name the model registry
    (engine/llm/models.py, where present) resolves."""
    if Path(spec).expanduser().is_file():
        return Path(spec).expanduser()
    try:
        from engine.llm.models import resolve_model  # the registry, where present
    except ImportError:
        if spec in ("smollm2-135m", "smollm2-135m-instruct") and local_model_path():
            return local_model_path()
        raise SystemExit(f"error: unknown model {spec!r}: give a GGUF file's path") from None
    try:
        return resolve_model(spec).path
    except LLMError as exc:
        raise SystemExit(f"error: {exc}") from None


def story(i: int, words: int = 300) -> LLMRequest:
    return LLMRequest(messages=(("user", f"Request {i} ({time.time_ns()}). Write a "
                                         f"{words}-word story about {TOPICS[i % len(TOPICS)]}."),),
                      model="bench", purpose="forward")


async def timed(backend, requests: list[LLMRequest]) -> tuple[float, list]:
    started = time.perf_counter()
    replies = await asyncio.gather(*(backend.complete(r) for r in requests))
    return time.perf_counter() - started, replies


async def throughput(backend, n: int, max_tokens: int, first: int) -> tuple[float, float, int]:
    """(prompt tok/s, generation tok/s, generated tokens) of `n` requests sent together."""
    import dataclasses

    one = [dataclasses.replace(story(first + i), max_tokens=1) for i in range(n)]
    prompt_wall, replies = await timed(backend, one)
    prompt_tokens = sum(r.prompt_tokens for r in replies)
    full = [dataclasses.replace(story(first + n + i), max_tokens=max_tokens) for i in range(n)]
    wall, replies = await timed(backend, full)
    generated = sum(r.completion_tokens for r in replies)
    # the generating part of the wall: what the same prompts take without it is prompt_wall
    generating = wall - prompt_wall
    return (prompt_tokens / prompt_wall, generated / generating if generating > 0 else float("nan"),
            generated)


async def prefix_reuse(backend) -> tuple[int, int]:
    """(prompt tokens of the second request, of them served from the prefix cache)."""
    system = SYSTEM * 6
    replies = []
    for i in range(2):
        replies.append(await backend.complete(LLMRequest(
            messages=(("system", system), ("user", f"Name {i + 2} colours.")), model="bench",
            purpose="forward", max_tokens=8)))
    return replies[1].prompt_tokens, replies[1].cached_tokens


async def measure(path: Path, serving: str, concurrent: int, max_tokens: int,
                  repeat: int = 1) -> None:
    local = LocalBackend(model_path=path)
    backend = served(local, serving, slots=concurrent, timeout=600)  # a loaded machine is slow
    if serving == "server" and backend is local:
        print(f"== {serving}: llama-server is not installed; skipped")
        return
    with PeakRSS() as rss:
        try:
            started = time.perf_counter()
            await backend.complete(LLMRequest(messages=(("user", "Hi"),), model="bench",
                                              purpose="forward", max_tokens=1))
            load = time.perf_counter() - started
            rounds = []  # (alone, concurrent) per repeat, each a (prompt, generation, made)
            for r in range(repeat):
                alone = await throughput(backend, 1, max_tokens, 1000 * r)
                rounds.append((alone, await throughput(backend, concurrent, max_tokens,
                                                       1000 * r + 100)))
            prompt, cached = await prefix_reuse(backend)
        finally:
            await backend.aclose()
    where = (f"llama-server, {backend.slots} slots" if serving == "server"
             else f"in-process, {local.contexts} contexts x {local.n_threads} threads")
    print(f"== {serving} ({where})")
    p1, g1, _ = (statistics.median(a[i] for a, _ in rounds) for i in range(3))
    pn, gn, made = (statistics.median(c[i] for _, c in rounds) for i in range(3))
    ratios = [c[1] / a[1] for a, c in rounds]
    print(f"load + first token: {load:.2f} s")
    print(f"alone:        prompt {p1:6.1f} tok/s, generation {g1:5.1f} tok/s")
    print(f"{concurrent} concurrent: prompt {pn:6.1f} tok/s, generation {gn:5.1f} tok/s "
          f"aggregate ({gn / g1:.2f}x alone; {made:.0f} tokens generated)")
    if repeat > 1:  # one pair of runs swings by 10-20% on a shared two-core machine
        print(f"  medians of {repeat} repeats (alone, then {concurrent} concurrent, each "
              f"time); generation alone and concurrent, and their ratio, in each repeat: "
              f"{', '.join(f'{a[1]:.1f}/{c[1]:.1f} {x:.2f}' for (a, c), x in zip(rounds, ratios))} "
              f"(median {statistics.median(ratios):.2f}x)")
    reuse = f"{cached} of {prompt}" if serving == "server" else f"n/a (of {prompt})"
    print(f"prefix reuse: prompt tokens served from the cache {reuse}")
    print(rss.describe())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m",
                        help="a model's name or a GGUF file's path")
    parser.add_argument("--serving", choices=("both", "server", "in-process"), default="both")
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=1,
                        help="measure alone and concurrent this many times, in turn, and "
                             "print the medians and each repeat's ratio (default: 1)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error("--repeat must be 1 or more")
    path = model_path(args.model)
    print(f"model: {path} ({path.stat().st_size:,} bytes); cores: "
          f"{len(os.sched_getaffinity(0))}; uptime: {os.popen('uptime').read().strip()}")
    for serving in (("server", "in-process") if args.serving == "both" else (args.serving,)):
        try:
            asyncio.run(measure(path, serving, args.concurrent, args.max_tokens,
                                args.repeat))
        except LLMError as exc:
            print(f"== {serving}: the model cannot run: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
