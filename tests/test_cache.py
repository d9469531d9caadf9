"""The reply cache: hits, misses on every sampling-relevant field, stable keys, modes."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.llm.base import LLMReply, LLMRequest
from engine.llm.cache import Cache
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.openai_backend import OpenAIBackend
from tests.support.fake_openai import FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[1]

BASE = LLMRequest(messages=(("system", "Be brief."), ("user", "What is 6*7?")), model="m",
                  purpose="forward", temperature=0.0, max_tokens=64, seed=1, top_p=None,
                  stop=(), sample_index=0, backend="openai")


def run_client(server: FakeOpenAIServer, cache: Cache, requests_args: list[dict]):
    """Make one client call per kwargs dict, in order; return the CallRecords."""

    async def go():
        backend = OpenAIBackend(base_url=server.base_url, api_key="sk-test")
        client = LLMClient(forward_backend=backend, forward_model="m", cache=cache,
                           retry=RetryPolicy(base_delay=0.01, timeout=5))
        try:
            return [await client.call(client.request("forward", [("user", "hi")], **kwargs),
                                      step=0) for kwargs in requests_args]
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_identical_requests_hit():
    with FakeOpenAIServer() as server:
        first, second = run_client(server, Cache("readwrite"), [{}, {}])
    assert len(server.requests) == 1
    assert not first.cache_hit and second.cache_hit
    assert second.response == first.response
    assert second.cost_usd == 0.0


def test_changed_request_misses_and_reaches_the_server():
    with FakeOpenAIServer() as server:
        records = run_client(server, Cache("readwrite"),
                             [{}, {"temperature": 0.7}, {"max_tokens": 10}, {"sample_index": 1}, {}])
    assert [r.cache_hit for r in records] == [False, False, False, False, True]
    assert len(server.requests) == 4
    assert [r["temperature"] for r in server.requests] == [0.0, 0.7, 0.0, 0.0]


@pytest.mark.parametrize("change", [
    {"model": "other"},
    {"temperature": 0.5},
    {"max_tokens": 65},
    {"seed": 2},
    {"seed": None},
    {"top_p": 0.9},
    {"stop": ("\n",)},
    {"messages": (("system", "Be brief."), ("user", "What is 6*8?"))},
    {"messages": (("user", "Be brief."), ("user", "What is 6*7?"))},
    {"sample_index": 1},
    {"backend": "local"},
])
def test_every_sampling_field_changes_the_key(change):
    assert dataclasses.replace(BASE, **change).cache_key() != BASE.cache_key()


def test_meta_and_purpose_do_not_change_the_key():
    same = dataclasses.replace(BASE, meta={"node_id": "n1"}, purpose="update")
    assert same.cache_key() == BASE.cache_key()


KEY_SCRIPT = """
from engine.llm.base import LLMRequest
print(LLMRequest(messages=(("system", "Be brief."), ("user", "What is 6*7? é✓")), model="m",
                 purpose="forward", max_tokens=64, seed=1, backend="openai").cache_key())
"""


def test_cache_key_is_stable_across_processes_and_hash_seeds():
    expected = dataclasses.replace(
        BASE, messages=(("system", "Be brief."), ("user", "What is 6*7? é✓"))).cache_key()
    keys = set()
    for hash_seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run([sys.executable, "-c", KEY_SCRIPT], env=env, cwd=ROOT,
                             capture_output=True, text=True, check=True)
        keys.add(out.stdout.strip())
    assert keys == {expected}


def test_read_mode_reads_but_never_writes():
    with FakeOpenAIServer() as server:
        cache = Cache("read")
        first, second = run_client(server, cache, [{}, {}])
        assert len(server.requests) == 2
        assert not first.cache_hit and not second.cache_hit
        assert cache.entries == {} and cache.drain() == []

        # An entry that is already there is used.
        probe = LLMRequest(messages=(("user", "hi"),), model="m", purpose="forward",
                           backend="openai")
        cache.entries[probe.cache_key()] = LLMReply(text="<output>cached</output>")
        (third,) = run_client(server, cache, [{}])
        assert third.cache_hit and third.response == "<output>cached</output>"
        assert len(server.requests) == 2


def test_off_mode_never_reads():
    probe = LLMRequest(messages=(("user", "hi"),), model="m", purpose="forward",
                       backend="openai")
    cache = Cache("off")
    cache.entries[probe.cache_key()] = LLMReply(text="<output>stale</output>")
    with FakeOpenAIServer() as server:
        (record,) = run_client(server, cache, [{}])
    assert not record.cache_hit and record.response != "<output>stale</output>"
    assert len(server.requests) == 1
    assert cache.drain() == []


def test_readwrite_queues_rows_for_the_run_log():
    with FakeOpenAIServer() as server:
        cache = Cache("readwrite")
        (record,) = run_client(server, cache, [{}])
    (row,) = cache.drain()
    assert row["key"] == record.cache_key and row["response"] == record.response
    assert cache.drain() == []


def test_sample_index_separates_deliberate_resamples():
    with FakeOpenAIServer() as server:
        records = run_client(server, Cache("readwrite"), [
            {"temperature": 0.8, "sample_index": 0},
            {"temperature": 0.8, "sample_index": 1},
            {"temperature": 0.8, "sample_index": 2},
            {"temperature": 0.8, "sample_index": 1},
        ])
    assert [r.cache_hit for r in records] == [False, False, False, True]
    assert len({r.cache_key for r in records}) == 3
    assert len(server.requests) == 3


def test_unknown_mode_is_rejected():
    with pytest.raises(ValueError, match="cache mode"):
        Cache("sometimes")


def test_a_cache_off_run_asks_the_server_once_for_identical_hint_calls(tmp_path):
    # the GSM8K graph's two hints start with the same prompt and input: with the cache off
    # their identical requests, in flight together, still reach the server once
    from engine.runs.execute import RunConfig, execute
    from tests.support.graphs import TWO_HINTS, arithmetic_rows, write_graph

    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    with FakeOpenAIServer() as server:
        os.environ.pop("OPENAI_API_KEY", None)
        result = asyncio.run(execute(RunConfig(
            graph=str(graph), db=str(tmp_path / "runs.duckdb"), steps=0, train=4, val=4,
            test=0, backend="openai", base_url=server.base_url, cache="off")))
        hints = [r for r in server.requests if "intermediate step" in str(r["messages"])]
    assert result.status == "finished"
    assert len(hints) == 8  # 8 examples x 1, not x 2
    assert result.stats.cache_hits == 8 and result.stats.network_calls == 16
