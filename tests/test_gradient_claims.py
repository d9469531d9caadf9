"""What each gradient claims, recorded at backward time: a structured reply's
`asks_change` field ('schema'), else the reading of its text ('text:<reading>'); the
columns a version-4 log gains in place; and blame setting the recorded claims beside the
probes."""

from __future__ import annotations

import duckdb

from engine.core.claims import gradient_claim
from engine.runlog.schema import SCHEMA_VERSION
from engine.runlog.writer import open_for_writing
from tests.support.runlog import log_at_version
from tests.test_blame import logged_run, run_blame
from tests.test_structured import TWO_HINTS, arithmetic_rows, run_engine, write_graph


def gradient_rows(db) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            "SELECT from_node_id, node_id, content, asks_change, claim_source FROM gradients "
            "WHERE kind = 'gradient' ORDER BY step, example_id, node_id, from_node_id"
        ).fetchall()


def test_a_structured_run_records_each_gradients_asks_change_field(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, steps=1)  # structured auto: the scripted backend answers JSON
    inner = [r for r in gradient_rows(db) if r[0] != "loss"]
    assert len({r[1] for r in inner}) >= 2  # both hints received gradients
    assert all(r[4] == "schema" and r[3] is True for r in inner)
    # the loss's feedback is no backward reply: its claim is read from its text
    loss = [r for r in gradient_rows(db) if r[0] == "loss"]
    assert loss and all(r[4].startswith("text:") for r in loss)


def test_a_text_run_records_the_reading_of_each_gradients_text(tmp_path):
    graph = write_graph(tmp_path, TWO_HINTS, arithmetic_rows())
    db = tmp_path / "runs.duckdb"
    run_engine(graph, db, steps=1, structured="off")
    rows = gradient_rows(db)
    assert rows and all(r[4] is not None for r in rows)
    for _, _, content, asks, source in rows:
        assert (asks, source) == (gradient_claim(content)[0],
                                  f"text:{gradient_claim(content)[1]}")


def test_a_version_4_log_gains_the_claim_columns_in_place(tmp_path):
    db = tmp_path / "v4.duckdb"
    log_at_version(db, 4, "gradients", ", asks_change BOOLEAN, claim_source VARCHAR",
                   ("gradients", {"run_id": "r", "node_id": "a", "content": "x"}))
    open_for_writing(db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == \
            SCHEMA_VERSION == 9
        assert con.execute("SELECT node_id, asks_change, claim_source FROM gradients"
                           ).fetchall() == [("a", None, None)]


def test_blame_sets_the_recorded_claims_beside_the_probes(tmp_path):
    db = logged_run(tmp_path)  # honest gradients: the text tells 'who' no change is needed
    with duckdb.connect(db) as con:  # the replies' own fields said otherwise
        con.execute("UPDATE gradients SET asks_change = true, claim_source = 'schema' "
                    "WHERE kind = 'gradient' AND node_id = 'who'")
    report = run_blame(db, examples="sampled")
    who = [c for c in report.claims if c["node"] == "who"]
    assert len(who) == 3 and all(c["asks_change"] for c in who)
    assert all(c["reading"] == "recorded (schema)" for c in who)
    # following 'who''s gradient fixes nothing: the recorded claims disagree all 3 times
    row = {r.node_id: r for r in report.nodes}["who"].as_json()
    assert (row["probed"], row["flips"], row["claimed"], row["claim_agreement"]) == (3, 0, 3, 0)
