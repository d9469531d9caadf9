"""Your pipeline, re-run for real: an OpenAI-compatible gateway between a pipeline and its
model (server.py) that records every call it forwards as an OpenInference LLM span in the
store `collect` writes, answers repeated requests from its content-addressed reply cache,
and intervenes by URL (interventions.py: a node's prompt swapped, or its reply patched);
the runner (runner.py, worker.py) that calls the user's pipeline once per example through
it; and the forward pass that re-runs the pipeline instead of replaying its recorded calls
(rerun.py), with `trace` and `optimize` on top of it (pipeline.py)."""
