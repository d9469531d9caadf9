"""benchmarks/attribution.py on the scripted model: which examples blame probes
(`--examples failing|val`) and how many validation and training examples each graph gets
(`--val N`, `--train N`)."""

from __future__ import annotations

import json
import re
import sys

import duckdb
import pytest

from benchmarks import attribution


def run(monkeypatch, capsys, *args: str) -> list[dict]:
    monkeypatch.setattr(sys, "argv", ["attribution.py", "--json", *args])
    attribution.main()
    return json.loads(capsys.readouterr().out)


def test_blame_on_the_validation_examples_probes_those_and_names_the_fault(
        monkeypatch, capsys, tmp_path):
    rows = run(monkeypatch, capsys, "--examples", "val", "--val", "9", "--keep",
               str(tmp_path), "chain2")
    assert [(r["graph"], r["probed"], r["examples"], r["named"]["probes"]) for r in rows] == [
        ("chain2", "val", 9, "fault")]
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        splits = dict(con.execute("SELECT split, count(*) FROM examples WHERE run_id = "
                                  "'chain2' GROUP BY split").fetchall())
        probed = {e for (e,) in con.execute("SELECT DISTINCT example_id FROM probes WHERE "
                                            "kind = 'gradient'").fetchall()}
        val = {e for (e,) in con.execute("SELECT example_id FROM examples WHERE run_id = "
                                         "'chain2' AND split = 'val'").fetchall()}
    assert splits == {"train": 6, "val": 9}
    assert probed == val  # every validation example fails at the start, each is probed


def test_by_default_it_blames_the_failing_training_examples(monkeypatch, capsys, tmp_path):
    rows = run(monkeypatch, capsys, "--keep", str(tmp_path), "chain2")
    assert [(r["probed"], r["examples"], r["named"]["probes"]) for r in rows] == [
        ("failing", 6, "fault")]
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        probed = {e for (e,) in con.execute("SELECT DISTINCT example_id FROM probes WHERE "
                                            "kind = 'gradient'").fetchall()}
        train = {e for (e,) in con.execute("SELECT example_id FROM examples WHERE run_id = "
                                           "'chain2' AND split = 'train'").fetchall()}
    assert probed == train


def test_train_n_gives_each_graph_n_training_examples_and_blame_probes_them(
        monkeypatch, capsys, tmp_path):
    rows = run(monkeypatch, capsys, "--train", "9", "--keep", str(tmp_path), "chain2")
    assert [(r["probed"], r["examples"], r["named"]["probes"]) for r in rows] == [
        ("failing", 9, "fault")]
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        splits = dict(con.execute("SELECT split, count(*) FROM examples WHERE run_id = "
                                  "'chain2' GROUP BY split").fetchall())
    assert splits == {"train": 9, "val": 6}
    assert (tmp_path / "planted-sum-15-named.jsonl").exists()


def test_the_copy_task_plants_a_fault_that_drops_the_number(monkeypatch, capsys, tmp_path):
    """On `copy` (the default on the embedded model) the fault asks for the person's mood,
    and the harmless sibling for the name only: prompts the 0.5B obeys without passing the
    number on, where it repeats the whole sentence when told to "Copy the first word" or to
    "Say who the sentence is about". The scripted run sends those prompts, the fault's
    outputs carry no number, and the probes still name it."""
    rows = run(monkeypatch, capsys, "--task", "copy", "--keep", str(tmp_path), "chain2",
               "through_function")
    assert [(r["graph"], r["named"]["probes"]) for r in rows] == [
        ("chain2", "fault"), ("through_function", "fault")]
    with duckdb.connect(str(tmp_path / "through_function.duckdb"), read_only=True) as con:
        harmless = con.execute(
            "SELECT DISTINCT json_extract_string(messages, '$[0].content') || "
            "json_extract_string(messages, '$[1].content') FROM llm_calls WHERE node_id = "
            "'text_note' AND purpose = 'forward' AND step = 0").fetchall()
    assert harmless and all("What is the person's name? Reply with the name only." in text
                            for (text,) in harmless)
    # it reads the name alone, never the sentence: it cannot carry the number on
    assert all(not any(ch.isdigit() for ch in text) for (text,) in harmless)
    names = "|".join(attribution.NAMES)
    assert all(re.search(rf'<input name="name">\s*({names})\s*</input>', text)
               for (text,) in harmless)
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        sent = con.execute("SELECT DISTINCT json_extract_string(messages, '$[0].content') || "
                           "json_extract_string(messages, '$[1].content') FROM llm_calls "
                           "WHERE node_id = 'fault' AND purpose = 'forward' AND step = 0"
                           ).fetchall()
        outputs = [o for (o,) in con.execute(
            "SELECT output_text FROM node_outputs WHERE node_id = 'fault' AND step = 0"
        ).fetchall()]
    assert sent and all("How does the person feel? Answer in one short sentence about their "
                        "mood." in text for (text,) in sent)
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        last = con.execute("SELECT DISTINCT json_extract_string(messages, '$[1].content') "
                           "FROM llm_calls WHERE node_id = 'total' AND purpose = 'forward'"
                           ).fetchall()
    # the last step's prompt the 0.5B follows on a diamond's two copies and on bare digits
    assert last and all("Copy the number written in your inputs. Reply with that number "
                        "only, or 0 if there is none." in text for (text,) in last)
    assert len(outputs) == 12 and not any(ch.isdigit() for o in outputs for ch in o)


def test_two_faults_is_right_only_as_a_tie_on_both_culprits(monkeypatch, capsys, tmp_path):
    """Either planted fault's repair alone passes the numbers on, so the probes tie on the
    two; the benchmark scores that tie right because it is exactly the planted pair."""
    rows = run(monkeypatch, capsys, "--keep", str(tmp_path), "two_faults")
    assert rows[0]["named"]["probes"] == "fault_a or fault_b"
    assert rows[0]["right"]["probes"] is True
    assert "a tie: the 90% intervals of fault_a and fault_b" in rows[0]["reason"]
    # `engine blame` on the same run says so, and marks both rows
    from engine.cli import main
    from engine.llm.scripted import ScriptedBackend

    monkeypatch.setattr("engine.llm.factory.make_backend", lambda *a, **k: ScriptedBackend(
        responder=attribution.planted_fault_responder()))
    assert main(["blame", "two_faults", "--db", str(tmp_path / "two_faults.duckdb")]) == 0
    shown = capsys.readouterr().out
    assert "probes blame: fault_a or fault_b (" in shown
    assert shown.count("<- probes (tie)") == 2


def test_a_tie_is_right_only_on_exactly_the_planted_culprits():
    from engine.probes.verdict import Verdict

    both = {"fault_a", "fault_b"}
    assert attribution.is_right(Verdict(None, "", tied=["fault_a", "fault_b"]), both)
    assert not attribution.is_right(Verdict(None, "", tied=["fault_a", "total"]), both)
    assert not attribution.is_right(Verdict(None, "", tied=["fault", "who"]), {"fault"})
    assert attribution.is_right(Verdict("fault_b", ""), both)
    assert not attribution.is_right(Verdict(None, ""), {"fault"})


def test_reblame_blames_the_kept_runs_again_without_running_their_steps(
        monkeypatch, capsys, tmp_path):
    run(monkeypatch, capsys, "--keep", str(tmp_path), "chain2")
    db = str(tmp_path / "chain2.duckdb")

    def counts() -> tuple:
        with duckdb.connect(db, read_only=True) as con:
            return con.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM "
                               "steps), (SELECT count(*) FROM updates)").fetchone()
    before = counts()
    rows = run(monkeypatch, capsys, "--keep", str(tmp_path), "--reblame", "chain2")
    assert [(r["graph"], r["named"]["probes"]) for r in rows] == [("chain2", "fault")]
    assert counts() == before  # no step ran again
    monkeypatch.setattr(sys, "argv", ["attribution.py", "--keep", str(tmp_path / "none"),
                                      "--reblame", "chain3"])
    with pytest.raises(SystemExit) as stop:
        attribution.main()
    assert stop.value.code == 2
    assert "no run to blame again in" in capsys.readouterr().err


def test_a_model_that_dies_mid_run_ends_in_one_line_and_keeps_what_was_scored(
        monkeypatch, capsys, tmp_path):
    from engine.llm.base import LLMError

    real_one = attribution.one

    async def dies_on_chain3(name, *args):
        if name == "chain3":
            raise LLMError("local: llama-server exited (status -9)")
        return await real_one(name, *args)

    monkeypatch.setattr(attribution, "one", dies_on_chain3)
    monkeypatch.setattr(sys, "argv", ["attribution.py", "--keep", str(tmp_path), "chain2",
                                      "chain3", "chain4"])
    assert attribution.main() == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error:")]
    assert errors == [f"error: chain3: local: llama-server exited (status -9) (stopped there: "
                      f"the graphs before it are scored below; the run logs are kept in "
                      f"{tmp_path})"]
    assert "Traceback" not in captured.err
    table = [line.split()[0] for line in captured.out.splitlines()]
    assert "chain2" in table and "chain3" not in table and "chain4" not in table
    assert (tmp_path / "chain2.duckdb").exists() and not (tmp_path / "chain4.duckdb").exists()


def test_proposals_n_gives_each_graphs_step_n_candidates(monkeypatch, capsys, tmp_path):
    rows = run(monkeypatch, capsys, "--proposals", "2", "--keep", str(tmp_path), "chain2")
    assert rows[0]["named"]["probes"] == "fault"
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        assert con.execute("SELECT DISTINCT config->>'proposals' FROM runs").fetchall() \
            == [("2",)]
        candidates = con.execute("SELECT DISTINCT candidate FROM updates ORDER BY 1").fetchall()
    assert candidates == [(0,), (1,)]


def test_step_method_gtbp_runs_each_graphs_step_by_target_propagation(
        monkeypatch, capsys, tmp_path):
    rows = run(monkeypatch, capsys, "--step-method", "gtbp", "--keep", str(tmp_path), "chain2")
    assert rows[0]["graph"] == "chain2"
    with duckdb.connect(str(tmp_path / "chain2.duckdb"), read_only=True) as con:
        assert con.execute("SELECT DISTINCT config->>'method' FROM runs").fetchall() \
            == [("gtbp",)]
        # the step's backward calls asked for targets (GTBP's templates), not critiques
        asked = [m for (m,) in con.execute(
            "SELECT messages FROM llm_calls WHERE step = 1 AND purpose = 'backward'")
            .fetchall()]
    assert asked and all("target output" in m for m in asked)
