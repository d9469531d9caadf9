"""The embedded model served by llama.cpp's own HTTP server, `llama-server`, as a managed
child process: one model in memory serving several calls at once.

Why a server: llama-server decodes its parallel slots together (continuous batching: a
call joins the running batch as soon as a slot frees), so concurrent calls share each pass
over the weights, which is what bounds generation on a CPU; and it keeps each slot's KV state
and a RAM cache of recent prompts, so calls that share a prefix (the system prompt, the
node's task) evaluate it once (`cache_prompt`). The in-process backend (engine/llm/local.py)
runs one call per llama context instead.

The process: bound to 127.0.0.1 on a free port, its threads set to the cores this process
may use, health-checked (`/health`) before the first call, and never left running. It is
stopped when the backend closes (`aclose`, or the `with` block of a `LlamaServer`), when
this process exits (atexit), and, on Linux, by the kernel when this process dies of any
signal (PR_SET_PDEATHSIG, set in the child before it runs the server). It runs in a
session of its own, so a Ctrl-C at the terminal reaches only this process, which then
stops it. A server that fails to start (a missing binary, a file it cannot load) gives one
`LLMError` line with the server's own reason.

Calls go through the OpenAI-compatible backend (engine/llm/openai_backend.py) with what
llama-server adds: the reply schema as `response_format` json_schema with its length
limits kept (the grammar, not the token limit, ends a reply, as in-process), no repeat
penalty (the server counts the prompt in its window: SERVER_REPEAT_PENALTY), and prompts
cut to fit a slot's context (`engine.llm.local.fit_messages`, counted with the model's own
vocabulary). The prompt tokens served from the prefix cache come back as
`usage.prompt_tokens_details.cached_tokens` and are logged in `llm_calls.cached_tokens`, as
for providers.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from engine.llm.base import LOCAL_TIMEOUT, LLMError, LLMReply, LLMRequest
from engine.llm.local import (
    fit_messages,
    prompt_budget,
    reply_tokens,
)
from engine.llm.openai_backend import OpenAIBackend
from engine.processes import die_with_parent

BINARY_NAME = "llama-server"
BINARY_ENV = "SEMBACK_LLAMA_SERVER"  # a llama-server binary to use instead of the venv's
BUILD_HINT = "build it with ./dev setup"
# calls decoded together: on two cores four slots roughly double the tokens a second of one
DEFAULT_SLOTS = 4
# the server's RAM cache of prompt states (MiB): its default, 8 GiB, is more than the model
CACHE_RAM_MIB = 256
# ... for the optimizer's server: its backward and update prompts are each new (what they
# share, the system prompt and the template, stays in the slots' own KV cache), so a RAM
# cache would hold states nothing asks for again
OPTIMIZER_CACHE_RAM_MIB = 0
# No repeat penalty. llama-server feeds the prompt into the penalty window (its last 64
# tokens: the step's inputs), so any penalty keeps the model from writing a word or number it
# was given: the demo's `note`, told "Write the number in the text", scored 5 of 24 at the
# in-process backend's 1.3 and 24 of 24 without (benchmarks/demo_prompts.py). The in-process
# backend penalizes only the reply. Replies stay bounded by max_tokens and the schema's lengths.
SERVER_REPEAT_PENALTY = 1.0
# The weights read into memory, not mapped. On x86 llama.cpp repacks the Q4_K weights into
# an interleaved layout; from a mapped file the file's pages stay resident beside the copy
# (the 1.5B's server peaked at 1.97 GiB, the demo at 3.05 GiB). Read in, the weights are
# held once (1.39 GiB; the demo 2.4 GiB) and keep the repacked layout's speed: 4 concurrent
# requests on the 1.5B generated 19-23 tokens/s against 16-17.5 with repacking turned off
# instead (benchmarks/local_model_speed.py, two cores). Loading takes about 4 s longer.
SERVER_FLAGS = ("--load-mode", "none")
START_TIMEOUT = 180.0  # seconds for the model to load and /health to answer 200
SERVING_MODES = ("auto", "server", "in-process")
_LIVE: set[LlamaServer] = set()  # running servers, stopped at exit even if dropped


def server_binary() -> Path | None:
    """The llama-server to run: $SEMBACK_LLAMA_SERVER, else the one `./dev setup` builds
    next to this Python (.venv/bin), else one on PATH; None when there is none."""
    if os.environ.get(BINARY_ENV):
        given = Path(os.environ[BINARY_ENV]).expanduser()
        return given if given.is_file() and os.access(given, os.X_OK) else None
    beside = Path(sys.executable).parent / BINARY_NAME
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which(BINARY_NAME)
    return Path(found) if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> Any:
    """A preexec_fn that asks the kernel to send the child SIGKILL when its parent dies
    (Linux); None elsewhere. SIGKILL, not SIGTERM: llama-server catches SIGTERM to shut down
    gracefully and was seen to live on after it (it holds nothing worth saving)."""
    return die_with_parent(signal.SIGKILL)


class LlamaServer:
    """One llama-server process serving the GGUF file `model_path`.

    `start()` (or `with LlamaServer(...) as server:`) runs it and waits until it is healthy;
    `stop()` ends it. `spawn()` and `wait_ready()` are the two halves of `start()`, for a
    caller that must fork on one thread and wait on another."""

    def __init__(self, model_path: str | Path, *, slots: int = DEFAULT_SLOTS,
                 ctx_per_slot: int = 2048, threads: int | None = None,
                 binary: str | Path | None = None, chat_template: str | None = None,
                 cache_ram_mib: int = CACHE_RAM_MIB, start_timeout: float = START_TIMEOUT,
                 port: int = 0):
        self.model_path = Path(model_path)
        self.slots = max(1, slots)
        self.ctx_per_slot = ctx_per_slot
        self.threads = threads or len(os.sched_getaffinity(0))
        self.binary = Path(binary) if binary is not None else server_binary()
        self.chat_template = chat_template
        self.cache_ram_mib = cache_ram_mib
        self.start_timeout = start_timeout
        self.port = 0
        self.fixed_port = port  # 0: a free port at each start
        self.process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def command(self) -> list[str]:
        args = [str(self.binary), "--model", str(self.model_path),
                "--host", "127.0.0.1", "--port", str(self.port),
                "--parallel", str(self.slots), "--ctx-size", str(self.ctx_per_slot * self.slots),
                "--no-kv-unified", "--cont-batching",
                "--threads", str(self.threads), "--threads-batch", str(self.threads),
                "--cache-ram", str(self.cache_ram_mib), "--no-webui", "--no-warmup",
                *SERVER_FLAGS]
        if self.chat_template:
            args += ["--chat-template", self.chat_template]
        return args

    def start(self) -> LlamaServer:
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        """Start the process (not waiting for it to be ready). PR_SET_PDEATHSIG follows
        the thread that forks: call this on a thread that lives as long as the server."""
        with self._lock:
            if self.running:
                return
            if self.binary is None or not self.binary.is_file():
                where = self.binary or f".venv/bin/{BINARY_NAME}"
                raise LLMError(f"llama-server is not installed ({where}): {BUILD_HINT}, or "
                               "use --local-serving in-process")
            self.port = self.fixed_port or free_port()
            self._log = tempfile.TemporaryFile(prefix="llama-server-")
            try:
                self.process = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=self._log,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_parent())
            except OSError as exc:
                raise LLMError(f"cannot run {self.binary}: {exc.strerror}") from None
            _LIVE.add(self)

    def wait_ready(self) -> None:
        """Block until /health answers 200; LLMError (stopping the process) if it exits or
        takes longer than `start_timeout`."""
        deadline = time.monotonic() + self.start_timeout
        while True:
            process = self.process
            if process is None:
                raise LLMError("llama-server was stopped before it was ready")
            if process.poll() is not None:
                reason = self.log_reason()
                self.stop()
                raise LLMError(f"llama-server could not serve {self.model_path.name} "
                               f"(exit status {process.returncode}): {reason}")
            if self._healthy():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise LLMError(f"llama-server did not become ready within "
                               f"{self.start_timeout:g} s serving {self.model_path.name}")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health",
                                        timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def log_reason(self) -> str:
        """The server's own words for why it stopped: its first error line, else its last
        line (of what it wrote so far)."""
        if self._log is None:
            return "no output"
        self._log.seek(0)
        lines = [ln.strip() for ln in self._log.read().decode("utf-8", "replace").splitlines()
                 if ln.strip()]
        errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
        reason = errors[0] if errors else lines[-1] if lines else "no output"
        return " ".join(reason.split())[:300]

    def stop(self, timeout: float = 5.0) -> None:
        """End the process: SIGTERM, then SIGKILL after `timeout` seconds. Idempotent."""
        with self._lock:
            process, self.process = self.process, None
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if self._log is not None:
                self._log.close()
                self._log = None
        _LIVE.discard(self)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


DIED_WAIT_S = 3.0  # how long check_server waits for a server that dropped its request to exit


def _exit_status(process: subprocess.Popen | None, within: float) -> int | None:
    """The process's exit status once it has ended, waiting up to `within` seconds; None
    while it still runs (or when there is none)."""
    if process is None:
        return None
    try:
        return process.wait(timeout=within)
    except subprocess.TimeoutExpired:
        return None


def check_server(model_path: str | Path, binary: str | Path | None = None,
                 timeout: float = 120.0) -> str | None:
    """Serve `model_path` with `binary` and ask for a few tokens: None when a reply came
    back, else why not, in one line. A llama-server built for this CPU's AVX-512 starts and
    reports healthy everywhere, but in some sandboxes and VMs such instructions crash it on
    its first batch; `./dev setup` runs this on the one it built (with SmolLM2, seconds)
    and builds the portable one instead when it fails."""
    server = LlamaServer(model_path, slots=1, ctx_per_slot=512, binary=binary,
                         cache_ram_mib=0)
    try:
        server.start()
        body = json.dumps({"messages": [{"role": "user", "content": "Say hello."}],
                           "max_tokens": 4, "temperature": 0}).encode()
        request = urllib.request.Request(f"{server.base_url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            json.loads(response.read())["choices"][0]["message"]
        return None
    except LLMError as exc:
        return str(exc)
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError) as exc:
        # a server that crashes closes the connection a moment before its exit can be
        # reaped: wait for it briefly, so a busy machine does not hide the crash
        status = _exit_status(server.process, within=DIED_WAIT_S)
        if status is not None:
            return (f"llama-server died on its first request (exit status {status}): "
                    f"{server.log_reason()}")
        return f"llama-server gave no reply to its first request: {exc}"
    finally:
        server.stop()


@contextlib.contextmanager
def stderr_silenced() -> Iterator[None]:
    """Nothing reaches stderr in the block, whether written from C to file descriptor 2 or
    through `sys.stderr` (llama-cpp-python's log callback). A vocabulary-only model has no
    training context length, so the context llama-cpp-python makes for it has llama.cpp
    warn "n_ctx_seq (512) > n_ctx_train (0) -- possible training context overflow", which
    `verbose=False` does not stop: about a context that never evaluates anything, on every
    embedded run's terminal. Process-wide: another thread's stderr in the block (a load of
    the vocabulary, well under a second, once per backend) is lost too."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
            os.dup2(null.fileno(), 2)
            try:
                yield
            finally:
                null.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(timeout=2.0)


class _ServerHTTP(OpenAIBackend):
    """The OpenAI-compatible backend with llama-server's own request fields."""

    def __init__(self, base_url: str, model_name: str, timeout: float):
        super().__init__(base_url=base_url, timeout=timeout)
        self.model_name = model_name

    def request_body(self, request: LLMRequest) -> dict[str, Any]:
        body = super().request_body(request)
        body["cache_prompt"] = True
        body["repeat_penalty"] = SERVER_REPEAT_PENALTY
        if request.schema is not None:
            # llama-server compiles the schema, length limits included, into a grammar
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": "reply", "schema": request.schema}}
        return body

    def _reply(self, request: LLMRequest, response: Any) -> LLMReply:
        reply = super()._reply(request, response)
        reply.model = self.model_name
        return reply


class LocalServerBackend:
    """The `local` backend served by llama-server: the model the in-process backend
    `local` was set up with (its file, name and checks), `slots` calls decoded together.
    The server starts on the first call and stops on `aclose`."""

    name = "local"
    supports_schema = True
    # `timeout` counts from when a call gets one of the server's slots (the HTTP request's
    # own timeout), not from when it was queued behind the others (engine/llm/client.py)
    times_own_calls = True

    def __init__(self, local: Any, *, slots: int | None = None, timeout: float = LOCAL_TIMEOUT,
                 binary: str | Path | None = None, cache_ram_mib: int = CACHE_RAM_MIB):
        self.model_path = Path(local.model_path)
        self.model_name = local.model_name
        self.model_sha256 = getattr(local, "model_sha256", None)
        # a named model's check that its file is still the one verified (engine/llm/models)
        self._check_model = getattr(getattr(local, "model", None), "check_unchanged", None)
        self.n_ctx = int(local.n_ctx)
        self.slots = max(1, slots or DEFAULT_SLOTS)
        self.timeout = timeout
        self.server = LlamaServer(self.model_path, slots=self.slots, ctx_per_slot=self.n_ctx,
                                  binary=binary, cache_ram_mib=cache_ram_mib)
        if self.server.binary is None:
            raise LLMError(f"llama-server is not installed (.venv/bin/{BINARY_NAME}): "
                           f"{BUILD_HINT}, or use --local-serving in-process")
        self._vocab: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: _ServerHTTP | None = None
        self._failure: str | None = None
        self._start_lock: asyncio.Lock | None = None
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return (f"LocalServerBackend(model_path={str(self.model_path)!r}, "
                f"n_ctx={self.n_ctx}, slots={self.slots})")

    async def complete(self, request: LLMRequest) -> LLMReply:
        asked = time.perf_counter()
        http = await self._ready()
        assert self._slots is not None
        async with self._slots:
            queued_ms = (time.perf_counter() - asked) * 1000  # the server's start, a slot
            try:
                reply = await http.complete(self._fitted(request))
                return dataclasses.replace(reply, queued_ms=reply.queued_ms + queued_ms)
            except LLMError:
                if not self.server.running and self._failure is None:
                    self._failure = f"llama-server stopped: {self.server.log_reason()}"
                if self._failure:
                    raise LLMError(self._failure) from None
                raise

    async def _ready(self) -> _ServerHTTP:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # asyncio objects belong to the loop that made them
            self._loop, self._http = loop, None
            self._start_lock, self._slots = asyncio.Lock(), asyncio.Semaphore(self.slots)
        assert self._start_lock is not None
        async with self._start_lock:
            if self._failure:
                raise LLMError(self._failure)
            if not self.server.running:
                try:
                    if self._check_model is not None:
                        self._check_model()
                    self.server.spawn()  # on the loop's thread, which outlives the server
                    await asyncio.to_thread(self.server.wait_ready)
                except LLMError as exc:
                    self._failure = str(exc)
                    raise
            if self._http is None:
                self._http = _ServerHTTP(self.server.base_url, self.model_name, self.timeout)
        return self._http

    def _fitted(self, request: LLMRequest) -> LLMRequest:
        """`request` with the token limit the in-process backend would use and its
        messages cut to fit a slot's context."""
        max_tokens = reply_tokens(request, self.n_ctx)
        budget = prompt_budget(self.n_ctx, max_tokens)
        messages = request.messages
        if self._tokenizer() is not None:
            fitted = fit_messages(self._vocab, request.messages, budget)
            messages = tuple((m["role"], m["content"]) for m in fitted)
        return dataclasses.replace(request, messages=messages, max_tokens=max_tokens)

    def _tokenizer(self) -> Any:
        """The model's vocabulary alone (llama-cpp-python, no weights), to count tokens."""
        if self._vocab is None:
            try:
                import llama_cpp

                with stderr_silenced():
                    self._vocab = llama_cpp.Llama(model_path=str(self.model_path),
                                                  vocab_only=True, verbose=False)
            except (ImportError, OSError, RuntimeError, ValueError):
                self._vocab = False  # prompts go as they are; the server refuses an overflow
        return self._vocab or None

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()
        await asyncio.to_thread(self.server.stop)
        self._failure = None


def served(local: Any, serving: str = "auto", *, slots: int | None = None,
           timeout: float = LOCAL_TIMEOUT, cache_ram_mib: int = CACHE_RAM_MIB) -> Any:
    """The backend that serves the in-process backend `local`'s model: `local` itself for
    `in-process` (and under `auto` when llama-server is not installed, or a llama-cpp-python
    chat format is named, which llama-server does not know), else a LocalServerBackend
    (`cache_ram_mib`: its RAM cache of prompt states)."""
    if serving not in SERVING_MODES:
        raise ValueError(f"unknown local serving {serving!r}; choose one of "
                         f"{', '.join(SERVING_MODES)}")
    if serving == "in-process" or (serving == "auto" and (
            server_binary() is None or getattr(local, "chat_format", None))):
        return local
    return LocalServerBackend(local, slots=slots, timeout=timeout, cache_ram_mib=cache_ram_mib)
