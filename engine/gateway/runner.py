"""The runner: calls the user's pipeline once per example, through the gateway.

A pipeline is one of
- `--pipeline MODULE:FUNCTION` (or FILE.py:FUNCTION): called with an example's input
  fields as keyword arguments, returning its output, sync or async. It runs in worker
  processes (engine/gateway/worker.py), each importing it once, with `OPENAI_BASE_URL`
  (and `OPENAI_API_BASE`, which LiteLLM and so DSPy read) set to the worker's own route
  on the gateway; before each example the runner points that route at the example's
  session and candidate;
- `--command "CMD"`: a shell command, started per example, that reads one JSON example on
  stdin and writes its output on stdout; its base URL is the example's own.

At most `concurrency` examples run at once, each for at most `timeout` seconds (a worker
that runs over is killed and replaced); the user's environment is passed through. A
pipeline that raises, exits non-zero or times out gives an example error with its
exception line, never an output.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.gateway.server import PLACEHOLDER_KEY, Gateway, Route

START_TIMEOUT = 120.0  # seconds a worker may take to import the pipeline


@dataclass(frozen=True)
class PipelineSpec:
    pipeline: str | None = None  # MODULE:FUNCTION
    command: str | None = None
    cwd: str = "."

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in (("pipeline", self.pipeline), ("command", self.command),
                                  ("cwd", self.cwd)) if v}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PipelineSpec:
        return cls(data.get("pipeline"), data.get("command"), data.get("cwd") or ".")

    @property
    def label(self) -> str:
        return self.pipeline or f"command {self.command!r}"


@dataclass
class Outcome:
    output: str | None
    error: str | None = None


class PipelineError(ValueError):
    """The pipeline cannot run at all (its module does not import): one line."""


def environment(base_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env["OPENAI_BASE_URL"] = env["OPENAI_API_BASE"] = base_url
    env.setdefault("OPENAI_API_KEY", PLACEHOLDER_KEY)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Worker:
    def __init__(self, name: str) -> None:
        self.name = name
        self.process: asyncio.subprocess.Process | None = None
        self.stderr: Any = None

    async def start(self, spec: PipelineSpec, base_url: str) -> None:
        import tempfile

        self.stderr = tempfile.TemporaryFile()
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engine.gateway.worker", str(spec.pipeline),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=self.stderr, cwd=spec.cwd, env={**environment(base_url),
                                                  "PYTHONPATH": _pythonpath(spec.cwd)},
            limit=64 * 2**20)
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), START_TIMEOUT)
        except TimeoutError:
            self.kill()
            raise PipelineError(f"{spec.label}: did not import within {START_TIMEOUT:.0f} s"
                                ) from None
        reply = json.loads(line) if line.strip() else {"error": self.last_error() or
                                                       "the worker exited"}
        if not reply.get("ready"):
            self.kill()
            raise PipelineError(f"{spec.label}: {reply.get('error')}")

    def last_error(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        lines = [x for x in self.stderr.read()[-4000:].decode("utf-8", "replace").splitlines()
                 if x.strip()]
        return lines[-1].strip() if lines else ""

    def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
        self.process = None


def _pythonpath(cwd: str) -> str:
    here = str(Path(__file__).resolve().parents[2])  # the engine's own checkout
    parts = [here, str(Path(cwd).resolve()), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


class Runner:
    """Runs a pipeline per example through `gateway`. Use `async with` or call aclose()."""

    def __init__(self, gateway: Gateway, spec: PipelineSpec, *, concurrency: int = 4,
                 timeout: float = 120.0) -> None:
        if not spec.pipeline and not spec.command:
            raise PipelineError("give --pipeline MODULE:FUNCTION or --command CMD")
        self.gateway, self.spec = gateway, spec
        self.concurrency, self.timeout = max(1, concurrency), timeout
        self._slots = asyncio.Semaphore(self.concurrency)
        self._idle: deque[_Worker] = deque()
        self._count = 0

    async def __aenter__(self) -> Runner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        while self._idle:
            worker = self._idle.popleft()
            if worker.process is not None and worker.process.returncode is None:
                worker.process.stdin.close()
                try:
                    await asyncio.wait_for(worker.process.wait(), 5)
                except TimeoutError:
                    worker.kill()
            self.gateway.workers.pop(worker.name, None)

    def session_url(self, session: str, candidate: str | None) -> str:
        prefix = f"/c/{candidate}" if candidate else ""
        return f"{self.gateway.url}{prefix}/s/{session}/v1"

    async def run(self, fields: dict[str, Any], session: str,
                  candidate: str | None = None) -> Outcome:
        self.gateway.expect(session, fields)
        async with self._slots:
            if self.spec.command:
                return await self._command(fields, session, candidate)
            return await self._in_worker(fields, session, candidate)

    async def _in_worker(self, fields: dict[str, Any], session: str,
                         candidate: str | None) -> Outcome:
        worker = self._idle.popleft() if self._idle else None
        if worker is None:
            self._count += 1
            worker = _Worker(f"{os.getpid()}-{self._count}")
            self.gateway.workers[worker.name] = Route(None, None)
            await worker.start(self.spec, f"{self.gateway.url}/w/{worker.name}/v1")
        self.gateway.workers[worker.name] = Route(session, candidate)
        process = worker.process
        assert process is not None and process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write((json.dumps({"id": session, "fields": fields},
                                            ensure_ascii=False) + "\n").encode())
            await process.stdin.drain()
            line = await asyncio.wait_for(process.stdout.readline(), self.timeout)
        except TimeoutError:
            worker.kill()
            self.gateway.workers.pop(worker.name, None)
            return Outcome(None, f"the pipeline timed out after {self.timeout:g} s")
        except (ConnectionError, BrokenPipeError):
            line = b""
        if not line.strip():
            why = worker.last_error() or "the worker exited"
            worker.kill()
            self.gateway.workers.pop(worker.name, None)
            return Outcome(None, f"the pipeline's process died: {why}")
        self._idle.append(worker)
        reply = json.loads(line)
        return Outcome(reply.get("output"), reply.get("error"))

    async def _command(self, fields: dict[str, Any], session: str,
                       candidate: str | None) -> Outcome:
        import tempfile

        with tempfile.TemporaryFile() as err:
            process = await asyncio.create_subprocess_shell(
                str(self.spec.command), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=err, cwd=self.spec.cwd,
                env=environment(self.session_url(session, candidate)))
            try:
                out, _ = await asyncio.wait_for(process.communicate(
                    json.dumps(fields, ensure_ascii=False).encode()), self.timeout)
            except TimeoutError:
                process.kill()
                await process.wait()
                return Outcome(None, f"the command timed out after {self.timeout:g} s")
            if process.returncode:
                err.seek(0)
                lines = [x for x in err.read()[-4000:].decode("utf-8", "replace").splitlines()
                         if x.strip()]
                return Outcome(None, f"the command exited with status {process.returncode}"
                                     + (f": {lines[-1].strip()}" if lines else ""))
        return Outcome(out.decode("utf-8", "replace").strip())
