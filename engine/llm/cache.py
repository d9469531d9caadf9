"""Content-addressed reply cache, stored in the run-log DuckDB file (table llm_cache).

Keys are `LLMRequest.cache_key()`: a SHA-256 of the whole request, stable across
processes. The cache is loaded once when a run opens and new entries are written with
each step's transaction, so a call never opens the database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from engine.llm.base import LLMReply, LLMRequest

MODES = ("off", "read", "readwrite")


@dataclass
class Cache:
    mode: str = "readwrite"
    entries: dict[str, LLMReply] = field(default_factory=dict)
    pending: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"cache mode must be one of {', '.join(MODES)}, not {self.mode!r}")

    def get(self, key: str) -> LLMReply | None:
        """The stored reply for `key` (an `LLMRequest.cache_key()`), unless the cache is off."""
        if self.mode == "off":
            return None
        return self.entries.get(key)

    def put(self, key: str, request: LLMRequest, reply: LLMReply) -> None:
        if self.mode != "readwrite":
            return
        if key in self.entries:
            return
        self.entries[key] = reply
        self.pending.append({
            "key": key,
            "backend": request.backend,
            "model": request.model,
            "request": request.messages_json(),
            "response": reply.text,
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "created_at": time.time(),
        })

    def drain(self) -> list[dict]:
        rows, self.pending = self.pending, []
        return rows
