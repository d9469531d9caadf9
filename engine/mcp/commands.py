"""The engine's own commands as child processes, for the MCP tools: `python -m engine
COMMAND ... --json` run with asyncio (the server's event loop never blocks), its standard
output parsed as JSON, its progress lines on standard error forwarded as they arrive, and
its one `error:` line made the tool's error. A cancelled call stops the child (and anything
it started) before the cancellation goes on."""

from __future__ import annotations

import asyncio
import codecs
import json
import os
import re
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

# "probes 12/36 done, about 2 s left" (blame), "step 1 gate: 144/144 calls" (run): done/total
PROGRESS = re.compile(r"(\d+)/(\d+)")
LINE_END = re.compile(r"[\r\n]")
# seconds a stopped child gets to exit on SIGTERM before SIGKILL
GRACE_S = 3.0
# standard-error lines kept for the error message (a long run prints many progress lines)
KEPT_LINES = 200

Progress = Callable[[int, int, str], Awaitable[None]]


class CommandError(Exception):
    """The command refused or failed; the message is one line (the command's own `error:`
    line where it printed one), never a traceback."""


@dataclass
class Finished:
    """A child that exited: its status, its standard output, its last standard-error lines."""

    returncode: int
    stdout: str
    stderr_lines: list[str]


def engine_argv(command: str, *args: str) -> list[str]:
    """The command line of `python -m engine COMMAND ARGS` on this interpreter."""
    return [sys.executable, "-m", "engine", command, *args]


async def run_json(argv: list[str], progress: Progress | None = None) -> Any:
    """Run `argv` (an engine command printing JSON) and return its parsed output; raise
    CommandError with its one-line error when it fails or prints no JSON."""
    done = await run_command(argv, progress)
    if done.returncode != 0:
        raise CommandError(failure_line(done, argv))
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise CommandError(f"error: {command_name(argv)} printed no JSON") from None


async def run_command(argv: list[str], progress: Progress | None = None) -> Finished:
    """Run `argv` to the end, reading both pipes as they fill (a child never blocks on a
    full pipe); `progress(done, total, line)` gets each new done/total line of its standard
    error. When the caller is cancelled (or the progress callback fails), the child and its
    process group are stopped first."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [asyncio.ensure_future(proc.stdout.read()),
               asyncio.ensure_future(follow_stderr(proc.stderr, progress))]
    try:
        out, lines = await asyncio.gather(*readers)
        code = await proc.wait()
    except BaseException:
        for reader in readers:
            reader.cancel()
        await stop(proc)
        raise
    return Finished(code, out.decode("utf-8", "replace"), lines)


async def follow_stderr(stream: asyncio.StreamReader, progress: Progress | None
                        ) -> list[str]:
    """The stream's lines (ended by \\r or \\n: a progress bar rewrites its line), the last
    KEPT_LINES of them; each line carrying done/total is passed to `progress` when its done
    count has grown (MCP progress must increase)."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    kept: deque[str] = deque(maxlen=KEPT_LINES)
    buffer, reported = "", -1
    while True:
        chunk = await stream.read(4096)
        buffer += decoder.decode(chunk, final=not chunk)
        *complete, buffer = LINE_END.split(buffer)
        if not chunk and buffer:
            complete.append(buffer)
        for line in (ln.strip() for ln in complete):
            if not line:
                continue
            kept.append(line)
            counts = progress_counts(line)
            if progress and counts and counts[0] > reported:
                reported = counts[0]
                await progress(counts[0], counts[1], line)
        if not chunk:
            return list(kept)


def progress_counts(line: str) -> tuple[int, int] | None:
    """(done, total) of a progress line, None for any other line."""
    found = PROGRESS.search(line)
    if not found:
        return None
    done, total = int(found.group(1)), int(found.group(2))
    return (done, total) if 0 <= done <= total and total > 0 else None


async def stop(proc: asyncio.subprocess.Process) -> None:
    """Stop the child's process group: SIGTERM, then SIGKILL after GRACE_S. Shielded, so a
    cancelled caller still waits for the child to be gone."""
    with anyio.CancelScope(shield=True):
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.returncode is not None:
                return
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
            with anyio.move_on_after(GRACE_S):
                await proc.wait()


def failure_line(done: Finished, argv: list[str]) -> str:
    """The command's last `error:` line, else one line saying how it ended."""
    errors = [line for line in done.stderr_lines if line.startswith("error:")]
    if errors:
        return errors[-1]
    how = (f"was stopped by signal {-done.returncode}" if done.returncode < 0
           else f"exited with status {done.returncode}")
    last = done.stderr_lines[-1] if done.stderr_lines else ""
    return f"error: {command_name(argv)} {how}" + (f" ({last})" if last else "")


def command_name(argv: list[str]) -> str:
    """`python -m engine blame`, as a message names the command."""
    words = argv[argv.index("engine") + 1:] if "engine" in argv else argv[-1:]
    return "python -m engine " + (words[0] if words else "")
