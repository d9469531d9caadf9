"""The estimate shown before an experiment starts: an upper bound on each run's calls,
tokens and cost, per entry and in total, and the confirmation to go ahead."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TextIO

from rich.table import Table

from engine.core.graph import GraphSpec, load_graph
from engine.experiment.cells import Cell, resolved_models
from engine.experiment.plan import PlanError
from engine.methods import METHODS
from engine.runs.execute import RunConfig

# Average tokens per call, for the estimate only (the run log records the real figures):
# a forward call shows the question, the hints and the node's prompt; a backward or update
# call shows a node's neighbourhood and feedback for k examples.
FORWARD_TOKENS = (600, 200)
OPTIMIZER_TOKENS = (1500, 400)


# --- the estimate ---------------------------------------------------------------------


@dataclass
class Estimate:
    runs: int = 0
    forward_calls: int = 0
    optimizer_calls: int = 0
    cost: float | None = 0.0

    @property
    def tokens(self) -> int:
        return self.forward_calls * sum(FORWARD_TOKENS) + \
            self.optimizer_calls * sum(OPTIMIZER_TOKENS)

    def add(self, other: Estimate) -> None:
        self.runs += other.runs
        self.forward_calls += other.forward_calls
        self.optimizer_calls += other.optimizer_calls
        self.cost = None if self.cost is None or other.cost is None else self.cost + other.cost


def backward_calls_per_example(graph: GraphSpec, method: str) -> int:
    """Backward calls for one back-propagated example, as the method counts them."""
    return METHODS[method].backward_calls(graph)


def estimate_run(graph: GraphSpec, config: RunConfig, n_train: int, n_val: int, n_test: int,
                 models: tuple[str, str], prices: dict) -> Estimate:
    """Upper bound on one run's calls: every evaluated example runs every LLM node (step 0
    on train and validation; each step on train, then its candidate on validation; the
    test once), k failing examples are back-propagated and each trainable node (one, in
    update mode 'one') gets an update call per step. The reply cache is ignored."""
    from engine.llm.pricing import cost_usd

    llm_nodes = sum(1 for n in graph.nodes if n.kind == "llm")
    evaluated = (config.steps + 1) * (n_train + n_val) + n_test
    updates = 1 if config.update_mode == "one" else len(graph.trainable_nodes)
    optimizer = config.steps * (min(config.failures_per_step, n_train)
                                * backward_calls_per_example(graph, config.method) + updates)
    optimizer += evaluated if graph.metric == "judge" else 0
    forward = evaluated * llm_nodes
    costs = [cost_usd(prices, models[0], forward * FORWARD_TOKENS[0],
                      forward * FORWARD_TOKENS[1]),
             cost_usd(prices, models[1], optimizer * OPTIMIZER_TOKENS[0],
                      optimizer * OPTIMIZER_TOKENS[1])]
    return Estimate(1, forward, optimizer, None if None in costs else sum(costs))


def estimate_table(cells: list[Cell], pending: list[Cell]) -> tuple[Table, Estimate]:
    from engine.llm.pricing import load_prices

    prices = load_prices()
    per_entry: dict[str, Estimate] = {}
    for cell in pending:
        graph = load_graph(cell.config.graph)
        s = cell.splits
        est = estimate_run(graph, cell.config, len(s.train), len(s.val), len(s.test),
                           resolved_models(cell.config), prices)
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
