"""The loss: the graph's metric on the output node, and the output gradient.

For exact metrics the output node receives `The expected output is: "<target>".`, as in
the paper. `metric: judge` asks the optimizer model to grade against the graph's rubric;
its critique becomes the output gradient.
"""

from __future__ import annotations

import asyncio
import math
import numbers
from collections.abc import Callable
from typing import Any

from engine.core.forward import ExampleTrace, RunContext
from engine.data.graders import grade
from engine.events import LossRecord
from engine.prompts import templates as P


async def compute_losses(ctx: RunContext, traces: list[ExampleTrace], split: str
                         ) -> list[LossRecord]:
    records = await asyncio.gather(*(example_loss(ctx, t, split) for t in traces))
    for record in records:
        ctx.emit(record)
    return list(records)


async def example_loss(ctx: RunContext, trace: ExampleTrace, split: str) -> LossRecord:
    graph = ctx.graph
    out = graph.output_node.id
    target = trace.example.target
    prediction = trace.activations[out].output_text if out in trace.activations else ""
    base = dict(run_id=ctx.run_id, step=ctx.step, split=split, example_id=trace.example.id,
                prediction=prediction, target=target)
    if trace.error:
        return LossRecord(**base, score=0.0, feedback="", error=trace.error)
    if graph.metric_fn is not None:
        example = {**trace.example.fields, graph.target_field: target}
        score, feedback = python_metric(graph.metric_fn, example, prediction)
        return LossRecord(**base, score=score,
                          feedback=feedback or P.OUTPUT_GRADIENT.format(target=target))
    if graph.metric != "judge":
        score = grade(graph.metric, prediction, target)
        return LossRecord(**base, score=score, feedback=P.OUTPUT_GRADIENT.format(target=target))
    inputs = P.render_inputs({f: trace.example.fields.get(f, "") for f in graph.input_fields})
    messages = [("system", P.JUDGE_SYSTEM),
                ("user", P.JUDGE_USER.format(rubric=graph.rubric or "Is the answer correct?",
                                             inputs=inputs, prediction=prediction,
                                             target=target))]
    request = ctx.client.request("loss", messages, max_tokens=ctx.optimizer_max_tokens,
                                 meta={"role": "judge", "node": out})
    record = await ctx.client.call(request, step=ctx.step, node_id=out,
                                   example_id=trace.example.id)
    if record.error:
        return LossRecord(**base, score=0.0, feedback="", error=record.error,
                          call_id=record.call_id)
    score, critique, _ = P.parse_judge(record.response)
    return LossRecord(**base, score=score, feedback=critique or record.response,
                      call_id=record.call_id)


class MetricError(ValueError):
    """A Python metric raised, or returned something other than a number or a
    (number, text) pair: the run fails with this one line."""


def python_metric(metric: Callable[..., Any], example: dict[str, str], prediction: str
                  ) -> tuple[float, str]:
    """Call a user's metric: `(example, prediction) -> float | (float, feedback_text)`.
    Returns (score, feedback); feedback '' when the metric gave none."""
    name = getattr(metric, "__name__", type(metric).__name__)
    try:
        value = metric(example, prediction)
    except Exception as exc:  # noqa: BLE001 - a user's metric may raise anything
        raise MetricError(f"metric '{name}' raised {exc.__class__.__name__}: {exc}") from None
    score, feedback = value if isinstance(value, tuple) and len(value) == 2 else (value, "")
    if not isinstance(score, numbers.Real) or not math.isfinite(score) \
            or not isinstance(feedback, str):
        raise MetricError(f"metric '{name}' returned {value!r:.80}; it must return a number "
                          "or a (number, text) pair")
    return float(score), feedback


def mean_score(records: list[LossRecord]) -> float | None:
    return sum(r.score for r in records) / len(records) if records else None
