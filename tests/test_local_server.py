"""The embedded model served by llama-server (engine/llm/server.py): the managed process
(127.0.0.1, a free port, health-checked, stopped with its backend, at exit, and when its
parent is killed), one clear error when it cannot start, what each call sends, and the
cached prompt tokens reaching llm_calls.cached_tokens.

Most tests run a stand-in for the binary (tests/support/fake_llama_server.py), so they run
everywhere; the ones marked `llama_server` run the real binary on the embedded SmolLM2 and
are skipped, with the reason, where `./dev setup` has not built it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import duckdb
import pytest

from engine.llm.base import LLMError, LLMRequest
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.local import LocalBackend
from engine.llm.schema import token_budget
from engine.llm.server import (
    BINARY_ENV,
    DEFAULT_SLOTS,
    LlamaServer,
    LocalServerBackend,
    check_server,
    served,
    server_binary,
)
from engine.runs.execute import RunConfig, execute
from tests.support.graphs import REPO, TWO_HINTS, arithmetic_rows, write_graph
from tests.support.models import embedded_model_missing

FAKE = REPO / "tests" / "support" / "fake_llama_server.py"
SCHEMA = {"type": "object", "properties": {
    "reasoning": {"type": "string", "maxLength": 200},
    "answer": {"type": "string", "minLength": 1, "maxLength": 40}},
    "required": ["reasoning", "answer"], "additionalProperties": False}


@pytest.fixture
def fake_binary(tmp_path, monkeypatch) -> Path:
    """An executable stand-in for llama-server; its log is tmp_path/fake.jsonl."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    binary.chmod(0o755)
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(tmp_path / "fake.jsonl"))
    monkeypatch.delenv("FAKE_LLAMA_MODE", raising=False)
    monkeypatch.delenv("FAKE_LLAMA_LATENCY", raising=False)
    return binary


def fake_log(tmp_path) -> list[dict]:
    path = tmp_path / "fake.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def model_file(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp writes them) listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


def gone(pid: int, within: float = 10.0) -> bool:
    """Whether process `pid` ends (or is a zombie) within `within` seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def real_server_missing() -> str | None:
    if server_binary() is None:
        return "llama-server is not built here (./dev setup builds it into .venv/bin)"
    return embedded_model_missing()


def stand_in(path: Path) -> SimpleNamespace:
    """What LocalServerBackend takes from the in-process backend it serves."""
    return SimpleNamespace(model_path=path, model_name=path.name, n_ctx=2048, chat_format=None)


# --- the process -------------------------------------------------------------------------


def test_the_server_binds_127_0_0_1_on_a_free_port_with_slots_and_stops(tmp_path, fake_binary):
    server = LlamaServer(model_file(tmp_path), binary=fake_binary, slots=3, ctx_per_slot=1024)
    with server:
        assert server.running and server.port > 0
        assert listening(server.port) == ["0100007F"]  # 127.0.0.1 only
        argv = fake_log(tmp_path)[0]["argv"]
        flags = dict(zip(argv, argv[1:], strict=False))
        assert flags["--host"] == "127.0.0.1" and flags["--port"] == str(server.port)
        assert flags["--parallel"] == "3" and flags["--ctx-size"] == "3072"
        assert flags["--threads"] == str(len(os.sched_getaffinity(0)))
        assert "--cont-batching" in argv
        pid = server.process.pid
    assert not server.running and gone(pid, within=1)
    assert listening(server.port) == []


PARENT = """
import sys, time
sys.path.insert(0, {repo!r})
import engine.llm.server
from engine.llm.server import LlamaServer
{before}
server = LlamaServer({model!r}, binary={binary!r}, slots=1, ctx_per_slot=512).start()
print(server.process.pid, flush=True)
{after}
"""


def start_parent(tmp_path, binary: Path, model: Path, after: str,
                 before: str = "") -> tuple[subprocess.Popen, int]:
    code = PARENT.format(repo=str(REPO), model=str(model), binary=str(binary), after=after,
                         before=before)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    line = parent.stdout.readline()
    assert line.strip().isdigit(), f"the parent did not start a server: {line!r}"
    return parent, int(line)


@pytest.mark.parametrize("how", ["killed", "exits"])
def test_the_server_ends_with_its_parent(tmp_path, fake_binary, how):
    """Killed: only the kernel's parent-death signal can stop it. Exits without stopping
    it: the atexit hook does, checked here with the parent-death signal off."""
    after = "time.sleep(600)" if how == "killed" else "sys.exit(0)"
    before = "" if how == "killed" else "engine.llm.server._die_with_parent = lambda: None"
    parent, child = start_parent(tmp_path, fake_binary, model_file(tmp_path), after, before)
    if how == "killed":
        assert not gone(child, within=0.5)
        parent.send_signal(signal.SIGKILL)  # no atexit, no finally: only the kernel's signal
    parent.wait(timeout=30)
    survived = not gone(child)
    if survived:
        os.kill(child, signal.SIGKILL)  # not left behind by a failing test
    assert not survived, f"llama-server (pid {child}) outlived its parent"


def test_a_missing_binary_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(BINARY_ENV, str(tmp_path / "no-such-llama-server"))
    assert server_binary() is None
    with pytest.raises(LLMError) as caught:
        served(stand_in(model_file(tmp_path)), "server")
    message = str(caught.value)
    assert "\n" not in message and "llama-server is not installed" in message
    assert "./dev setup" in message and "--local-serving in-process" in message
    # auto serves in-process instead
    local = stand_in(model_file(tmp_path))
    assert served(local, "auto") is local


def test_a_model_the_server_cannot_load_is_one_clear_error(tmp_path, fake_binary, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "fail")
    server = LlamaServer(model_file(tmp_path), binary=fake_binary)
    with pytest.raises(LLMError) as caught:
        server.start()
    message = str(caught.value)
    assert "\n" not in message
    assert "could not serve model.gguf (exit status 1)" in message
    assert "error loading model: tensor data is not within the file bounds" in message
    assert not server.running


def test_the_setup_check_tells_a_server_that_answers_from_one_that_dies_on_its_first_batch(
        tmp_path, fake_binary, monkeypatch):
    """`./dev setup` keeps an AVX-512 build only if check_server gets a reply from it: a
    server that starts and reports healthy but dies on its first completion is named in
    one line with the signal, and stopped either way."""
    assert check_server(model_file(tmp_path), fake_binary) is None
    request = [e["request"] for e in fake_log(tmp_path) if "request" in e]
    assert request[0]["max_tokens"] == 4 and request[0]["messages"][0]["role"] == "user"
    assert gone(fake_log(tmp_path)[0]["pid"], within=2)

    monkeypatch.setenv("FAKE_LLAMA_MODE", "crash")
    (tmp_path / "fake.jsonl").unlink()
    why = check_server(model_file(tmp_path), fake_binary)
    assert why is not None and "\n" not in why
    assert why.startswith(f"llama-server died on its first request (exit status "
                          f"{-signal.SIGSEGV})")
    assert "about to compute the first batch" in why
    # ... and one that cannot load says so, as a run would
    monkeypatch.setenv("FAKE_LLAMA_MODE", "fail")
    assert "error loading model" in check_server(model_file(tmp_path), fake_binary)


def test_a_server_that_never_gets_ready_is_stopped(tmp_path, fake_binary, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "never-ready")
    server = LlamaServer(model_file(tmp_path), binary=fake_binary, start_timeout=1.5)
    with pytest.raises(LLMError, match="did not become ready within 1.5 s"):
        server.start()
    pid = fake_log(tmp_path)[0]["pid"]
    assert not server.running and gone(pid, within=2)


def test_serving_modes_choose_the_backend(tmp_path, fake_binary, monkeypatch):
    monkeypatch.setenv(BINARY_ENV, str(fake_binary))
    local = stand_in(model_file(tmp_path))
    assert served(local, "in-process") is local
    backend = served(local, "auto", slots=2)
    assert isinstance(backend, LocalServerBackend) and backend.slots == 2
    assert backend.name == "local" and backend.model_name == "model.gguf"
    assert served(local, "server").slots == DEFAULT_SLOTS
    # a llama-cpp-python chat format is the in-process backend's
    with_format = SimpleNamespace(**{**vars(local), "chat_format": "chatml"})
    assert served(with_format, "auto") is with_format
    with pytest.raises(ValueError, match="unknown local serving 'fast'"):
        served(local, "fast")


def test_the_optimizers_server_keeps_no_ram_cache_of_prompts(tmp_path, fake_binary,
                                                              monkeypatch):
    """The embedded pair's second server (the optimizer's: every prompt new) starts with
    --cache-ram 0; a forward model's keeps its cache."""
    from engine.llm.factory import make_backend

    monkeypatch.setenv(BINARY_ENV, str(fake_binary))
    model = model_file(tmp_path)
    monkeypatch.setattr("engine.llm.local.LocalBackend", lambda **kw: stand_in(model))

    def cache_ram(backend) -> str:
        argv = backend.server.command()
        return argv[argv.index("--cache-ram") + 1]

    assert cache_ram(make_backend("local", serving="server")) == "256"
    assert cache_ram(make_backend("local", serving="server", for_optimizer=True)) == "0"


def test_the_server_keeps_one_copy_of_the_weights(tmp_path, fake_binary, monkeypatch):
    """A mapped model file's pages stay resident beside llama.cpp's repacked copy of the
    weights (0.6 GiB more for the 1.5B): every server reads the weights in instead."""
    from engine.llm.factory import make_backend

    monkeypatch.setenv(BINARY_ENV, str(fake_binary))
    model = model_file(tmp_path)
    monkeypatch.setattr("engine.llm.local.LocalBackend", lambda **kw: stand_in(model))
    for optimizer in (False, True):
        argv = make_backend("local", serving="server", for_optimizer=optimizer).server.command()
        assert argv[argv.index("--load-mode") + 1] == "none"


def test_a_run_on_the_embedded_pair_serves_its_optimizer_without_a_ram_cache(monkeypatch):
    """execute's client: the forward model as asked, the paired optimizer's backend made
    `for_optimizer` (so its server keeps no RAM cache of prompts)."""
    from engine.runs import execute as ex

    made = []

    def fake(kind, **kw):
        made.append(kw)
        return SimpleNamespace(name=kind, model_name=kw.get("model") or "qwen2.5-coder-0.5b",
                               model_sha256="forward", supports_schema=True)

    monkeypatch.setattr("engine.llm.factory.make_backend", fake)
    monkeypatch.setattr("engine.llm.models.paired_optimizer",
                        lambda m: ("qwen2.5-coder-1.5b", None))
    monkeypatch.setattr(ex, "_same_local_model", lambda forward, spec: False)
    ex.make_client(ex.RunConfig(graph="g.yaml", backend="local"), None, None, None)
    assert [(m.get("model"), m.get("for_optimizer", False)) for m in made] == [
        (None, False), ("qwen2.5-coder-1.5b", True)]


def test_a_runs_client_times_a_providers_calls_at_120_s_unless_told_otherwise():
    """The client's own timeout is for backends that do not time their calls (a provider's):
    120 s by default, `--timeout` when given; the embedded model's calls are timed by its
    backends instead (LOCAL_TIMEOUT, from when the model starts on them)."""
    from engine.llm.base import DEFAULT_TIMEOUT
    from engine.runs import execute as ex

    def client(**kw):
        return ex.make_client(ex.RunConfig(graph="g.yaml", backend="scripted", **kw), None,
                              None, None)

    assert DEFAULT_TIMEOUT == 120.0
    assert client().retry.timeout == DEFAULT_TIMEOUT
    assert client(timeout=7.5).retry.timeout == 7.5


# --- the calls ---------------------------------------------------------------------------


def test_each_call_sends_what_llama_server_needs(tmp_path, fake_binary):
    backend = LocalServerBackend(stand_in(model_file(tmp_path)), binary=fake_binary)

    async def go():
        try:
            text = await backend.complete(LLMRequest(
                messages=(("user", "Say hi"),), model="m", purpose="forward", max_tokens=32,
                stop=("</output>",), seed=3))
            structured = await backend.complete(LLMRequest(
                messages=(("user", "Judge it"),), model="m", purpose="backward",
                max_tokens=32, schema=SCHEMA))
        finally:
            await backend.aclose()
        return text, structured

    text, structured = asyncio.run(go())
    requests = [e["request"] for e in fake_log(tmp_path) if "request" in e]
    assert len(requests) == 2
    plain, constrained = requests
    assert plain["cache_prompt"] is True and constrained["cache_prompt"] is True
    # no repeat penalty: llama-server counts the prompt in its window (see the next test)
    assert plain["repeat_penalty"] == 1.0
    assert plain["stop"] == ["</output>"] and plain["seed"] == 3 and plain["max_tokens"] == 32
    assert "response_format" not in plain
    assert constrained["repeat_penalty"] == 1.0
    # the schema goes whole, its length limits included: they end a constrained reply
    assert constrained["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "reply", "schema": SCHEMA}}
    assert constrained["max_tokens"] == token_budget(SCHEMA)
    assert text.model == "model.gguf" and structured.constrained is True
    assert json.loads(structured.text)["answer"]
    assert not backend.server.running


def test_a_failed_start_is_reported_once_and_not_retried(tmp_path, fake_binary, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_MODE", "fail")
    backend = LocalServerBackend(stand_in(model_file(tmp_path)), binary=fake_binary)
    client = LLMClient(forward_backend=backend, forward_model="model.gguf",
                       retry=RetryPolicy(max_retries=2, timeout=30))

    async def go():
        try:
            return [await client.call(client.request("forward", [("user", "hi")]), step=0)
                    for _ in range(2)]
        finally:
            await client.aclose()

    records = asyncio.run(go())
    for record in records:
        assert "error loading model" in record.error and record.retries == 0
    assert len([e for e in fake_log(tmp_path) if "argv" in e]) == 1  # started once


def served_calls(tmp_path, fake_binary, *, slots: int, timeout: float, calls: int):
    """`calls` concurrent forward calls through a LocalServerBackend of `slots` slots whose
    own timeout is `timeout`, by a client whose timeout is as short."""
    backend = LocalServerBackend(stand_in(model_file(tmp_path)), binary=fake_binary,
                                 slots=slots, timeout=timeout)
    client = LLMClient(forward_backend=backend, forward_model="model.gguf",
                       retry=RetryPolicy(max_retries=1, base_delay=0.001, timeout=timeout))

    async def go():
        try:
            await backend._ready()  # the server's start is not a call's work
            return await asyncio.gather(*(
                client.call(client.request("forward", [("user", f"q{i}")]), step=0)
                for i in range(calls)))
        finally:
            await client.aclose()

    return asyncio.run(go())


def test_a_call_queued_behind_busy_slots_is_timed_from_its_own_start(
        tmp_path, fake_binary, monkeypatch):
    # each call takes 0.4 s of the model's time; one slot, so the third waits 0.8 s first.
    # Timed from the queue (a 1 s timeout), it would time out and be sent again.
    monkeypatch.setenv("FAKE_LLAMA_LATENCY", "0.4")
    records = served_calls(tmp_path, fake_binary, slots=1, timeout=1.0, calls=3)
    assert [r.error for r in records] == [None, None, None]
    assert [r.retries for r in records] == [0, 0, 0]
    assert len([e for e in fake_log(tmp_path) if "request" in e]) == 3
    # the wait for the slot is logged apart from the model's time on the call
    waits = sorted(r.queued_ms for r in records)
    assert waits[0] < 200 and waits[1] >= 390 and waits[2] >= 790
    assert all(r.latency_ms - r.queued_ms < 1000 for r in records)


def test_a_call_the_model_takes_too_long_on_times_out_and_is_retried(
        tmp_path, fake_binary, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_LATENCY", "1.0")
    [record] = served_calls(tmp_path, fake_binary, slots=1, timeout=0.3, calls=1)
    assert record.retries == 1
    assert record.error.startswith("gave up after 1 retries") and "timed out" in record.error


def test_cached_prompt_tokens_reach_llm_calls(tmp_path, fake_binary):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    backend = LocalServerBackend(stand_in(model_file(tmp_path)), binary=fake_binary)
    config = RunConfig(graph=str(graph), backend="local", steps=1, train=4, val=4, test=0,
                       cache="off", db=str(db))
    asyncio.run(execute(config, forward_backend=backend))
    requests = [e["request"] for e in fake_log(tmp_path) if "request" in e]
    with duckdb.connect(str(db), read_only=True) as con:
        # identical requests in flight together are sent once (the others are free cache hits)
        rows = con.execute("SELECT backend, model, prompt_tokens, cached_tokens "
                           "FROM llm_calls WHERE NOT cache_hit").fetchall()
    assert len(rows) == len(requests) > 0
    assert {(r[0], r[1]) for r in rows} == {("local", "model.gguf")}
    assert sum(r[3] > 0 for r in rows) > 0, "the shared prefixes were served from the cache"
    assert all(0 <= r[3] <= r[2] for r in rows)
    assert not backend.server.running


def test_the_command_line_refuses_a_missing_server_in_one_line(tmp_path, monkeypatch):
    reason = embedded_model_missing()
    if reason:
        pytest.skip(reason)
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    env = {**os.environ, BINARY_ENV: str(tmp_path / "none"), "PYTHONPATH": str(REPO)}
    env.pop("OPENAI_API_KEY", None)
    done = subprocess.run([sys.executable, "-m", "engine", "run", str(graph), "--backend",
                           "local", "--local-serving", "server", "--steps", "0",
                           "--db", str(tmp_path / "runs.duckdb")],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: llama-server is not installed")


def test_counting_tokens_writes_nothing_to_the_terminal(tmp_path, fake_binary, capfd):
    """The vocabulary the backend counts prompt tokens with loads without llama.cpp's
    warning about its context ("n_ctx_seq (512) > n_ctx_train (0) ..."), which every
    embedded run printed."""
    reason = embedded_model_missing()
    if reason:
        pytest.skip(reason)
    from engine.llm.local import local_model_path

    backend = LocalServerBackend(stand_in(local_model_path()), binary=fake_binary)
    capfd.readouterr()
    vocab = backend._tokenizer()
    assert vocab is not None and vocab.tokenize(b"hello world")
    assert capfd.readouterr().err == ""


# --- the real binary ---------------------------------------------------------------------


@pytest.mark.embedded_model
def test_the_real_server_serves_reuses_prefixes_and_ends_with_its_parent(tmp_path):
    reason = real_server_missing()
    if reason:
        pytest.skip(reason)
    local = LocalBackend(n_ctx=1024)
    backend = LocalServerBackend(local, slots=2)
    system = ("You answer arithmetic questions. Think step by step, then give the answer "
              "as a number. ") * 8

    async def go():
        try:
            ask = [LLMRequest(messages=(("system", system), ("user", f"What is {n} + {n}?")),
                              model="m", purpose="forward", max_tokens=8) for n in (2, 3, 4)]
            first = await backend.complete(ask[0])
            rest = await asyncio.gather(*(backend.complete(r) for r in ask[1:]))
            structured = await backend.complete(LLMRequest(
                messages=(("user", "Is 2 + 2 = 4? Reply in JSON."),), model="m",
                purpose="backward", max_tokens=16, schema=SCHEMA))
            port = backend.server.port
            return first, rest, structured, port, listening(port)
        finally:
            await backend.aclose()

    first, rest, structured, port, addresses = asyncio.run(go())
    assert addresses == ["0100007F"]
    assert first.completion_tokens >= 1 and first.cached_tokens == 0
    # of the two sent together, the one that lands on the first call's slot reuses its prefix
    assert max(r.cached_tokens for r in rest) > 50, [r.cached_tokens for r in rest]
    reply = json.loads(structured.text)
    assert set(reply) == {"reasoning", "answer"} and 1 <= len(reply["answer"]) <= 40
    assert listening(port) == []

    parent, child = start_parent(tmp_path, server_binary(), local.model_path,
                                 "time.sleep(600)")
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    survived = not gone(child)
    if survived:
        os.kill(child, signal.SIGKILL)
    assert not survived, f"llama-server (pid {child}) outlived its parent"


@pytest.mark.embedded_model
def test_the_served_model_writes_the_number_its_input_holds():
    """llama-server counts the prompt in its repeat-penalty window: with the in-process
    backend's penalty (1.3) the 0.5B, told to write the number in a sentence, wrote "10" or
    "14" for "Lena packed 7 boxes" on most sentences, and the demo's fixes never worked."""
    reason = real_server_missing()
    if reason:
        pytest.skip(reason)
    backend = LocalServerBackend(LocalBackend(n_ctx=1024), slots=2)
    sentences = {"Lena packed 7 boxes for the trip.": "7",
                 "Omar planted 12 trees in the garden.": "12",
                 "Priya read 9 books this summer.": "9",
                 "Tomas baked 24 cookies for the party.": "24"}

    async def go():
        try:
            return await asyncio.gather(*(backend.complete(LLMRequest(
                messages=(("user", f"## Task\nWrite the number in the text.\n\n## Inputs\n"
                                   f"<input name=\"text\">\n{text}\n</input>\n\nWrite the "
                                   "result between <output> and </output>."),),
                model="m", purpose="forward", max_tokens=16, stop=("</output>",)))
                for text in sentences))
        finally:
            await backend.aclose()

    replies = asyncio.run(go())
    written = [reply.text.replace("<output>", "").strip() for reply in replies]
    assert written == list(sentences.values())
