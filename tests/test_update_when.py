"""Which prompts get an update call: under `--update-when asked` (the default) only those
some gradient of the step asked to change, by the claim recorded with the gradient; under
`always`, every trainable prompt (the paper's optimizer). Run on the planted-fault graph,
whose honest scripted gradients tell 'who' that no change is needed."""

from __future__ import annotations

import asyncio

from engine.events import Progress
from engine.llm.scripted import ScriptedBackend
from engine.runs.execute import RunConfig, execute
from tests.support.blame_fault_script import blame_fault_responder
from tests.support.runlog import rows
from tests.test_probe import GRAPH


def _run(tmp_path, misleading: bool = False, **settings) -> tuple[str, list[Progress]]:
    db = str(tmp_path / "runs.duckdb")
    seen: list[Progress] = []
    asyncio.run(execute(
        RunConfig(graph=str(GRAPH), db=db, steps=1, test=0, run_id="uw", failures_per_step=3,
                  **settings),
        forward_backend=ScriptedBackend(responder=blame_fault_responder(misleading)),
        listeners=(lambda e: seen.append(e) if isinstance(e, Progress) else None,)))
    return db, seen


def _updated(db: str) -> list[str]:
    return [r[0] for r in rows(db, "SELECT node_id FROM updates ORDER BY node_id")]


def _update_progress(seen: list[Progress]) -> tuple[int, int]:
    last = [p for p in seen if p.phase == "update"][-1]
    return last.calls_done, last.calls_expected


def test_a_prompt_every_gradient_said_to_keep_gets_no_update_call(tmp_path):
    db, seen = _run(tmp_path)
    # 'who' received three gradients, each "No change is needed", recorded as such
    claims = rows(db, "SELECT DISTINCT asks_change FROM gradients WHERE node_id = 'who' AND "
                      "kind = 'gradient'")
    assert claims == [(False,)]
    assert _updated(db) == ["numbers", "total"]
    assert rows(db, "SELECT count(*) FROM llm_calls WHERE purpose = 'update'") == [(2,)]
    assert rows(db, "SELECT value FROM metrics WHERE key = 'updates_skipped'") == [(1.0,)]
    assert _update_progress(seen) == (2, 2)  # the progress line counts the calls made


def test_a_gradient_that_asks_a_change_gets_its_prompt_an_update_call(tmp_path):
    db, seen = _run(tmp_path, misleading=True)  # 'who' is now asked to say much more
    assert _updated(db) == ["numbers", "total", "who"]
    assert rows(db, "SELECT value FROM metrics WHERE key = 'updates_skipped'") == [(0.0,)]
    assert _update_progress(seen) == (3, 3)


def test_update_when_always_calls_for_every_trainable_prompt(tmp_path):
    db, seen = _run(tmp_path, update_when="always")
    assert _updated(db) == ["numbers", "total", "who"]
    assert _update_progress(seen) == (3, 3)
