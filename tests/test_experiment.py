"""The experiment harness end to end: the smoke plan with the scripted backend against the
shared benchmark data, the estimate and confirmation, skipping finished runs, plan errors."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from engine import cli
from engine.core.graph import load_graph
from engine.experiment import (
    Cell,
    PlanError,
    backward_calls_per_example,
    estimate_run,
    expand,
    finished_runs,
    load_plan,
    prepare,
)
from engine.runs.execute import RunConfig

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "datasets"
SMOKE = ROOT / "benchmarks" / "plans" / "smoke.yaml"
PAPER = ROOT / "benchmarks" / "plans" / "paper.yaml"
LIAR_VARIANTS = ("full", "no-gradients", "no-sibling", "one-at-a-time", "no-gate", "textgrad")
BBH_TASKS = ("boolean_expressions", "navigate", "sports_understanding")

pytestmark = pytest.mark.skipif(not (DATA / "bbh").is_dir(),
                                reason=f"benchmark data not found at {DATA}")


def experiment(*args: str, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
    """`python -m engine experiment ...` in-process: (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = stdin or io.StringIO("")
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main(["experiment", *args])
    finally:
        sys.stdin = old_stdin
    return code, out.getvalue(), err.getvalue()


def smoke_args(db: Path, out: Path, *extra: str) -> list[str]:
    return [str(SMOKE), "--backend", "scripted", "--data-dir", str(DATA), "--db", str(db),
            "--out", str(out), "--concurrency", "8", *extra]


def runs_in(db: Path) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT run_id, status, config FROM runs ORDER BY run_id").fetchall()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke plan run once with --yes; later tests read its files and run log."""
    tmp = tmp_path_factory.mktemp("smoke")
    db, out = tmp / "runs.duckdb", tmp / "results"
    code, stdout, stderr = experiment(*smoke_args(db, out, "--yes"))
    assert code == 0, stderr
    return {"db": db, "out": out, "stdout": stdout, "stderr": stderr, "tmp": tmp}


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# --- the smoke plan end to end ---------------------------------------------------------


def test_estimate_is_printed_before_running(smoke):
    stdout = smoke["stdout"]
    assert "Estimate" in stdout and "total" in stdout
    for entry in ("bbh", "gsm8k", "liar"):
        assert f"│ {entry}" in stdout
    assert "14 to run" in stdout
    assert stdout.index("Estimate") < stdout.index("| entry | set |")


def test_results_have_a_row_per_entry_group_and_method(smoke):
    rows = read_csv(smoke["out"] / "results.csv")
    keys = {(r["entry"], r["level"], r["set"].split(" (")[0], r["variant"]) for r in rows}
    expected = {("bbh", "nlp", "BBH NLP", m) for m in ("semantic", "textgrad")}
    expected |= {("bbh", "algorithmic", "BBH algorithmic", m) for m in ("semantic", "textgrad")}
    expected |= {("bbh", "task", t, m) for t in BBH_TASKS for m in ("semantic", "textgrad")}
    expected |= {("gsm8k", "entry", "gsm8k/test", m) for m in ("semantic", "textgrad")}
    expected |= {("liar", "entry", "liar/test", v) for v in LIAR_VARIANTS}
    assert keys == expected and len(rows) == len(expected)
    by_key = {(r["entry"], r["level"], r["variant"]): r for r in rows}
    assert by_key["gsm8k", "entry", "semantic"]["paper_pct"] == "93.2"
    assert by_key["gsm8k", "entry", "textgrad"]["paper_pct"] == "78.2"
    assert by_key["bbh", "nlp", "semantic"]["paper_pct"] == "82.5"
    assert by_key["bbh", "algorithmic", "semantic"]["paper_pct"] == "85.6"
    assert by_key["liar", "entry", "full"]["paper_pct"] == "71.2"
    assert by_key["liar", "entry", "no-gate"]["paper_pct"] == ""
    assert by_key["bbh", "algorithmic", "textgrad"]["runs_planned"] == "2"
    for row in rows:
        assert row["runs_finished"] == row["runs_planned"]
        assert row["test_pct"] != "" and int(row["calls"]) > 0 and int(row["tokens"]) > 0
    # A group's score is the mean of its tasks' scores.
    for method in ("semantic", "textgrad"):
        tasks = [float(r["test_pct"]) for r in rows if r["level"] == "task"
                 and r["variant"] == method and r["set"] != "sports_understanding"]
        assert float(by_key["bbh", "algorithmic", method]["test_pct"]) == \
            pytest.approx(sum(tasks) / len(tasks), abs=0.06)


def test_each_row_has_its_test_examples_and_a_95_interval_over_them(smoke):
    """n is every test example the row's runs scored; the interval is Wilson's at 95% over
    them, pooled (checked against the losses table, not the harness's own sums)."""
    from engine.data.stats import Z95, wilson

    rows = list(csv.DictReader((smoke["out"] / "results.csv").open(encoding="utf-8")))
    with duckdb.connect(str(smoke["db"]), read_only=True) as con:
        for row in (r for r in rows if r["level"] == "entry"):
            ids = row["run_ids"].split()
            n, passed = con.execute("""SELECT count(*), sum(score) FROM losses
                WHERE split = 'test' AND list_contains(?, run_id)""", [ids]).fetchone()
            assert int(row["test_n"]) == n > 0
            low, high = wilson(passed, n, Z95)
            assert (float(row["test_low_pct"]), float(row["test_high_pct"])) == (
                round(100 * low, 1), round(100 * high, 1))
            assert float(row["test_low_pct"]) <= float(row["test_pct"]) <= \
                float(row["test_high_pct"])
            assert row["per_run_test_pct"].split() == [
                f"{100 * s:.1f}" for (s,) in con.execute(
                    """SELECT avg(score) FROM losses WHERE split = 'test'
                       AND list_contains(?, run_id) GROUP BY run_id
                       ORDER BY list_position(?, run_id)""", [ids, ids]).fetchall()]
    text = (smoke["out"] / "results.md").read_text(encoding="utf-8")
    gsm = next(r for r in rows if r["entry"] == "gsm8k" and r["variant"] == "semantic")
    assert f"| {gsm['test_n']} | {float(gsm['test_low_pct']):.1f}–" in text


def test_results_markdown_puts_paper_figures_beside_ours(smoke):
    text = (smoke["out"] / "results.md").read_text(encoding="utf-8")
    assert text.startswith("# Results: plan `smoke`")
    assert "| entry | set | method | test % | n | test 95% | per run | paper % |" in text
    assert "| bbh | BBH NLP (1 task) | semantic |" in text
    assert "| bbh | BBH algorithmic (2 tasks) | semantic |" in text
    assert "| liar | liar/test | no-gate (semantic, no gate) |" in text
    assert "| liar | liar/test | one-at-a-time (semantic, one prompt at a time) |" in text
    assert "## BBH per task" in text and "| bbh | navigate | textgrad |" in text
    for figure in ("93.2", "78.2", "82.5", "85.6", "71.2"):
        assert f"| {figure} |" in text
    # which TextGrad stands beside the paper's figure, and whose update step
    assert "| gsm8k | gsm8k/test | textgrad \u2020 | " in text
    assert "- The paper's 78.2% for TextGrad on gsm8k/test stands beside `textgrad`." in text
    assert "- `textgrad`: the paper's formal description of TextGrad" in text
    assert "not TextGrad's optimizer" in text


def test_every_run_is_in_the_run_log_with_its_protocol(smoke):
    runs = runs_in(smoke["db"])
    assert len(runs) == 14
    assert all(status == "finished" and run_id.startswith("exp.smoke.")
               for run_id, status, _ in runs)
    configs = {run_id.split(".")[3] if ".liar." in run_id else run_id: json.loads(config)
               for run_id, _, config in runs}
    assert configs["full"]["method"] == "semantic"
    assert configs["no-gradients"]["method"] == "none"
    assert configs["no-sibling"]["method"] == "semantic-nosibling"
    assert configs["one-at-a-time"]["update_mode"] == "one"
    assert configs["no-gate"]["gate"] is False
    assert configs["textgrad"]["method"] == "textgrad"
    with duckdb.connect(str(smoke["db"]), read_only=True) as con:
        tested = con.execute("SELECT count(DISTINCT run_id) FROM metrics "
                             "WHERE key = 'test_score'").fetchone()[0]
        # GSM8K and LIAR test on their own test split; train and validation come from train.
        splits = con.execute("""
            SELECT split, list(DISTINCT split_part(example_id, '-', 1)) FROM examples
            WHERE starts_with(run_id, 'exp.smoke.gsm8k.') GROUP BY split""").fetchall()
        bbh_test = con.execute("""
            SELECT count(*) FROM examples WHERE split = 'test'
            AND starts_with(run_id, 'exp.smoke.bbh.navigate.semantic.')""").fetchone()[0]
    assert tested == 14
    assert {s: sorted(p) for s, p in splits} == {"train": ["train"], "val": ["train"],
                                                 "test": ["test"]}
    assert bbh_test == 2


def test_rerun_skips_finished_runs_without_asking(smoke, tmp_path):
    before = runs_in(smoke["db"])
    code, stdout, stderr = experiment(*smoke_args(smoke["db"], tmp_path / "again"))
    assert code == 0, stderr
    assert "0 to run" in stdout and "Proceed" not in stderr
    assert runs_in(smoke["db"]) == before
    rows = read_csv(tmp_path / "again" / "results.csv")
    old = read_csv(smoke["out"] / "results.csv")
    assert [r["run_ids"] for r in rows] == [r["run_ids"] for r in old]


def test_a_changed_protocol_is_not_taken_for_a_finished_run(smoke):
    plan = load_plan(SMOKE)
    cells = [c for c in expand(plan, str(DATA)) if c.entry.name == "gsm8k"]
    base = RunConfig(graph="", backend="scripted", db=str(smoke["db"]), data_dir=str(DATA))
    prepare(cells, base)
    finished_runs(str(smoke["db"]), cells)
    assert all(c.run_id for c in cells)
    cells[0].config.steps = 2
    cells[0].run_id = None
    finished_runs(str(smoke["db"]), cells[:1])
    assert cells[0].run_id is None


def test_an_embedded_run_is_found_again_under_the_optimizer_it_pairs_with(monkeypatch):
    """A run on the embedded 0.5B records the 1.5B as its optimizer (execute pairs them):
    the harness must expect that pair, or a re-run of the plan never finds its runs."""
    from engine.experiment.cells import resolved_models

    monkeypatch.setattr("engine.llm.models.paired_optimizer", lambda m: (
        ("qwen2.5-coder-1.5b", None) if m == "qwen2.5-coder-0.5b" else (None, None)))
    local = RunConfig(graph="", backend="local")
    assert resolved_models(local) == ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    assert resolved_models(RunConfig(graph="", backend="local", model="smollm2-135m")) == \
        ("smollm2-135m", "smollm2-135m")
    assert resolved_models(RunConfig(graph="", backend="local", optimizer_model="m")) == \
        ("qwen2.5-coder-0.5b", "m")
    assert resolved_models(RunConfig(graph="", backend="local", optimizer_backend="openai")
                           ) == ("qwen2.5-coder-0.5b", "gpt-4o-mini")


def test_methods_filter_and_limit_tasks_run_only_what_is_asked(tmp_path):
    db = tmp_path / "runs.duckdb"
    code, stdout, stderr = experiment(*smoke_args(db, tmp_path / "r", "--yes", "--methods",
                                                  "textgrad", "--limit-tasks", "1"))
    assert code == 0, stderr
    run_ids = [r[0] for r in runs_in(db)]
    assert len(run_ids) == 3 and all(".textgrad." in r for r in run_ids)
    assert any(r.startswith("exp.smoke.bbh.boolean_expressions.") for r in run_ids)
    rows = {(r["entry"], r["level"], r["variant"]): r
            for r in read_csv(tmp_path / "r" / "results.csv")}
    assert rows["gsm8k", "entry", "semantic"]["runs_finished"] == "0"
    assert rows["gsm8k", "entry", "semantic"]["test_pct"] == ""
    assert rows["gsm8k", "entry", "textgrad"]["runs_finished"] == "1"


# --- confirmation -----------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_refuses_without_yes_when_stdin_is_not_a_terminal(tmp_path):
    db = tmp_path / "runs.duckdb"
    code, stdout, stderr = experiment(*smoke_args(db, tmp_path / "r"),
                                      stdin=io.StringIO("y\n"))
    assert code == 2
    assert "Estimate" in stdout
    assert stderr.strip().count("\n") == 0
    assert stderr.startswith("error: not confirmed") and "--yes" in stderr
    assert not db.exists() and not (tmp_path / "r").exists()


def test_no_at_the_terminal_starts_nothing(tmp_path):
    db = tmp_path / "runs.duckdb"
    code, _, stderr = experiment(*smoke_args(db, tmp_path / "r"), stdin=Terminal("n\n"))
    assert code == 1
    assert "Proceed? [y/N]" in stderr and "not started" in stderr
    assert not db.exists()


# --- plan validation --------------------------------------------------------------------

GOOD_ENTRY = ("  - name: g\n    graph: sample_graphs/gsm8k.yaml\n    dataset: gsm8k/train\n"
              "    methods: [semantic]\n")


@pytest.mark.parametrize("text, message", [
    ("entries:\n" + GOOD_ENTRY + "    stpes: 4\n", "entry 'g': unknown key 'stpes'"),
    ("entries:\n  - name: g\n    graph: sample_graphs/nope.yaml\n    methods: [semantic]\n",
     "entry 'g': graph 'sample_graphs/nope.yaml' not found"),
    ("entries:\n  - name: g\n    methods: [semantic]\n", "entry 'g': missing 'graph'"),
    ("entries:\n" + GOOD_ENTRY.replace("[semantic]", "[semantic, sgd]"),
     "entry 'g': unknown method 'sgd'"),
    ("entries:\n" + GOOD_ENTRY.replace("methods: [semantic]",
                                       "variants:\n      - {name: a, method: magic}"),
     "unknown method 'magic'"),
    ("entries:\n" + GOOD_ENTRY + "    paper: {semantc: 90}\n", "'paper' label 'semantc'"),
    ("entries:\n" + GOOD_ENTRY + "    update_mode: some\n", "'update_mode' must be one of"),
    ("colour: red\nentries:\n" + GOOD_ENTRY, "unknown key 'colour'"),
    ("entries: []\n", "'entries' must be a non-empty list"),
    ("entries:\n" + GOOD_ENTRY + "    train: 999999\n", "entry 'g': asked for 999999 train"),
    ("entries: [\n", "YAML syntax error"),
])
def test_plan_errors_are_one_line_with_status_2(tmp_path, monkeypatch, text, message):
    monkeypatch.chdir(ROOT)
    plan = tmp_path / "bad.yaml"
    plan.write_text(text, encoding="utf-8")
    code, _, stderr = experiment(str(plan), "--backend", "scripted", "--data-dir", str(DATA),
                                 "--db", str(tmp_path / "runs.duckdb"), "--yes")
    assert code == 2
    assert stderr.startswith("error: ") and stderr.strip().count("\n") == 0
    assert message in stderr
    assert not (tmp_path / "runs.duckdb").exists()


def test_unknown_methods_filter_is_an_error(tmp_path):
    code, _, stderr = experiment(*smoke_args(tmp_path / "db.duckdb", tmp_path / "r",
                                             "--methods", "sgd"))
    assert code == 2 and "--methods: 'sgd'" in stderr


def test_plan_error_from_the_command_line(tmp_path):
    plan = tmp_path / "bad.yaml"
    plan.write_text("entries:\n  - name: g\n    graph: sample_graphs/gsm8k.yaml\n"
                    "    methods: [nope]\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "engine", "experiment", str(plan), "--yes",
                           "--backend", "scripted", "--db", str(tmp_path / "x.duckdb")],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "unknown method 'nope'" in done.stderr


# --- the paper's plan and the estimate --------------------------------------------------


def test_paper_plan_expands_to_every_bbh_task_and_the_ablations():
    plan = load_plan(PAPER)
    cells = expand(plan, str(DATA))
    tasks = sorted(p.stem for p in (DATA / "bbh").glob("*.json"))
    bbh = [c for c in cells if c.entry.name == "bbh"]
    assert sorted({c.task for c in bbh}) == tasks
    assert len(bbh) == 2 * len(tasks)
    liar = {c.variant.name: c.variant for c in cells if c.entry.name == "liar"}
    assert set(liar) == set(LIAR_VARIANTS)
    assert liar["one-at-a-time"].update_mode == "one" and not liar["no-gate"].gate
    assert {c.entry.steps for c in cells if c.entry.name == "liar"} == {8}
    gsm8k = next(c.entry for c in cells if c.entry.name == "gsm8k")
    assert (gsm8k.train, gsm8k.test, gsm8k.test_dataset) == (128, None, "gsm8k/test")
    assert len([c for c in expand(plan, str(DATA), limit_tasks=2) if c.task]) == 4
    with pytest.raises(PlanError, match="no BBH task files"):
        expand(plan, str(ROOT / "no-such-dir"))


def test_paper_plan_tests_on_the_rest_and_on_full_test_splits():
    plan = load_plan(PAPER)
    cells = [c for c in expand(plan, str(DATA), limit_tasks=1) if c.seed == 0]
    cells = [c for c in cells if c.variant.name in ("semantic", "full")]
    prepare(cells, RunConfig(graph="", backend="scripted", data_dir=str(DATA)))
    by_entry = {c.entry.name: c for c in cells}
    bbh = by_entry["bbh"].splits
    assert (len(bbh.train), len(bbh.val), len(bbh.test)) == (20, 20, 250 - 40)
    assert len(by_entry["gsm8k"].splits.test) == 1319 and by_entry["gsm8k"].config.test == 1319
    assert len(by_entry["gsm8k"].splits.train) == 128
    assert {e.id.split("-")[0] for e in by_entry["gsm8k"].splits.test} == {"test"}


def test_estimate_counts_calls_per_method():
    graph = load_graph(ROOT / "sample_graphs" / "bbh.yaml")
    assert backward_calls_per_example(graph, "semantic") == 1  # one joint call at `final`
    assert backward_calls_per_example(graph, "textgrad") == 2  # one per (final, hint) pair
    assert backward_calls_per_example(graph, "none") == 0
    two = load_graph(ROOT / "sample_graphs" / "two_successors.yaml")
    assert backward_calls_per_example(two, "gtbp") == 4  # 3 input calls, 1 combine at `numbers`
    prices = {"m": (1.0, 2.0)}

    def est(method: str, update_mode: str = "all"):
        config = RunConfig(graph="", method=method, steps=4, update_mode=update_mode,
                           node_gates="auto")  # the gates' calls counted too (off by default)
        return estimate_run(graph, config, 20, 20, 210, ("m", "m"), prices)

    semantic = est("semantic")
    # every LLM node on every evaluated example, and the per-node gates: each of the three
    # edits alone adds 5 node calls per validation example (as engine/runs/estimate.py)
    assert semantic.forward_calls == 3 * (5 * 40 + 210) + 4 * 20 * 5
    # k=2 backward calls (a repair call each, at most) and 3 updates per step
    assert semantic.optimizer_calls == 4 * (2 * 1 * 2 + 3)
    assert est("textgrad").optimizer_calls == 4 * (2 * 2 * 2 + 3)
    assert est("none").optimizer_calls == 4 * 3
    assert est("semantic", "one").optimizer_calls == 4 * (2 * 2 + 1)
    assert est("semantic", "one").forward_calls == 3 * (5 * 40 + 210)  # one edit: no gates
    assert semantic.cost == pytest.approx((1630 * (600 + 400) + 28 * (1500 + 800)) / 1e6)
    assert estimate_run(graph, RunConfig(graph=""), 1, 1, 1, ("unknown", "m"), prices).cost \
        is None


def test_cells_have_distinct_run_id_prefixes():
    cells = expand(load_plan(PAPER), str(DATA))
    prefixes = [c.prefix for c in cells]
    assert len(set(prefixes)) == len(prefixes)
    assert not any(a != b and b.startswith(a) for a in prefixes for b in prefixes)
    assert isinstance(cells[0], Cell)


# --- the graph's own settings -----------------------------------------------------------

DEMO_ENTRY = ("entries:\n  - name: d\n    graph: sample_graphs/demo.yaml\n"
              "    methods: [semantic]\n    train: 4\n    val: 4\n    test: 2\n")


def test_an_entry_runs_at_the_graphs_own_steps_and_candidates(tmp_path, monkeypatch):
    """The demo graph sets `steps: 1` and `proposals: 2`; an entry that says neither runs
    as `run` would (one step, two candidate prompt sets), and one that says them wins."""
    monkeypatch.chdir(ROOT)
    plan = tmp_path / "demo.yaml"
    plan.write_text(DEMO_ENTRY, encoding="utf-8")
    db = tmp_path / "runs.duckdb"
    code, _, stderr = experiment(str(plan), "--backend", "scripted", "--db", str(db),
                                 "--out", str(tmp_path / "r"), "--yes")
    assert code == 0, stderr
    [(run_id, status, config)] = runs_in(db)
    assert status == "finished"
    assert (json.loads(config)["steps"], json.loads(config)["proposals"]) == (1, 2)
    with duckdb.connect(str(db), read_only=True) as con:
        candidates = con.execute("SELECT DISTINCT candidate FROM updates WHERE run_id = ? "
                                 "ORDER BY 1", [run_id]).fetchall()
    assert candidates == [(0,), (1,)]
    plan.write_text(DEMO_ENTRY + "    steps: 2\n    proposals: 1\n", encoding="utf-8")
    [entry] = load_plan(plan).entries
    assert (entry.steps, entry.proposals) == (2, 1)
    # a run at two candidates is not taken for the plan's run at one
    cells = expand(load_plan(plan), str(DATA))
    prepare(cells, RunConfig(graph="", backend="scripted", db=str(db)))
    cells[0].config.steps = 1
    finished_runs(str(db), cells)
    assert cells[0].run_id is None


def test_an_entry_on_a_graph_without_settings_keeps_four_steps_and_one_candidate(
        tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    plan = tmp_path / "plain.yaml"
    plan.write_text("entries:\n" + GOOD_ENTRY, encoding="utf-8")
    [entry] = load_plan(plan).entries
    assert (entry.steps, entry.proposals) == (4, 1)


def test_zero_candidates_is_a_plan_error(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    plan = tmp_path / "bad.yaml"
    plan.write_text(DEMO_ENTRY + "    proposals: 0\n", encoding="utf-8")
    with pytest.raises(PlanError, match="entry 'd': 'proposals' .* at least 1"):
        load_plan(plan)


def test_the_plan_estimate_is_each_runs_own_estimate_summed(tmp_path, monkeypatch):
    """One fact, one number: the plan's tokens, calls and cost are the `at most` figures of
    the estimate `run` prints for each of its runs (its tokens from the prompts that run
    will send), not fixed averages per call (those said 3.0M tokens for the embedded plan's
    12 demo runs, whose runs then used about 30k each)."""
    from engine.experiment import estimate_table
    from engine.runs.estimate import FORWARD_TOKENS, OPTIMIZER_TOKENS, estimate_for

    monkeypatch.chdir(ROOT)
    plan = tmp_path / "demo.yaml"
    plan.write_text(DEMO_ENTRY.replace("methods: [semantic]", "methods: [semantic, textgrad]"),
                    encoding="utf-8")
    cells = expand(load_plan(plan), str(DATA))
    prepare(cells, RunConfig(graph="", backend="scripted", db=str(tmp_path / "r.duckdb")))
    _, total = estimate_table(cells, cells)
    each = [estimate_for(c.config, load_graph(c.config.graph), c.splits) for c in cells]
    assert total.runs == len(cells) == 2
    assert total.tokens == sum(e.tokens(upper=True) for e in each) > 0
    assert total.forward_calls == sum(e.calls("forward", upper=True) for e in each)
    assert total.optimizer_calls == sum(e.calls("optimizer", upper=True) for e in each)
    fixed = (total.forward_calls * sum(FORWARD_TOKENS)
             + total.optimizer_calls * sum(OPTIMIZER_TOKENS))
    assert total.tokens < fixed / 2  # the demo's calls are a fraction of those averages
