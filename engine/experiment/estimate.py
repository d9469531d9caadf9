"""The estimate shown before an experiment starts: an upper bound on each run's calls,
tokens and cost, per entry and in total, and the confirmation to go ahead. Each run's
figures are the `at most` ones of the estimate `run` prints for it (engine/runs/estimate.py),
its tokens from the prompts that run will send (engine/runs/call_sizes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO

from rich.table import Table

from engine.core.graph import GraphSpec, load_graph
from engine.experiment.cells import Cell, resolved_models
from engine.experiment.plan import PlanError
from engine.runs.call_sizes import CallSizes, measure_sizes
from engine.runs.estimate import (
    FORWARD_TOKENS,
    OPTIMIZER_TOKENS,
    backward_calls_per_example,
    estimate_calls,
)
from engine.runs.execute import RunConfig

__all__ = ["FORWARD_TOKENS", "OPTIMIZER_TOKENS", "Estimate", "backward_calls_per_example",
           "confirm", "estimate_run", "estimate_table"]


# --- the estimate ---------------------------------------------------------------------


@dataclass
class Estimate:
    """Runs, and their calls and cost at most (engine/runs/estimate.py's upper figures)."""

    runs: int = 0
    forward_calls: int = 0
    optimizer_calls: int = 0
    cost: float | None = 0.0
    tokens: int = 0

    def add(self, other: Estimate) -> None:
        self.runs += other.runs
        self.forward_calls += other.forward_calls
        self.optimizer_calls += other.optimizer_calls
        self.tokens += other.tokens
        self.cost = None if self.cost is None or other.cost is None else self.cost + other.cost


def estimate_run(graph: GraphSpec, config: RunConfig, n_train: int, n_val: int, n_test: int,
                 models: tuple[str, str], prices: dict, sizes: CallSizes | None = None
                 ) -> Estimate:
    """Upper bound on one run's calls, from the estimate every `run` prints: every
    evaluated example runs every LLM node, k failing examples are back-propagated (a repair
    call each), each trainable node (one, in update mode 'one') gets an update call per
    step, the per-node gates where the mode allows them; the reply cache is ignored.
    Tokens per call from `sizes` (engine/runs/call_sizes.py), else the fixed averages
    `FORWARD_TOKENS` and `OPTIMIZER_TOKENS`."""
    est = estimate_calls(graph, config, n_train, n_val, n_test, models, prices, sizes=sizes)
    return Estimate(1, est.calls("forward", upper=True), est.calls("optimizer", upper=True),
                    est.cost(upper=True), est.tokens(upper=True))


def estimate_table(cells: list[Cell], pending: list[Cell]) -> tuple[Table, Estimate]:
    from engine.llm.pricing import load_prices

    prices = load_prices()
    per_entry: dict[str, Estimate] = {}
    for cell in pending:
        graph = load_graph(cell.config.graph)
        s = cell.splits
        models = resolved_models(cell.config)
        # sized as `run` sizes this run's calls: its own prompts, rendered on its examples
        sizes = measure_sizes(graph, cell.config, s, *models)
        est = estimate_run(graph, cell.config, len(s.train), len(s.val), len(s.test),
                           models, prices, sizes)
        per_entry.setdefault(cell.entry.name, Estimate()).add(est)
    table = Table("entry", "to run", "done", "forward calls", "optimizer calls", "tokens",
                  "cost $", title="Estimate (upper bound; cached replies cost nothing)")
    total = Estimate()
    for name in dict.fromkeys(c.entry.name for c in cells):
        est = per_entry.get(name, Estimate())
        done = sum(1 for c in cells if c.entry.name == name and c.run_id)
        table.add_row(name, str(est.runs), str(done), f"{est.forward_calls:,}",
                      f"{est.optimizer_calls:,}", _compact(est.tokens), _money(est.cost))
        total.add(est)
    table.add_row("total", str(total.runs), str(sum(1 for c in cells if c.run_id)),
                  f"{total.forward_calls:,}", f"{total.optimizer_calls:,}",
                  _compact(total.tokens), _money(total.cost), style="bold")
    return table, total


def _compact(n: int) -> str:
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.0f}k" if n >= 1e4 else str(n)


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"{value:,.2f}"


def confirm(total: Estimate, assume_yes: bool, stdin: TextIO, console: Any) -> bool:
    """--yes, or 'y' typed at a terminal. Without a terminal and without --yes: PlanError."""
    if assume_yes or total.runs == 0:
        return True
    if not stdin.isatty():
        raise PlanError(f"not confirmed: standard input is not a terminal; pass --yes to "
                        f"start the {total.runs} runs estimated above")
    console.print("Proceed? [y/N] ", end="", markup=False, highlight=False)
    return stdin.readline().strip().lower() in ("y", "yes")
