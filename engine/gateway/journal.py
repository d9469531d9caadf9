"""How the gateway keeps each call it answers: a journal first, the run log soon after.

A call's span is appended to a journal file beside the run log before the reply goes out
(one line of JSON, written to the operating system at once: a gateway that is killed or
restarted has lost no call it answered), and a writer thread moves what the journal holds
into the run log's `collected_spans` in batches, one transaction each, emptying the
journal once all of it is in. A gateway that starts on a run log whose journal is not
empty writes those spans first. The journal is not synced to the disk on every line: a
machine that loses power may lose the last calls, as their replies may never have arrived.

`flush()` waits until every span recorded so far is in the run log (before this process
reads them back).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
from pathlib import Path
from typing import Any

from engine.runlog.collected import SpanStore
from engine.runlog.lake import is_lake


def journal_path(db: str | Path) -> Path:
    """The journal of the gateway on `db`: beside the file, or for a lake in the temporary
    folder, named by its address."""
    if is_lake(str(db)):
        digest = hashlib.sha256(str(db).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"semback-gateway-{digest}.journal"
    return Path(f"{db}.gateway-journal")


class Journal:
    def __init__(self, store: SpanStore, path: Path, log: Any = print) -> None:
        self.store, self.path, self.log = store, path, log
        self._lock = threading.Condition()
        self._pending: list[tuple] = []  # journaled, not yet in the run log
        self._writing = 0  # rows being written now
        self._stop = False
        left = self._read_left()
        if left:  # a gateway stopped before writing these: they go in first
            store.store(left)  # the run log keeps one copy of each span
            log(f"wrote {len(left)} call(s) a gateway before this one had answered")
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - held until close
        self._thread = threading.Thread(target=self._run, name="gateway-journal",
                                        daemon=True)
        self._thread.start()

    def _read_left(self) -> list[tuple]:
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(tuple(json.loads(line)))
            except json.JSONDecodeError:
                continue  # a line cut short when the process died: its reply never went
        return rows

    def record(self, row: tuple) -> None:
        """Keep `row` (a span in engine.runlog.collected's ROW order) before the reply."""
        line = json.dumps(row, ensure_ascii=False) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self._pending.append(row)
            self._lock.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._stop:
                    self._lock.wait()
                if not self._pending and self._stop:
                    return
                batch, self._pending = self._pending, []
                self._writing = len(batch)
            try:
                self.store.append(batch)
            except Exception as exc:  # noqa: BLE001 - kept in the journal, tried again
                self.log(f"could not write {len(batch)} span(s) to the run log yet: {exc}")
                with self._lock:
                    self._pending[:0] = batch
                    self._writing = 0
                    self._lock.wait(1.0)
                continue
            with self._lock:
                self._writing = 0
                if not self._pending:  # all of it is in the run log
                    self._file.seek(0)
                    self._file.truncate()
                self._lock.notify_all()

    def flush(self, timeout: float = 60.0) -> None:
        with self._lock:
            self._lock.wait_for(lambda: not self._pending and not self._writing, timeout)

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        self._thread.join(30)
        self._file.close()
        with self._lock:
            if not self._pending and self.path.exists() and self.path.stat().st_size == 0:
                self.path.unlink()
