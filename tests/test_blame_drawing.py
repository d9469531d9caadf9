"""One fact, one number: the verdict `engine blame` prints and the
pages' drawings of it come from the same per-node facts (engine.probes.verdict `weighed`).

On the demo as it was before its rebuild (tests/support/tie_demo.yaml: `note` and `thing`
both read the sentence) with tests/support/tie_script.py (no gradient fixes anything;
`note`'s and `thing`'s edits alone each fix some validation examples), blame ties on the
two from the edit probes. The facts of the command's report and those the pages read back from
the run log (`logged_blame`) are the same, and the blame colouring labels each node with
the count `blame --json` gives for the probes the verdict weighed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from dashboard.views.colors import TIED, color_nodes
from engine.cli import main
from engine.probes.blame import blame
from engine.probes.verdict import logged_blame
from engine.runlog.reader import node_blame, step_updates
from engine.runs.execute import RunConfig, execute

ROOT = Path(__file__).resolve().parents[1]
MODEL = f"{ROOT / 'tests' / 'support' / 'tie_script.py'}:tie_responder"
NODES = ["note", "thing", "answer"]


def tie_run(tmp_path: Path) -> str:
    db = str(tmp_path / "runs.duckdb")
    config = RunConfig(graph=str(ROOT / "tests" / "support" / "tie_demo.yaml"),
                       backend="scripted",
                       scripted_responder=MODEL, steps=1, db=db, run_id="tie")
    assert asyncio.run(execute(config)).status == "finished"
    return db


def logged(db: str):
    return logged_blame(node_blame(db, "tie", 1).to_dict("records"),
                        step_updates(db, "tie", 1).to_dict("records"), NODES)


def test_the_drawing_labels_a_tie_with_the_counts_blame_json_gives(tmp_path, capsys):
    db = tie_run(tmp_path)
    capsys.readouterr()
    assert main(["blame", "tie", "--db", db, "--step", "1", "--examples", "val",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["evidence"] == "edit" and report["verdict"]["tied"] == ["note", "thing"]
    assert all(n["flips"] == 0 for n in report["nodes"])  # the gradient count: 0 each
    found = logged(db)
    assert found.verdict.as_json() == report["verdict"] and found.evidence == "edit"
    coloring = color_nodes([], "blame", found.facts)
    for n in report["nodes"]:
        edit = n["edit"]
        count = f"{edit['flips']}/{edit['probed'] - edit['errors'] - edit['seen']}"
        tied = n["node"] in report["verdict"]["tied"]
        assert coloring.captions[n["node"]] == ("tie · " if tied else "") + \
            f"edit fixes {count}"
        assert (coloring.colors[n["node"]] == TIED) == tied
    assert edit["flips"] == 0 and coloring.captions["answer"] == f"edit fixes {count}"


def test_the_reports_facts_are_the_logged_ones(tmp_path):
    db = tie_run(tmp_path)
    report = asyncio.run(blame(db, "tie", 1, "val"))
    assert [(f.node, f.standing) for f in report.facts] == [
        ("note", "tied"), ("thing", "tied"), ("answer", "weighed")]
    assert report.facts == logged(db).facts
