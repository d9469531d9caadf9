"""Results written to a file or a pipe keep every column whole; a terminal keeps its width."""

import io

from rich.console import Console
from rich.table import Table

from engine.console import WIDE, width_for


def wide_table() -> Table:
    table = Table(*[f"column-{i}" for i in range(9)])
    table.add_row(*[f"value-{i}" for i in range(9)])
    return table


def test_a_pipe_gets_room_for_every_column(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    stream = io.StringIO()
    assert width_for(stream) == WIDE
    Console(file=stream, width=width_for(stream)).print(wide_table())
    text = stream.getvalue()
    assert all(f"column-{i}" in text and f"value-{i}" in text for i in range(9))
    assert "…" not in text


def test_a_terminal_or_columns_keeps_its_own_width(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.delenv("COLUMNS", raising=False)
    assert width_for(Terminal()) is None
    monkeypatch.setenv("COLUMNS", "80")
    assert width_for(io.StringIO()) is None
