"""The gateway's added latency per call (engine/gateway/server.py), against calling the
upstream directly, and its calls per second, with none lost (docs/pipelines.md).

    python benchmarks/gateway.py [--calls 2000] [--concurrency 1 200] [--latency 0.02]

Each side runs in its own process, as in use: the upstream, the gateway (`python -m engine
gateway --port 0`, an empty run log each setting) and the client (aiohttp). The upstream is
an aiohttp server on 127.0.0.1 whose reply is tests/support/fake_openai.py's
`prompt_responder` (it depends on the whole request, as a model's does), after a fixed
`--latency` of work a call, so that 200 calls at once are not queued by the upstream. Each call is a GSM8K question (../shared/datasets/gsm8k) under
a system prompt, each one different, so every call through the gateway is a cache miss
that goes upstream and is recorded as a span in an empty run log (one per setting).

For each concurrency, the same questions are sent twice with httpx's async client: straight
to the upstream, then through the gateway (its session path, as the runner uses it). It
prints the median and p99 of each side's per-call latency and the gateway's added latency
(the difference of the two sides' medians and of their p99s), the calls per second
through the gateway, and the count of spans recorded against calls answered. The status
is 1 when a call failed or a span is missing or doubled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GSM8K = REPO.parent / "shared" / "datasets" / "gsm8k"

SYSTEM = "Solve the math word problem. Give the final number between <output> tags."


def questions(count: int) -> list[str]:
    rows = (GSM8K / "test.jsonl").read_text(encoding="utf-8").splitlines()
    out = [json.loads(line)["question"] for line in rows]
    # more calls than questions: the same question again, numbered, so no two are equal
    return [q if i < len(out) else f"({i // len(out)}) {q}"
            for i, q in ((i, out[i % len(out)]) for i in range(count))]


async def send(url: str, texts: list[str], concurrency: int) -> tuple[list[float], float,
                                                                      int]:
    """Each text as one chat call; (per-call latencies in ms, wall seconds, failures)."""
    import aiohttp

    limit = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    failures = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=120)) as http:

        async def one(text: str) -> None:
            nonlocal failures
            async with limit:
                started = time.perf_counter()
                async with http.post(f"{url}/chat/completions", json={
                        "model": "fake", "temperature": 0, "messages": [
                            {"role": "system", "content": SYSTEM},
                            {"role": "user", "content": text}]}) as reply:
                    body = await reply.json()
                latencies.append((time.perf_counter() - started) * 1000)
                if reply.status != 200 or not body.get("choices"):
                    failures += 1

        started = time.perf_counter()
        await asyncio.gather(*(one(t) for t in texts))
        return latencies, time.perf_counter() - started, failures


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


UPSTREAM = """
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
from aiohttp import web
from tests.support.fake_openai import prompt_responder
LATENCY = float(sys.argv[2])


async def chat(request):
    body = await request.json()
    text = prompt_responder(body)
    await asyncio.sleep(LATENCY)
    return web.json_response({"id": "chatcmpl-bench", "object": "chat.completion",
                              "created": int(time.time()), "model": body.get("model"),
                              "choices": [{"index": 0, "finish_reason": "stop", "message":
                                           {"role": "assistant", "content": text}}],
                              "usage": {"prompt_tokens": 50, "completion_tokens": 20,
                                        "total_tokens": 70}})


async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

asyncio.run(main())
"""

def start(command: list[str], marker: str) -> tuple[subprocess.Popen, str]:
    """A child process and the first word of its first line starting with `marker`."""
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True, cwd=REPO)
    for line in child.stdout:
        if line.startswith(marker):
            return child, line.split()[0 if marker == "http" else 2]
    raise RuntimeError(f"{command[:4]} did not start")


def main() -> int:
    from engine.runlog.collected import collected_counts

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 200])
    parser.add_argument("--latency", type=float, default=0.02,
                        help="the fake upstream's seconds of work a call (default 0.02)")
    args = parser.parse_args()
    if not GSM8K.is_dir():
        print(f"GSM8K not found at {GSM8K}", file=sys.stderr)
        return 2
    status = 0
    print(f"{args.calls} calls a setting; the fake upstream takes {args.latency * 1000:.0f} "
          "ms a call")
    print("concurrency | direct median / p99 | gateway median / p99 | added median / p99 "
          "| gateway calls/s | spans / calls")
    fake, upstream = start([sys.executable, "-c", UPSTREAM, str(REPO), str(args.latency)],
                           "http")
    try:
        for n, concurrency in enumerate(args.concurrency):
            texts = [f"[{concurrency}] {q}" for q in questions(args.calls)]
            direct, _, failed_direct = asyncio.run(send(upstream, texts, concurrency))
            with tempfile.TemporaryDirectory() as folder:
                db = Path(folder) / "runs.duckdb"
                gateway, url = start([sys.executable, "-m", "engine", "gateway", "--db",
                                      str(db), "--upstream", upstream, "--port", "0"],
                                     "gateway on")
                through, wall, failed = asyncio.run(send(
                    url.replace("/v1", f"/s/bench-{n}/v1"), texts, concurrency))
                gateway.send_signal(signal.SIGTERM)
                last = gateway.communicate(timeout=60)[0].strip().splitlines()[-1]
                answered = int(last.split()[1])  # "stopped: N calls (...)"
                spans = collected_counts(db)["spans"]
            d50, d99 = quantile(direct, 0.5), quantile(direct, 0.99)
            g50, g99 = quantile(through, 0.5), quantile(through, 0.99)
            print(f"{concurrency:>11} | {d50:7.2f} / {d99:7.2f} ms | {g50:7.2f} / {g99:7.2f} ms"
                  f" | {g50 - d50:6.2f} / {g99 - d99:6.2f} ms | {len(texts) / wall:8.0f}"
                  f" | {spans} / {answered}")
            if failed or failed_direct or spans != answered or answered != len(texts):
                print(f"  lost or failed: {failed} gateway failures, {failed_direct} direct, "
                      f"{spans} spans for {answered} answered of {len(texts)}")
                status = 1
    finally:
        fake.stdin.close()
        fake.wait(10)
    return status


if __name__ == "__main__":
    sys.exit(main())
