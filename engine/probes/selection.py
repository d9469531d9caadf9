"""Which examples and which edit a probe of a logged step works on: the gradients the
step's nodes received, the step's proposal per node (a copy of training examples refused),
the examples back-propagated at the step, and `--examples` read as a list of ids."""

from __future__ import annotations

from engine.core.copies import COPY_REASON
from engine.probes.probe import (
    LoggedRun,
    ProbeError,
)
from engine.probes.verdict import proposal_kind
from engine.runlog.probing import (
    aggregate_gradients,
    sampled_examples,
    step_proposal,
)

EXAMPLE_CHOICES = ("sampled", "failing", "val", "all")


class CopiedProposal(ProbeError):
    """The step's proposal was rejected as a copy of training examples."""


class NothingToProbe(ProbeError):
    """A step with no failing example among those chosen."""


def received_gradients(run: LoggedRun) -> dict[tuple[str, str], str]:
    """(example, node) -> the aggregated gradient the node acted on at the step."""
    return aggregate_gradients(run.db, run.run_id, run.step)


def proposed_prompt(run: LoggedRun, node_id: str) -> str:
    """The node's proposal at the step. One the optimizer rejected as a copy of training
    examples is refused: a flip it causes is the examples pasted in, not credit."""
    row = step_proposal(run.db, run.run_id, run.step, node_id)
    kind = proposal_kind(row)
    if kind == "copied":
        unchanged = row[1].strip() in ("", row[0].strip())
        raise CopiedProposal(f"step {run.step}'s proposal for node '{node_id}' was rejected: "
                             f"it {COPY_REASON}" + ("" if unchanged else
                                                    " (to probe it anyway, pass it as "
                                                    "--edit @FILE)"))
    if kind == "unchanged":
        raise ProbeError(f"step {run.step} has no proposed edit for node '{node_id}'"
                         + ("" if row is None else " (its update left the prompt unchanged)"))
    return row[1]


def backpropagated(run: LoggedRun) -> list[str]:
    """Examples whose loss was back-propagated at the step, in dataset order
    (`sampled_examples`: for a method without gradients, the optimizer's seeded sample
    drawn again)."""
    return sampled_examples(run.db, run.run_id, run.step, run.config)


def select_examples(run: LoggedRun, which: str) -> list[str]:
    if which in ("failing", "sampled"):
        ids = backpropagated(run)
        if not ids:
            raise ProbeError(f"no example was back-propagated at step {run.step}; pass "
                             "--examples val or a list of ids")
        return ids
    if which == "val":
        ids = [e for e, split in run.split_of.items() if split == "val"]
        if not ids:
            raise ProbeError(f"run '{run.run_id}' has no validation examples")
        return ids
    ids = [e.strip() for e in which.split(",") if e.strip()]
    for e in ids:
        run.example(e)
    return ids

