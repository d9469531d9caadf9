"""`python -m engine models serve`: an embedded model served, OpenAI-compatible, on a
fixed port of 127.0.0.1 until Ctrl-C (the walkthrough's model server, docs/traces.md), on
the stand-in for llama-server (tests/support/fake_llama_server.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import openai

REPO = Path(__file__).resolve().parents[1]
FAKE = REPO / "tests" / "support" / "fake_llama_server.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serves_a_model_file_on_the_port_it_is_given_until_ctrl_c(tmp_path):
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    binary.chmod(0o755)
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(60))
    port = free_port()
    env = {**os.environ, "SEMBACK_LLAMA_SERVER": str(binary),
           "FAKE_LLAMA_LOG": str(tmp_path / "fake.jsonl")}
    proc = subprocess.Popen([sys.executable, "-m", "engine", "models", "serve", str(model),
                             "--port", str(port), "--slots", "2"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith(f"serving model.gguf on http://127.0.0.1:{port}/v1"), \
            first + proc.stderr.read() if proc.poll() is not None else first
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x")
        reply = client.chat.completions.create(model="any", messages=[
            {"role": "user", "content": "Say something."}])
        assert reply.choices[0].message.content
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    with socket.socket() as s:  # the server went with it
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert "--parallel" in (tmp_path / "fake.jsonl").read_text()


def test_a_model_that_cannot_be_served_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "engine", "models", "serve",
                           str(tmp_path / "missing.gguf")], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.startswith("error:") and done.stderr.count("\n") == 1
    assert "Traceback" not in done.stderr
