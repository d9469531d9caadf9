"""`backprop`: the backward pass and the proposals on a logged run's last step, such as an
imported one (step 0: the recorded traces).

One optimization step runs from the run's state with every failing training example
back-propagated: its forward pass replays the logged calls from the reply cache (the
prompts are unchanged), the method's gradients (sibling-conditioned by default) and a
proposal per trainable node are recorded as any run records them, and the proposals are
gated on validation when the run has any (an imported run has none unless imported with
`--val N`: without it its proposals are recorded, not applied). With `proposals` N > 1 the
update calls are made N times and the best candidate prompt set on validation is kept, as
a run's `--proposals N` does; that needs validation examples to choose by. `blame` and
`probe` then work on the new step. On a run recorded through the gateway (`trace
--pipeline`), `rerun` (engine.gateway.rerun.PipelineRerun) re-runs the pipeline for every
forward pass instead of replaying.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from engine.data.examples import Splits
from engine.llm.base import Backend
from engine.runlog.schema import RunLogError
from engine.runlog.state import load_resume_state
from engine.runlog.traces import failing_count, store_config
from engine.runlog.writer import open_for_writing
from engine.runs.code import bind_logged_graph
from engine.runs.execute import RunResult, drive_run, examples_of, method_from_config
from engine.runs.settings import RunConfig


async def backprop(db: str, run_id: str, *, method: str | None = None,
                   base_url: str | None = None, model: str | None = None,
                   concurrency: int | None = None, timeout: float | None = None,
                   optimizer_max_tokens: int | None = None,
                   optimizer_backend_kind: str | None = None,
                   optimizer_model: str | None = None,
                   proposals: int | None = None,
                   forward_backend: Backend | None = None,
                   optimizer_backend: Backend | None = None,
                   listeners: tuple[Callable[[Any], None], ...] = (),
                   rerun: Any = None) -> RunResult:
    point = load_resume_state(db, run_id)
    if point.state is None:
        raise RunLogError(f"run '{run_id}' has no complete step to back-propagate from")
    failing = failing_count(db, run_id, point.state.step)
    if failing == 0:
        raise RunLogError(f"run '{run_id}' has no failing training example at step "
                          f"{point.state.step}: nothing to back-propagate (import the "
                          "traces again with import-traces --targets to grade them)")
    if proposals is not None and proposals > 1 and not examples_of(point.examples, "val"):
        raise RunLogError(f"run '{run_id}' has no validation examples to choose among "
                          f"{proposals} candidate prompt sets (import the traces again "
                          "with import-traces --val N, or leave --proposals out)")
    config = RunConfig.from_json(point.config)
    config.db, config.run_id = db, run_id
    config.method = method or config.method
    config.base_url = base_url or config.base_url
    config.model = model or config.model
    changed = {k: v for k, v in (("concurrency", concurrency), ("timeout", timeout),
                                 ("optimizer_max_tokens", optimizer_max_tokens),
                                 ("optimizer_backend", optimizer_backend_kind),
                                 ("optimizer_model", optimizer_model),
                                 ("proposals", proposals))
               if v is not None}
    for key, value in changed.items():
        setattr(config, key, value)
    method_from_config(config)  # an unknown method: refused before anything is written
    open_for_writing(db)
    if method or base_url or model or changed:  # probes and blame of the run use them too
        store_config(db, run_id, config.to_json())
    config.steps = point.state.step + 1
    config.failures_per_step = failing
    graph = bind_logged_graph(point.graph_yaml, config.graph, config.code)
    splits = Splits(*(examples_of(point.examples, s) for s in ("train", "val", "test")))
    return await drive_run(config, graph, splits, point.state, forward_backend,
                           optimizer_backend, listeners, new=False, test_done=True,
                           baseline_step=None, rerun=rerun)
