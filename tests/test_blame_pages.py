"""The dashboard's blame figures agree with `engine blame --json` on the teaching graph
with a planted fault (sample_graphs/blame_fault.yaml, its scripted model obeying prompts
literally): the Examples page's blame column never credits a fix that leaked the target
or an in-sample edit, and the Graph page's "fixed by its edit alone" counts only the
optimizer's proposed edit, never a prompt typed in What-if."""

from __future__ import annotations

import asyncio
import json

import pytest

from dashboard.views.blame import interval_text
from engine.cli import main
from engine.llm.scripted import ScriptedBackend
from engine.probes.single import probe
from engine.runlog.debug import example_rows
from engine.runlog.reader import node_blame
from tests.support.blame_fault_script import blame_fault_responder
from tests.test_blame import logged_run


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr("engine.llm.factory.make_backend",
                        lambda *a, **k: ScriptedBackend(responder=blame_fault_responder()))


def blame_json(db: str, capsys, examples: str) -> dict:
    capsys.readouterr()
    assert main(["blame", "bf", "--db", db, "--step", "1", "--examples", examples,
                 "--exhaustive", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def edit_counts(db: str) -> dict[str, tuple[int, int]]:
    """node -> (fixed by its edit alone, probed with it), as the Graph page shows them."""
    return {r["node_id"]: (int(r["edit_flips"]), int(r["edit_probed"]))
            for r in node_blame(db, "bf", 1).to_dict("records")}


def blame_cells(db: str) -> dict[str, dict]:
    rows = example_rows(db, "bf", 1, split="train", limit=100)
    return {r["example_id"]: r for r in rows.to_dict("records")}


def named(cell: object) -> set[str]:
    """'numbers +1.00, who +0.50' -> {'numbers', 'who'}; None -> set()."""
    return {part.split()[0] for part in cell.split(", ")} if isinstance(cell, str) else set()


def test_examples_blame_column_sets_leaks_apart_as_blame_json_does(tmp_path, capsys,
                                                                    scripted):
    db = logged_run(tmp_path)
    report = blame_json(db, capsys, "failing")
    nodes = {n["node"]: n for n in report["nodes"]}
    assert nodes["total"]["leaks"] == 8 and nodes["total"]["flips"] == 0  # all leaked
    credited: dict[str, set[str]] = {}
    for claim in report["claims"]:  # the gradient probes' flips, leaks left out
        credited.setdefault(claim["example"], set())
        if claim["flipped"]:
            credited[claim["example"]].add(claim["node"])
    cells = blame_cells(db)
    assert set(credited) <= set(cells)
    for example, nodes_fixed in credited.items():
        row = cells[example]
        assert named(row["blame"]) == nodes_fixed, (example, row["blame"])
        assert "total" not in named(row["blame"])  # its fixes carried the answer
        assert row["leaked"] == "total"
    assert {e for e, n in credited.items() if "numbers" in n} == set(credited)


def test_edit_alone_counts_only_the_proposed_edit_as_blame_json_does(tmp_path, capsys,
                                                                     scripted):
    db = logged_run(tmp_path)
    report = blame_json(db, capsys, "failing")
    expected = {n["node"]: (n["edit"]["flips"], n["edit"]["probed"] - n["edit"]["errors"]
                            - n["edit"]["seen"]) for n in report["nodes"]}
    # 3 of its 8 fixes are on examples the update call saw: left out of flips and count
    assert expected["numbers"] == (5, 5)
    assert edit_counts(db) == expected
    # the intervals the pages print beside the counts are the command's
    pages = {r["node_id"]: r for r in node_blame(db, "bf", 1).to_dict("records")}
    for n in report["nodes"]:
        row = pages[n["node"]]
        assert interval_text(row["edit_flips"], row["edit_probed"]) == \
            "[{:.2f}, {:.2f}]".format(*n["edit"]["interval"])
        assert interval_text(row["flips"], row["probed"]) == \
            "[{:.2f}, {:.2f}]".format(*n["interval"])
    assert interval_text(0, 0) == "–"


def test_a_what_if_prompt_is_not_the_optimizers_edit(tmp_path, capsys, scripted):
    db = logged_run(tmp_path)
    report = blame_json(db, capsys, "sampled")  # only the 3 examples the update call saw
    numbers = next(n for n in report["nodes"] if n["node"] == "numbers")
    assert (numbers["edit"]["flips"], numbers["edit"]["probed"]) == (0, 3)
    # ... and those are no evidence about the edit: none is counted, on the pages either
    assert (numbers["edit"]["seen"], edit_counts(db)["numbers"]) == (3, (0, 0))
    sampled = {c["example"] for c in report["claims"]}
    cells = blame_cells(db)
    unseen = sorted(e for e in cells if e not in sampled)[0]  # fails, never probed so far
    assert named(cells[unseen]["blame"]) == set()
    results = asyncio.run(probe(db, "bf", 1, "numbers", "edit",
                                text="Write the numbers of the text.", examples=unseen,
                                forward_backend=ScriptedBackend(
                                    responder=blame_fault_responder())))
    assert [r.flipped for r in results] == [True]  # the typed prompt fixes it ...
    assert edit_counts(db)["numbers"] == (0, 0)  # ... but it is not the optimizer's edit
    assert blame_json(db, capsys, "sampled")["nodes"][1]["edit"]["flips"] == 0
    cells = blame_cells(db)
    assert named(cells[unseen]["blame"]) == {"numbers"}  # the probe itself is shown
    for example in sampled:  # the proposal's fixes there are in-sample: named apart
        assert cells[example]["in_sample"] == "numbers"


def test_a_runs_call_figures_are_one_number_before_and_after_blame(tmp_path, capsys,
                                                                   scripted):
    """Runs (list_runs), Curves (token_totals, step_totals) and the Graph page's node
    table (node_step_stats) count the run's own model calls the same way, and a blame run
    on it (twice: the second from the cache) changes none of them: its calls are
    counted apart as probe calls."""
    import duckdb

    from engine.runlog.reader import list_runs, node_step_stats, step_totals, token_totals

    db = logged_run(tmp_path)

    def figures():
        run = list_runs(db).set_index("run_id").loc["bf"]
        own = token_totals(db, "bf").query("purpose not in ('probe', 'diff')")
        steps = step_totals(db, "bf").query("purpose not in ('probe', 'diff')")
        nodes = node_step_stats(db, "bf", 1)
        return ((int(run["calls"]), int(run["tokens"]), int(run["cache_hits"])),
                (int(own["calls"].sum()), int(own["tokens"].sum()),
                 int(own["cache_hits"].sum())),
                (int(steps["calls"].sum()), int(steps["tokens"].sum())),
                dict(zip(nodes["node_id"], nodes["calls"].astype(int))), int(run["probe_calls"]))

    with duckdb.connect(db, read_only=True) as con:
        paid, hits = con.execute("SELECT count(*) FILTER (WHERE NOT cache_hit), count(*) "
                                 "FILTER (WHERE cache_hit) FROM llm_calls").fetchone()
    before = figures()
    assert before[0] == before[1][:2] + (hits,) == (paid, before[2][1], hits)
    assert before[2][0] == paid and before[4] == 0
    blame_json(db, capsys, "failing")
    after = figures()
    assert after[:4] == before[:4] and after[4] > 0
    blame_json(db, capsys, "failing")  # again, from the cache: still nothing changes
    assert figures()[:4] == before[:4]
