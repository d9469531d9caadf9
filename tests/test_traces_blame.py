"""benchmarks/traces_blame.py, the walkthrough of docs/traces.md end to end (trace, import,
backprop, blame), run against the scripted server: its logic, and the sizing that makes it
feasible on an embedded model on two cores. The embedded model's own run prints figures,
never asserted here."""

from __future__ import annotations

import json
import threading
import time

import duckdb

from benchmarks.traces_blame import RUN_ID, main
from tests.support.fake_openai import FakeOpenAIServer
from tests.support.traced_pipeline import REWRITE, responder


class Counting:
    """The pipeline's responder, a little slow, counting the requests it answers at once."""

    def __init__(self) -> None:
        self.lock, self.now, self.peak = threading.Lock(), 0, 0

    def __call__(self, body: dict) -> str:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(0.01)
            return responder(body)
        finally:
            with self.lock:
                self.now -= 1


def test_the_walkthrough_prints_the_verdict_with_intervals_and_stays_small(tmp_path, capsys):
    model = Counting()
    with FakeOpenAIServer(responder=model) as server:
        code = main(["--base-url", server.base_url, "--sentences", "6", "--slots", "2",
                     "--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    # adaptive blame: after a round of 4 of the 6 examples numbers is clear of the others
    assert "  numbers  flips 4/4  90% [0.60, 1.00]  leaks 0  errors 0" in lines
    assert "  who      flips 0/4  90% [0.00, 0.40]  leaks 0  errors 0" in lines
    assert "  total    flips 0/4  90% [0.00, 0.40]  leaks 0  errors 0" in lines
    assert "adaptive: 12 of 24 planned probes made (--exhaustive makes all)" in lines
    assert any(line.startswith("verdict: blames numbers (right): ") for line in lines)
    assert any(line.startswith("traced 6 runs of the pipeline (18 calls) in ") for line in lines)
    assert ("imported 6 traces: calls who, numbers, total; flows numbers -> total, who -> "
            "total; 6 scored, 6 failing; 0 ambiguous flows") in lines
    # sized for a slow local server: no more calls in flight than its slots; forward calls
    # (the pipeline's and every re-run) ask for the pipeline's own 64 tokens, backward,
    # rewrite and update calls for --optimizer-max-tokens
    assert model.peak <= 2
    optimizer = [r for r in server.requests
                 if "response_format" in r or REWRITE in r["messages"][-1]["content"]]
    forward = [r for r in server.requests if r not in optimizer]
    assert len(forward) > 18 and {r["max_tokens"] for r in forward} == {64}
    assert optimizer and {r["max_tokens"] for r in optimizer} == {256}
    with duckdb.connect(str(tmp_path / "traces.duckdb"), read_only=True) as con:
        config = json.loads(con.execute("SELECT config FROM runs WHERE run_id = ?",
                                        [RUN_ID]).fetchone()[0])
    assert (config["concurrency"], config["timeout"], config["max_tokens"],
            config["optimizer_max_tokens"]) == (2, 600.0, 64, 256)


def four_sentences(model, folder) -> int:
    """The walkthrough on 4 sentences against the scripted server answering with `model`."""
    with FakeOpenAIServer(responder=model) as server:
        return main(["--base-url", server.base_url, "--sentences", "4", "--dir", str(folder)])


def test_a_wrong_verdict_exits_1(tmp_path, capsys):
    """The script's status says whether blame named the call at fault: here every call's
    rewrite is made useless, so no node is named."""

    def useless(body: dict) -> str:
        if REWRITE in body["messages"][-1]["content"]:
            return "<output>It is about a person.</output>"
        return responder(body)

    code = four_sentences(useless, tmp_path)
    out = capsys.readouterr().out
    assert code == 1
    assert any(line.startswith("verdict: no node (the fault is numbers): ")
               for line in out.splitlines())


def test_without_llama_server_it_says_so_in_one_line(tmp_path, capsys, monkeypatch):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("SEMBACK_LLAMA_SERVER", str(tmp_path / "no-such-server"))
    assert main(["--model", str(model), "--dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: llama-server is not installed") and err.count("\n") == 1


def test_traces_the_importer_refuses_end_in_one_line(tmp_path, capsys):
    """A model whose `numbers` call echoes the sentence (as the 0.5B does, asked a task it
    ignores): its reply is the pipeline's input too, so no flow from it can be read and
    the import is refused. The walkthrough says why in one `error:` line, status 2."""

    def echoing(body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("Numbers:"):
            return user.removeprefix("Text: ")
        return responder(body)

    code = four_sentences(echoing, tmp_path)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: the calls numbers, total feed no later call") and \
        err.count("\n") == 1, err
