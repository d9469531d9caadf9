"""The method-case graphs (sample_graphs/case_rooms.yaml, case_orders.yaml) and what the
method comparison on them reports: the fault is upstream of a join, both parts of every
answer stand in its sentence, in sentences of three forms (so no fixed word position gives
the part the faulty node must write), the plan benchmarks/plans/method_case.yaml expands to
2 graphs x 4 methods x 5 seeds at the graphs' own settings, and an experiment's results.md
counts runs that learned and pairs `semantic` with each other method on the same seeds and
test examples (checked here against the run log on a small scripted plan)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from engine.cli import commands as cli
from engine.core.graph import load_graph
from engine.experiment.plan import load_plan
from engine.experiment.results import mcnemar_p, paired_difference
from tests.support.runlog import rows

ROOT = Path(__file__).resolve().parents[1]
# graph: (the sibling, the node at fault, the target field, how the target joins its parts)
GRAPHS = {"case_rooms": ("room", "guest", "tag", " "),
          "case_orders": ("ref", "place", "label", "-")}


def examples(name: str) -> list[dict]:
    return [json.loads(line) for line in
            (ROOT / "sample_graphs" / "data" / f"{name}.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_a_case_graph_has_its_fault_upstream_of_a_join(name):
    graph = load_graph(str(ROOT / "sample_graphs" / f"{name}.yaml"))
    sibling, faulty, _, _ = GRAPHS[name]
    assert sorted(graph.predecessors(graph.output_node.id)) == sorted([faulty, sibling])
    assert graph.splits == {"train": 8, "val": 24, "test": 24}
    rows_ = examples(name)
    assert len(rows_) >= 56 and len({r["text"] for r in rows_}) == len(rows_)
    spec = yaml.safe_load((ROOT / "sample_graphs" / "data" / f"{name}_prompts.yaml").read_text())
    assert set(spec["fixed"]) == {faulty}
    assert all(set(g) == {faulty} for g in spec["generic"])


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_both_parts_of_each_answer_stand_in_its_sentence_at_varying_places(name):
    _, _, field, joint = GRAPHS[name]
    places = set()
    for row in examples(name):
        parts = row[field].split(joint)
        assert len(parts) == 2 and all(part in row["text"] for part in parts), row
        words = [w.strip(".,;:") for w in row["text"].split()]
        places |= {i for i, w in enumerate(words) if w in parts}
    assert len(places) >= 4  # the parts stand at four word positions or more


def test_the_plan_runs_four_methods_on_five_seeds_at_the_graphs_own_settings():
    plan = load_plan(str(ROOT / "benchmarks" / "plans" / "method_case.yaml"))
    assert [e.name for e in plan.entries] == ["rooms", "orders"]
    for entry in plan.entries:
        assert [v.method for v in entry.variants] == ["semantic", "semantic-nosibling",
                                                       "textgrad", "none"]
        assert list(entry.seeds) == [0, 1, 2, 3, 4]
        assert (entry.steps, entry.proposals) == (1, 2)  # the graphs' own


def test_mcnemar_and_the_paired_difference():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(6, 0) == pytest.approx(2 / 64)  # 6 discordant pairs, all one way
    assert mcnemar_p(3, 3) == 1.0
    diff, low, high = paired_difference(10, 6, 0, 8)
    assert diff == pytest.approx(6 / 24) and low < diff < high and low > 0


def experiment(*args: str) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["experiment", *args])
    return code, out.getvalue() + err.getvalue()


def test_results_count_runs_that_learned_and_pair_semantic_with_each_method(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"name": "mini", "entries": [{
        "name": "rooms", "graph": str(ROOT / "sample_graphs" / "case_rooms.yaml"),
        "methods": ["semantic", "none"], "seeds": [0, 1], "train": 4, "val": 4,
        "test": 6}]}))
    db, out = tmp_path / "runs.duckdb", tmp_path / "out"
    code, said = experiment(str(plan), "--backend", "scripted", "--db", str(db), "--out",
                            str(out), "--yes", "--concurrency", "8")
    assert code == 0, said
    scores = {}
    for run_id, example, score in rows(db, """
            SELECT run_id, example_id, score FROM losses WHERE split = 'test'"""):
        method = "semantic" if ".semantic." in run_id else "none"
        seed = re.search(r"\.s(\d)\.", run_id).group(1)
        scores[(method, seed, example)] = score
    counts = [0, 0, 0, 0]
    for (method, seed, example), a in scores.items():
        if method == "semantic":
            b = scores[("none", seed, example)]
            counts[0 if a and b else 1 if a else 2 if b else 3] += 1
    assert sum(counts) == 12  # 2 seeds x 6 test examples
    (paired,) = list(csv.DictReader((out / "paired.csv").open()))
    assert [int(paired[k]) for k in ("both_pass", "reference_only", "method_only",
                                     "neither")] == counts
    assert (paired["reference"], paired["method"], paired["pairs"]) == ("semantic", "none",
                                                                         "12")
    text = (out / "results.md").read_text()
    assert "## Counted by runs" in text and "## Paired:" in text
    learned = {r[0]: r[1] for r in rows(db, """
        SELECT run_id, arg_max(val_score, step) > arg_min(val_score, step) FROM steps
        GROUP BY run_id""")}
    for method in ("semantic", "none"):
        k = sum(1 for run, up in learned.items() if f".{method}." in run and up)
        assert f"| rooms | {method} | {k} of 2 |" in text


def test_pairs_are_the_same_seed_and_example_and_count_each_outcome_once():
    """On the plan's own cells with outcomes set by hand: semantic's seed-0 run passes e1
    and e2, none's seed-0 run passes e2 and e3, seed 1 of `none` never finished (its pairs
    are left out) and an example only one run scored is no pair."""
    from engine.experiment.cells import expand
    from engine.experiment.results import paired_rows

    plan = load_plan(str(ROOT / "benchmarks" / "plans" / "method_case.yaml"))
    cells = [c for c in expand(plan, None) if c.entry.name == "rooms" and c.seed in (0, 1)
             and c.variant.name in ("semantic", "none")]
    for cell in cells:
        cell.run_id = f"{cell.variant.name}-{cell.seed}"
    outcomes = {"semantic-0": {"e1": 1.0, "e2": 1.0, "e3": 0.0, "e4": 0.0, "e5": 1.0},
                "none-0": {"e1": 0.0, "e2": 1.0, "e3": 1.0, "e4": 0.0},
                "semantic-1": {"e1": 1.0, "e2": 1.0},
                "none-1": {}}
    (row,) = paired_rows(cells, outcomes)
    assert (row["reference"], row["method"], row["pairs"]) == ("semantic", "none", 4)
    assert (row["both_pass"], row["reference_only"], row["method_only"], row["neither"]) == (
        1, 1, 1, 1)
    assert row["difference_pct"] == 0.0 and row["mcnemar_p"] == 1.0
    outcomes["none-0"]["e1"] = 1.0  # now none passes e1 too: semantic never alone
    (row,) = paired_rows(cells, outcomes)
    assert (row["reference_only"], row["method_only"], row["difference_pct"]) == (0, 1, -25.0)


def test_a_run_learned_when_its_last_validation_beat_its_starting_prompts():
    from engine.experiment.cells import expand
    from engine.experiment.results import learned_runs

    plan = load_plan(str(ROOT / "benchmarks" / "plans" / "method_case.yaml"))
    cells = [c for c in expand(plan, None) if c.entry.name == "rooms"
             and c.variant.name == "semantic"]
    for cell in cells:
        cell.run_id = f"r{cell.seed}"
    metrics = {"r0": {"val0": 0.0, "val": 0.5}, "r1": {"val0": 0.2, "val": 0.2},
               "r2": {"val0": 0.3, "val": 0.1}, "r3": {"val0": 0.0, "val": 0.04}}
    (row,) = learned_runs(cells, metrics)  # r4 never finished: not counted
    assert (row["method"], row["learned"], row["runs"]) == ("semantic", 2, 4)
    assert row["low_pct"] < 50 < row["high_pct"]
