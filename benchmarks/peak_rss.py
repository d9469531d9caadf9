"""Peak resident memory of this process and its children together (a llama-server child
included), sampled from /proc while a block runs::

    with PeakRSS() as rss:
        ...
    print(rss.describe())

getrusage's ru_maxrss only gives the largest single process (and a child's only once it
is reaped), so it would miss the sum of the engine and its server running side by side.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def _parents() -> dict[int, int]:
    """Every process's parent, from /proc/*/stat."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def tree_rss(pid: int | None = None) -> int:
    """Resident bytes of `pid` (default: this process) and all its descendants now."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    todo, total = [pid or os.getpid()], 0
    while todo:
        current = todo.pop()
        total += _rss_bytes(current)
        todo += children.get(current, [])
    return total


class PeakRSS:
    """The largest `tree_rss()` seen, sampled every `interval` seconds."""

    def __init__(self, interval: float = 0.1):
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, tree_rss())
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def describe(self) -> str:
        return f"peak RSS (this process and its children) {self.peak / 2**30:.2f} GiB"
