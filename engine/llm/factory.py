"""Build a backend from its kind name ("scripted", "local", "openai"). Each backend's
module is imported only when that kind is asked for, so a missing optional package
only matters to the runs that use it."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from engine.llm.base import DEFAULT_TIMEOUT, LOCAL_TIMEOUT, Backend
from engine.llm.models import DEFAULT_MODEL

BACKENDS: tuple[str, ...] = ("scripted", "local", "openai")

_DEFAULT_MODELS = {
    "openai": "gpt-4o-mini",
    "local": DEFAULT_MODEL,
    "scripted": "scripted",
}


def call_timeout(kind: str, timeout: float | None) -> float:
    """Seconds a call of a `kind` backend may take: `timeout` when given, else 120 s for a
    provider and 600 s for the embedded model (counted from when the model starts on it)."""
    if timeout is not None:
        return timeout
    return LOCAL_TIMEOUT if kind == "local" else DEFAULT_TIMEOUT


def make_backend(kind: str, *, base_url: str | None = None, api_key: str | None = None,
                 timeout: float | None = None,
                 scripted_options: dict[str, Any] | None = None, model: str | None = None,
                 chat_format: str | None = None, contexts: int | None = None,
                 serving: str = "auto", for_optimizer: bool = False) -> Backend:
    """A new backend of `kind`; raises LLMError when it cannot be set up (no key, a
    missing package, a local model file that is not a GGUF model) and ValueError for an
    unknown kind. `timeout`: seconds per call (`call_timeout`). For "local", `model` is a
    named model (engine/llm/models.py) or a GGUF file's path (default: the default named
    model),
    `chat_format` overrides the file's chat template and `contexts` caps the llama contexts
    serving calls at once (llama contexts in-process, llama-server's slots when served);
    `serving` is "server" (llama-server, engine/llm/server.py), "in-process"
    (llama-cpp-python) or "auto" (the server when its binary is installed);
    `for_optimizer` serves a model that writes only the optimizer's calls (no RAM cache of
    prompt states, engine/llm/server.py)."""
    if kind == "openai":
        from engine.llm.openai_backend import OpenAIBackend

        return OpenAIBackend(base_url=base_url, api_key=api_key,
                             timeout=call_timeout(kind, timeout))
    if kind == "local":
        from engine.llm.local import LocalBackend
        from engine.llm.server import CACHE_RAM_MIB, OPTIMIZER_CACHE_RAM_MIB, served

        local = LocalBackend(model=model or None, chat_format=chat_format, contexts=contexts)
        return served(local, serving, slots=contexts, timeout=call_timeout(kind, timeout),
                      cache_ram_mib=OPTIMIZER_CACHE_RAM_MIB if for_optimizer else CACHE_RAM_MIB)
    if kind == "scripted":
        from engine.llm.scripted import ScriptedBackend

        return ScriptedBackend(**(scripted_options or {}))
    raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")


def default_backend_kind(env: Mapping[str, str] = os.environ) -> str:
    """"openai" when OPENAI_API_KEY or OPENAI_BASE_URL is set, else the embedded "local"."""
    return "openai" if env.get("OPENAI_API_KEY") or env.get("OPENAI_BASE_URL") else "local"


def default_model(kind: str) -> str:
    if kind not in _DEFAULT_MODELS:
        raise ValueError(f"unknown backend {kind!r}; choose one of {', '.join(BACKENDS)}")
    return _DEFAULT_MODELS[kind]
