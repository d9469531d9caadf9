"""The walkthrough of docs/traces.md end to end: trace the example pipeline against a model,
import the traces, back-propagate, blame. Prints blame's verdict with its intervals.

    python benchmarks/traces_blame.py [--model qwen2.5-coder-0.5b] [--sentences 12]
                                      [--val N] [--proposals N] [--dir DIR]
                                      [--base-url URL]

`sample_graphs/traced_pipeline.py` (three `openai` SDK calls; `numbers`'s prompt is
plainly at fault) runs on the first `--sentences` sentences against llama.cpp's
`llama-server` serving the embedded model (started here on 127.0.0.1, `--slots` parallel
slots, stopped at the end; `--base-url` uses a server that is already running instead).
Then, as the commands of docs/traces.md do:

    python -m engine import-traces traces.jsonl --db traces.duckdb --targets targets.jsonl \\
        --metric numeric --base-url URL --concurrency 4 --timeout 600 \\
        --optimizer-max-tokens 256 [--val N]
    python -m engine backprop RUN_ID --db traces.duckdb [--proposals N]
    python -m engine blame RUN_ID --db traces.duckdb [--examples val]

With `--val N` the last N traces are held out as the validation split: backprop
back-propagates the others and gates its proposals on these, and blame probes these, so
that each proposed edit is tested on traces its update call never saw. With `--proposals N`
(it needs `--val`) backprop draws N candidate prompt sets and keeps the best on them, and
blame tests the best candidate's edits.

Sized for two cores: each forward call asks for at most the pipeline's own 64 tokens (the
imported run keeps the limit its spans recorded), backward, rewrite and update calls for
`--optimizer-max-tokens`, and no more calls are in flight than the server has slots (a
queue longer than that waits past the timeout and is retried). With every failing trace
probed, blame needs about 5 of 8 (6 of 10) flips for `numbers` against none for the others
before its 90% interval clears theirs (docs/probes.md): 12 sentences leave 8 to 12 failing
traces. Every phase prints its seconds; the run log stays in `--dir` (default: a new
temporary folder) for the dashboard (`SEMBACK_DB=DIR/traces.duckdb`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from engine.probes.blame import blame  # noqa: E402
from engine.runlog.traces import failing_count  # noqa: E402
from engine.runs.settings import positive_int  # noqa: E402
from engine.traces.backprop import backprop  # noqa: E402
from engine.traces.importer import import_traces  # noqa: E402

RUN_ID = "traces-blame"
# --pipeline: the sample pipeline's script, the call whose prompt is at fault, the metric
PIPELINES = {"openai": ("traced_pipeline", "numbers", "numeric"),
             "dspy": ("dspy_pipeline", "note_sentence", "numeric")}
FAULTY = "numbers"  # the call whose prompt is at fault (sample_graphs/traced_pipeline.py)


def load_pipeline(name: str = "traced_pipeline") -> Any:
    spec = importlib.util.spec_from_file_location(name, REPO / "sample_graphs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def embedded_server(model: str, slots: int) -> Iterator[str]:
    """llama-server serving the named embedded model (or a GGUF path) on 127.0.0.1."""
    from engine.llm.models import resolve_model
    from engine.llm.server import LlamaServer

    with LlamaServer(resolve_model(model).path, slots=slots) as server:
        yield server.base_url


def walkthrough(base_url: str, folder: Path, *, model: str, sentences: int,
                concurrency: int, timeout: float, optimizer_max_tokens: int,
                optimizer_model: str | None = None, val: int = 0,
                proposals: int | None = None, say: Callable[[str], None] = print,
                pipeline: str = "openai") -> Any:
    """Trace, import, back-propagate and blame; returns blame's report."""
    folder.mkdir(parents=True, exist_ok=True)
    traces, targets, db = (folder / "traces.jsonl", folder / "targets.jsonl",
                           folder / "traces.duckdb")
    for stale in (traces, targets, db):  # the pipeline appends its spans to the file
        stale.unlink(missing_ok=True)
    clock = time.perf_counter()

    def lap(what: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        say(f"{what} in {now - clock:.0f} s")
        clock = now

    script, _, metric = PIPELINES[pipeline]
    answers = load_pipeline(script).run(base_url, model, traces, sentences, targets)
    lap(f"traced {len(answers)} runs of the pipeline ({3 * len(answers)} calls)")
    imported = import_traces(traces, db, targets=targets, metric=metric, base_url=base_url,
                             run_id=RUN_ID, concurrency=concurrency, timeout=timeout,
                             optimizer_max_tokens=optimizer_max_tokens, val=val)
    p = imported.pipeline
    say(f"imported {len(p.traces)} traces: calls {', '.join(p.nodes)}; flows "
        f"{', '.join(f'{a} -> {b}' for a, b in p.edges)}; {imported.scored} scored"
        f"{f' ({imported.val} held out for validation)' if imported.val else ''}, "
        f"{imported.failing} failing; {len(p.ambiguous)} ambiguous flows")
    lap("imported")
    failing = failing_count(str(db), RUN_ID, 0)  # what backprop back-propagates
    if failing == 0:
        raise SystemExit("error: every training trace passed: nothing to back-propagate "
                         "(more --sentences, or a smaller --val?)")
    # the optimizer's calls (gradients, rewrites, edits) on an embedded model of their own
    # when one is named: what a user does whose pipeline runs a small model
    result = asyncio.run(backprop(str(db), RUN_ID, proposals=proposals, **({
        "optimizer_backend_kind": "local", "optimizer_model": optimizer_model}
        if optimizer_model else {})))
    if result.status != "finished":
        raise SystemExit(f"error: backprop {result.status}: {result.reason}")
    lap(f"back-propagated {failing} failing training traces")
    report = asyncio.run(blame(str(db), RUN_ID, examples="val" if val else "failing"))
    lap(f"blame ({report.model_calls} calls reached the model, {report.tokens} tokens)")
    return report


def verdict_lines(report: Any, faulty: str = FAULTY) -> list[str]:
    """One line per call (gradient flips over counted probes, the 90% interval), then the
    verdict and whether it names the call at fault."""
    lines = []
    for row in report.nodes:
        low, high = row.interval
        lines.append(f"  {row.node_id:<8} flips {row.flips}/{row.counted}  90% [{low:.2f}, "
                     f"{high:.2f}]  leaks {row.leaks}  errors {row.errors}")
    node = report.verdict.node
    lines.append(f"verdict: {'blames ' + node if node else 'no node'} "
                 f"({'right' if node == faulty else 'the fault is ' + faulty}): "
                 f"{report.verdict.reason}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b",
                        help="an embedded model's name or a GGUF file (default: "
                             "qwen2.5-coder-0.5b)")
    parser.add_argument("--base-url", help="an OpenAI-compatible server already running "
                                           "(default: start llama-server with --model)")
    parser.add_argument("--optimizer-model", default="auto",
                        help="the embedded model of the gradient, rewrite and update calls: "
                             "a name or a GGUF file, 'auto' (without --base-url: the model --model "
                             "pairs with, qwen2.5-coder-1.5b for the 0.5B, when installed) or "
                             "'same' (the server of the pipeline's calls)")
    parser.add_argument("--sentences", type=int, default=12,
                        help="pipeline runs, one trace each (default: 12)")
    parser.add_argument("--val", type=int, default=0,
                        help="of the traces, hold out the last N as validation; blame then "
                             "probes those (--examples val) (default: 0)")
    parser.add_argument("--proposals", type=positive_int, default=None,
                        help="candidate prompt sets backprop draws, the best on the held-out "
                             "traces kept (needs --val; default: 1)")
    parser.add_argument("--slots", type=int, default=4,
                        help="llama-server's parallel slots, and the calls in flight")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per call")
    parser.add_argument("--optimizer-max-tokens", type=int, default=256,
                        help="limit of backward, rewrite and update replies (default: 256)")
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="openai",
                        help="openai: sample_graphs/traced_pipeline.py (default); dspy: "
                             "sample_graphs/dspy_pipeline.py, a DSPy program traced by its "
                             "OpenInference instrumentor")
    parser.add_argument("--dir", help="where the traces and the run log go (default: a new "
                                      "temporary folder, kept)")
    args = parser.parse_args(argv)
    if args.proposals is not None and args.proposals > 1 and not args.val:
        parser.error("--proposals needs --val: the candidates are chosen on held-out traces")
    from engine.llm.base import LLMError
    from engine.traces import TraceError

    folder = Path(args.dir or tempfile.mkdtemp(prefix="traces-blame-"))
    started = time.perf_counter()
    try:
        with (contextlib.nullcontext(args.base_url) if args.base_url
              else embedded_server(args.model, args.slots)) as base_url:
            print(f"model {args.model} at {base_url}; run log {folder / 'traces.duckdb'}")
            optimizer = args.optimizer_model
            if optimizer == "auto" and args.base_url:  # the given server answers all
                optimizer = None
            elif optimizer == "auto":
                from engine.llm.models import paired_optimizer

                optimizer = paired_optimizer(args.model)[0]
            optimizer = None if optimizer in (None, "same") else optimizer
            print(f"optimizer: {optimizer or args.model + ' (the same server)'}")
            report = walkthrough(base_url, folder, model=args.model,
                                 optimizer_model=optimizer,
                                 sentences=args.sentences, concurrency=args.slots,
                                 val=args.val, proposals=args.proposals,
                                 timeout=args.timeout, pipeline=args.pipeline,
                                 optimizer_max_tokens=args.optimizer_max_tokens)
    except (LLMError, TraceError) as exc:  # no model file, no llama-server, a server
        # that will not start; traces the importer refuses (the model's replies made no
        # readable flow)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from engine.cli.probes import blame_lines
    from engine.console import out

    for line in blame_lines(report, out):  # the tables `python -m engine blame` prints
        out.print(line, markup=False, highlight=False)
    print("gradient probes per call (flips over counted probes; leaks never count):")
    faulty = PIPELINES[args.pipeline][1]
    for line in verdict_lines(report, faulty):
        print(line)
    print(f"total {time.perf_counter() - started:.0f} s; the run: python -m engine blame "
          f"{RUN_ID} --db {folder / 'traces.duckdb'}")
    return 0 if report.verdict.node == faulty else 1


if __name__ == "__main__":
    sys.exit(main())
