"""`python -m engine collect --db DB [--host 127.0.0.1] [--port 4318]`: a live OTLP/HTTP
receiver (engine/traces/collect.py). A pipeline's exporter sends it spans (with only
`OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318` set) and they land in the run log as they
arrive; `python -m engine import-traces --collected --db DB` makes a run of them.

It prints one line with its address and the run log, then a count of what arrived at most
every few seconds while spans arrive, one line per refused request, and a last count when
stopped (Ctrl-C or SIGTERM: the write in progress finishes; status 0). An address in use or
a file that is not a run log: one `error:` line, status 2.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

REPORT_EVERY = 5.0  # seconds between count lines while spans arrive
# engine.traces.collect's defaults, named here so that building the parser imports no receiver
DEFAULT_HOST, DEFAULT_PORT, PATH = "127.0.0.1", 4318, "/v1/traces"


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0-65535 (0: any free "
                                         f"port), not {text}")
    return value


def register_cli(sub: Any) -> None:
    p = sub.add_parser("collect", help="receive a running pipeline's OpenTelemetry spans "
                                       "(OTLP/HTTP) into a run log, for import-traces "
                                       "--collected")
    p.add_argument("--db", default="runs.duckdb",
                   help="the run log, a DuckDB file (default: runs.duckdb)")
    p.add_argument("--host", default=DEFAULT_HOST,
                   help=f"the address to listen on (default: {DEFAULT_HOST}, this machine "
                        "only; 0.0.0.0 takes spans from anywhere, unauthenticated)")
    p.add_argument("--port", type=port_number, default=DEFAULT_PORT,
                   help=f"the port (default: {DEFAULT_PORT}, OTLP/HTTP's; 0: any free one, "
                        f"printed); exporters POST to {PATH}")
    p.set_defaults(func=cmd_collect)


def cmd_collect(args: argparse.Namespace) -> int:
    from engine.traces.collect import Receiver

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    receiver = Receiver(args.db, args.host, args.port, log=log)
    print(f"collecting OTLP/HTTP spans on {receiver.url}{PATH} into {args.db} "
          f"(exporters: OTEL_EXPORTER_OTLP_ENDPOINT={receiver.url}); Ctrl-C stops",
          flush=True)
    receiver.start()
    serve_until_stopped(lambda: _count_line(receiver) if receiver.counts.spans
                        or receiver.counts.rejected else None, receiver.close)
    print(f"stopped: {_count_line(receiver)}", flush=True)
    return 0


def serve_until_stopped(report: Callable[[], str | None], close: Callable[[], None],
                        every: float = REPORT_EVERY) -> None:
    """Wait until Ctrl-C or SIGTERM (the work in progress finishes), printing `report()`
    with the time whenever it changed (None: nothing to say yet); then `close()`."""
    stop = threading.Event()
    try:
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    except ValueError:  # not the main thread (called from another program): Ctrl-C only
        previous = None
    reported = None
    try:
        while not stop.wait(every):
            line = report()
            if line is not None and line != reported:
                reported = line
                print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        close()


def _count_line(receiver: Any) -> str:
    c = receiver.counts
    repeats = c.spans - c.new
    parts = [f"{_plural(c.new, 'span')} stored from {_plural(c.requests, 'request')}"
             + (f" ({_plural(repeats, 'repeat')} not stored again)" if repeats else "")]
    if c.rejected:
        parts.append(f"{_plural(c.rejected, 'request')} refused")
    if c.dropped:
        parts.append(f"{_plural(c.dropped, 'span')} with bad ids left out")
    return "; ".join(parts)


def _plural(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"
