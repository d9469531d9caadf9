"""A stand-in for llama.cpp's `llama-server`, for the tests of engine/llm/server.py on
machines without the real binary: it takes the same flags, binds --host:--port, answers
GET /health and POST /v1/chat/completions (the replies of tests/support/fake_openai.py),
reports prompt-prefix reuse as llama-server does (usage.prompt_tokens_details.cached_tokens,
counted in tokens of four characters), and appends its command line and each request body,
as JSON lines, to $FAKE_LLAMA_LOG.

$FAKE_LLAMA_MODE plays a failing server: `fail` prints llama-server's load error and exits
1; `never-ready` answers /health with 503 for ever; `crash` is healthy but dies of SIGSEGV
on its first completion, half a second after dropping the connection (as a build for
instructions a VM does not allow).
$FAKE_LLAMA_LATENCY (seconds) delays each completion, as a busy model's work does.

    tests/support/fake_llama_server.py --model M.gguf --host 127.0.0.1 --port 8080 ...
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.fake_openai import default_responder  # noqa: E402

LOG = os.environ.get("FAKE_LLAMA_LOG")
MODE = os.environ.get("FAKE_LLAMA_MODE", "")
LATENCY = float(os.environ.get("FAKE_LLAMA_LATENCY", "0"))
_lock = threading.Lock()
_prompts: list[str] = []


def log(entry: dict) -> None:
    if LOG:
        with _lock, open(LOG, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")


def cached_tokens(prompt: str) -> int:
    with _lock:
        best = max((len(os.path.commonprefix([prompt, seen])) for seen in _prompts), default=0)
        _prompts.append(prompt)
    return best // 4


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health" and MODE != "never-ready":
            self.reply(200, {"status": "ok"})
        else:
            self.reply(503, {"error": {"code": 503, "message": "Loading model"}})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log({"request": body})
        if MODE == "crash":
            print("ggml: about to compute the first batch", flush=True)
            # the client sees its connection drop a moment before the process ends (a real
            # server's crash handler first prints a backtrace)
            self.connection.shutdown(socket.SHUT_RDWR)
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGSEGV)
        prompt = "".join(m["content"] for m in body["messages"])
        text = default_responder(body)
        time.sleep(LATENCY)
        self.reply(200, {
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
            "model": body.get("model", ""),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(text) // 4,
                      "total_tokens": (len(prompt) + len(text)) // 4,
                      "prompt_tokens_details": {"cached_tokens": cached_tokens(prompt)}}})


def main() -> None:
    args = sys.argv[1:]
    log({"argv": args, "pid": os.getpid()})
    if MODE == "fail":
        print("llama_model_load: error loading model: tensor data is not within the file bounds",
              flush=True)
        print("main: exiting due to model loading error", flush=True)
        sys.exit(1)
    host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
    ThreadingHTTPServer((host, port), Handler).serve_forever()


if __name__ == "__main__":
    main()
