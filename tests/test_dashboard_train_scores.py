"""Training is scored at the start of each step, before its update.

On a one-step demo run whose step kept an edit, Curves drew the train line flat at the
starting prompts' score (steps 0 and 1 both scored those prompts), and Compare against a
fork with the hand-fixed prompt flagged all 8 training rows as disagreeing: the parent's
rows were scored before its edit, the fork's after its own. Curves now places each train
score at the prompts it measured; Compare compares each side's pass over the prompts in
effect after the step, and leaves out training rows a run never scored with them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dashboard.views.figures import TRAIN_NAME, score_curves
from engine.llm.scripted import ScriptedBackend
from engine.runlog import debug, reader
from engine.runs.code import load_responder
from engine.runs.execute import RunConfig, execute
from engine.runs.fork import fork
from tests.support.dashboard_log import open_page

ROOT = Path(__file__).resolve().parents[1]
FIXED = "The text says how many. Write that number."  # data/demo_fixed_prompts.yaml


def fixing_model():
    """The demo's scripted model, whose update call fixes `note` (as the embedded pair's
    step 1 did in the README's demo): the step's gate keeps the edit."""
    forward = load_responder(f"{ROOT}/sample_graphs/demo_responder.py:demo_responder")

    def respond(request):
        if request.purpose == "update" and request.meta.get("node") == "note":
            return "<prompt>Write one number about the text.</prompt>"
        return forward(request)

    return respond


def run_demo(db: Path, run_id: str, steps: int) -> None:
    config = RunConfig(graph=str(ROOT / "sample_graphs" / "demo.yaml"), backend="scripted",
                       steps=steps, db=str(db), run_id=run_id)
    result = asyncio.run(execute(config, forward_backend=ScriptedBackend(
        responder=fixing_model())))
    assert result.status == "finished"


@pytest.fixture(scope="module")
def log(tmp_path_factory):
    """The newcomer's run log: the one-step demo (its step keeps an edit), a fork of it
    from step 1 with the hand-fixed prompt, and the same demo run for two steps."""
    db = tmp_path_factory.mktemp("train_scores") / "runs.duckdb"
    run_demo(db, "demo", 1)
    asyncio.run(fork(str(db), "demo", 1, set_prompts={"note": FIXED},
                     overrides={"run_id": "fork", "steps": 0},
                     forward_backend=ScriptedBackend(responder=fixing_model())))
    run_demo(db, "longer", 2)
    steps = reader.step_table(db, "demo")
    assert list(steps["train_score"]) == [0.0, 0.0]  # both scored the starting prompts
    assert list(steps["val_score"]) == [0.0, 1.0] and bool(steps["accepted"].iloc[1])
    return db


def train_trace(fig) -> dict:
    return next(t for t in fig.data if t.name.startswith("train"))


def test_curves_place_each_train_score_at_the_prompts_it_measured(log):
    fig = score_curves(reader.step_table(log, "demo"))
    train = train_trace(fig)
    assert train.name == TRAIN_NAME
    # one point, at the starting prompts; the prompts step 1 kept were never scored on train
    assert list(train.x) == [0] and list(train.y) == [0.0]
    # two steps: step 2 scored step 1's prompts (fixed) at its start
    train = train_trace(score_curves(reader.step_table(log, "longer")))
    assert list(train.x) == [0, 1] and list(train.y) == [0.0, 1.0]
    assert "scored at step 2 before its update" in train.hovertext[1]
    # the fork scored its hand-fixed prompts at its starting step
    train = train_trace(score_curves(reader.step_table(log, "fork")))
    assert list(train.x) == [1] and list(train.y) == [1.0]


def test_compare_leaves_out_training_rows_scored_before_the_step_s_edit(log):
    rows = debug.compare_rows(log, "demo", "fork", 1, 1)
    assert not rows["disagree"].any(), rows[rows["disagree"]]
    assert "train" not in set(rows["split"])  # demo's kept prompts: never scored on train
    val = rows[rows["split"] == "val"]
    assert len(val) == 24 and set(val["step_a"]) == {1} and set(val["step_b"]) == {1}
    # a run that went on scored step 1's prompts on train at step 2: those rows compare
    rows = debug.compare_rows(log, "longer", "fork", 1, 1)
    train = rows[rows["split"] == "train"]
    assert len(train) == 8 and set(train["step_a"]) == {2} and not rows["disagree"].any()
    # the starting prompts: validation scored at step 0, training last at step 1's start
    rows = debug.compare_rows(log, "demo", "longer", 0, 0)
    assert rows.groupby("split")["step_a"].unique().map(list).to_dict() == {
        "train": [1], "val": [0]}
    assert len(rows) == 32 and not rows["disagree"].any()


def test_compare_page_says_why_training_rows_are_left_out(log, monkeypatch, tmp_path):
    monkeypatch.setenv("SEMBACK_JOBS_DIR", str(tmp_path / "jobs"))
    at = open_page(log, "screens/compare.py", run="demo", step=1, other="fork")
    shown = "\n".join(str(c.value) for c in at.caption)
    assert "0 of 32 shared examples disagree" in shown, shown  # validation and test
    assert "No training example is compared: A has no step after step 1" in shown, shown
    curves = json.loads(next(e for e in at.get("plotly_chart")).proto.spec)
    a_train = next(t for t in curves["data"] if t["name"] == f"A {TRAIN_NAME}")
    assert a_train["x"] == [0]
