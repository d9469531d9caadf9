"""The order in which the step-through view walks one optimization step of one example:
the forward pass node by node in dependency order, the loss, the backward pass in reverse
order, then the update."""

from __future__ import annotations

from dataclasses import dataclass

from dashboard.views.graph_model import LOSS_ID


@dataclass(frozen=True)
class Stop:
    phase: str  # forward | loss | backward | update
    node_id: str | None
    label: str

    @property
    def highlighted(self) -> str | None:
        """The node the graph highlights at this stop (the loss marker for the loss)."""
        return LOSS_ID if self.phase == "loss" else self.node_id


def walk(order: list[str], output_node: str, trainable: list[str] | None = None
         ) -> list[Stop]:
    """Stops for a graph whose nodes are in topological `order`."""
    stops = [Stop("forward", n, f"Forward: {n}") for n in order]
    stops.append(Stop("loss", output_node, f"Loss on {output_node}'s output"))
    stops += [Stop("backward", n, f"Backward: {n}") for n in reversed(order)]
    stops.append(Stop("update", None, "Update: proposed prompt edits and the gate"))
    return stops
