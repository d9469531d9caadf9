"""Dataset loaders against the real files in ../shared/datasets, plus .jsonl files, errors,
the optional hub path (with a fake `datasets` module) and split disjointness."""

from __future__ import annotations

import json
import re
import sys
import types
from functools import cache
from pathlib import Path
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.data.datasets import (
    BBH_ALGORITHMIC_TASKS,
    BBH_NLP_TASKS,
    DATA_DIR_ENV,
    DatasetError,
    bbh_tasks,
    load_examples,
    with_target,
)
from engine.data.examples import Example, SplitError, split_examples

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "datasets"
BBH_FILES = sorted((DATA / "bbh").glob("*.json")) if DATA.is_dir() else []
BBH_PARAMS = [pytest.param(p, id=p.stem) for p in BBH_FILES] or [pytest.param(
    None, marks=pytest.mark.skip(reason=f"no BBH task files found in {DATA / 'bbh'}"))]
LIAR_FILES = ("train", "valid", "test")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test may reach the Hugging Face hub or depend on the caller's environment."""
    monkeypatch.setitem(sys.modules, "datasets", None)
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)


@pytest.fixture
def data_dir() -> str:
    if not DATA.is_dir():
        pytest.skip(f"benchmark data not found at {DATA} (expected ../shared/datasets)")
    return str(DATA)


@cache
def _load(spec: str) -> list[Example]:
    return load_examples(spec, data_dir=str(DATA))


def _raw_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())


# --- BBH ---------------------------------------------------------------------------------


@pytest.mark.parametrize("path", BBH_PARAMS)
def test_every_bbh_task_file_loads(path: Path):
    raw = json.loads(path.read_text(encoding="utf-8"))["examples"]
    examples = load_examples(f"bbh/{path.stem}", data_dir=str(path.parents[1]))
    assert len(examples) == len(raw) > 0
    assert [e.id for e in examples] == [f"{path.stem}-{i}" for i in range(len(raw))]
    for example, row in zip(examples, raw, strict=True):
        assert example.target == row["target"] and example.target.strip()
        assert example.fields["input"] == row["input"] and example.fields["input"].strip()
        assert example.fields["target"] == example.target
    assert with_target(examples, "target") == examples


def test_bbh_folder_has_files(data_dir):
    assert len(BBH_FILES) >= 20


def test_bbh_tasks_lists_the_files_present(data_dir):
    assert bbh_tasks(data_dir) == [p.stem for p in BBH_FILES]
    assert set(bbh_tasks(data_dir)) <= set(BBH_NLP_TASKS) | set(BBH_ALGORITHMIC_TASKS)


def test_bbh_tasks_reads_environment_variable(data_dir, monkeypatch, tmp_path):
    assert bbh_tasks(None) == []
    monkeypatch.setenv(DATA_DIR_ENV, data_dir)
    assert bbh_tasks() == [p.stem for p in BBH_FILES]
    assert bbh_tasks(tmp_path) == []


def test_bbh_groups_cover_all_27_tasks_once():
    assert len(BBH_NLP_TASKS) == 12 and len(BBH_ALGORITHMIC_TASKS) == 15
    assert not set(BBH_NLP_TASKS) & set(BBH_ALGORITHMIC_TASKS)
    assert len(set(BBH_NLP_TASKS) | set(BBH_ALGORITHMIC_TASKS)) == 27
    for missing_here in ("dyck_languages", "word_sorting", "web_of_lies"):
        assert missing_here in BBH_ALGORITHMIC_TASKS
    assert "penguins_in_a_table" in BBH_NLP_TASKS


def test_bbh_task_not_in_folder_is_handled_like_any_other(tmp_path):
    (tmp_path / "bbh").mkdir()
    rows = [{"input": "((", "target": ") )"}, {"input": "x", "target": "7"}]
    (tmp_path / "bbh" / "new_task.json").write_text(json.dumps({"examples": rows}))
    examples = load_examples("bbh/new_task", data_dir=str(tmp_path))
    assert [(e.id, e.target) for e in examples] == [("new_task-0", ") )"), ("new_task-1", "7")]
    assert bbh_tasks(tmp_path) == ["new_task"]


# --- GSM8K -------------------------------------------------------------------------------


@pytest.mark.parametrize("split, rows", [("train", 7473), ("test", 1319)])
def test_gsm8k_files_load(data_dir, split, rows):
    examples = _load(f"gsm8k/{split}")
    assert len(examples) == _raw_lines(DATA / "gsm8k" / f"{split}.jsonl") == rows
    assert len({e.id for e in examples}) == len(examples)
    assert examples[17].id == f"{split}-17"
    for e in examples:
        assert re.fullmatch(r"-?\d+(\.\d+)?", e.target), e
        assert e.fields["answer"] == e.target
        assert "solution" not in e.fields  # it ends in the answer; never readable
        assert e.fields["question"].strip()


def test_gsm8k_first_rows_and_combined(data_dir):
    train, test = _load("gsm8k/train"), _load("gsm8k/test")
    assert train[0].target == "72" and "Natalia" in train[0].fields["question"]
    both = _load("gsm8k")
    assert [e.id for e in both] == [e.id for e in train] + [e.id for e in test]
    assert len({e.id for e in both}) == len(both)


def test_gsm8k_removes_thousands_separators(tmp_path):
    (tmp_path / "gsm8k").mkdir()
    row = {"question": "How much?", "answer": "It costs 1,200.\n#### 1,200"}
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps(row) + "\n")
    [example] = load_examples("gsm8k/test", data_dir=str(tmp_path))
    assert example.target == "1200" and example.fields == {"question": "How much?",
                                                           "answer": "1200"}


# --- LIAR --------------------------------------------------------------------------------


@pytest.mark.parametrize("split", LIAR_FILES)
def test_liar_files_keep_true_and_false_only(data_dir, split):
    examples = _load(f"liar/{split}")
    raw = _raw_lines(DATA / "liar" / f"{split}.tsv")
    assert 0.2 * raw < len(examples) < 0.5 * raw
    assert len({e.id for e in examples}) == len(examples)
    assert {e.target for e in examples} == {"Yes", "No"}
    for e in examples:
        assert e.fields["is_lie"] == e.target
        assert e.fields["statement"].strip() and e.fields["speaker"].strip()
        assert not e.id.endswith(".json")
        assert set(e.fields) == {"statement", "subject", "speaker", "job_title", "state",
                                 "party", "context", "is_lie"}  # no 6-way label
        for name in ("statement", "job_title", "state", "party", "context"):
            letters = "".join(ch for ch in e.fields[name] if ch.isalpha()).lower()
            assert letters not in ("", "none"), (e.id, name)  # the reference's rule


def test_liar_exact_counts_and_combined(data_dir):
    counts = [len(_load(f"liar/{s}")) for s in LIAR_FILES]
    # true/false statements whose statement, job title, state, party and context are all
    # present (the reference drops the others); 3681, 432, 461 before that
    assert counts == [2343, 276, 296]
    both = _load("liar")
    assert len(both) == sum(counts) and len({e.id for e in both}) == len(both)
    first = both[0]
    assert first.id == "2635" and first.target == "Yes"
    assert first.fields["speaker"] == "dwayne-bohac" and first.fields["party"] == "republican"


def test_liar_quotes_are_text_and_line_breaks_join_rows(tmp_path):
    (tmp_path / "liar").mkdir()
    counts = "\t0\t1\t0\t0\t0\t"
    lines = [
        '1.json\tfalse\t"Quoted" start and an odd " quote\ttax\tann\tMayor\tOhio\tdemocrat'
        + counts + "a speech",
        "2.json\ttrue\tFirst line of a statement\nsecond line\teconomy\tbob\tSenator\tIowa\t"
        "green" + counts + "a tweet",
        "3.json\thalf-true\tIgnored\tx\ty\t\t\tnone" + counts + "a post",
    ]
    (tmp_path / "liar" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    first, second = load_examples("liar/test", data_dir=str(tmp_path))
    assert first.fields["statement"] == '"Quoted" start and an odd " quote'
    assert (first.id, first.target) == ("1", "Yes")
    assert second.fields["statement"] == "First line of a statement\nsecond line"
    assert (second.id, second.target, second.fields["context"]) == ("2", "No", "a tweet")


def test_liar_drops_statements_with_a_missing_field_as_the_reference_does(tmp_path):
    (tmp_path / "liar").mkdir()
    counts = "\t0\t1\t0\t0\t0\t"
    full = ["Taxes went up", "tax", "ann", "Mayor", "Ohio", "democrat"]
    rows = [[f"{i}.json", "false", *full] for i in range(6)]
    rows[1][5] = ""  # no job title
    rows[2][6] = "None"  # state 'none'
    rows[3][7] = "none."  # party: letters spell none
    rows[4][2] = "..."  # a statement with no letters
    lines = ["\t".join(r) + counts + ("a speech" if i != 5 else "none") for i, r in
             enumerate(rows)]
    lines.append("\t".join(["6.json", "true", *full]) + counts + "a speech")
    (tmp_path / "liar" / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    kept = load_examples("liar/test", data_dir=str(tmp_path))
    assert [e.id for e in kept] == ["0", "6"]  # row 5's context is 'none'
    assert "label" not in kept[0].fields


def test_liar_bad_row_names_file_and_line(tmp_path):
    (tmp_path / "liar").mkdir()
    (tmp_path / "liar" / "valid.tsv").write_text("1.json\tfalse\tonly three\n")
    with pytest.raises(DatasetError, match=r"valid\.tsv:1: expected 14"):
        load_examples("liar/valid", data_dir=str(tmp_path))


# --- .jsonl files ------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list) -> None:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")


def test_jsonl_uses_id_column_and_stringifies_fields(tmp_path):
    _write_jsonl(tmp_path / "d.jsonl", [
        {"id": "a", "q": "2+2", "n": 4, "ok": True, "x": 1.5, "skip": [1], "none": None},
        {"id": 7, "q": "3+3", "n": 6},
    ])
    first, second = load_examples("d.jsonl", graph_dir=str(tmp_path))
    assert first == Example("a", {"id": "a", "q": "2+2", "n": "4", "ok": "True", "x": "1.5"})
    assert second.id == "7" and second.fields["n"] == "6" and second.target == ""
    assert [e.target for e in with_target([first, second], "n")] == ["4", "6"]


def test_jsonl_without_id_uses_row_index_and_skips_blank_lines(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"q": "a"}\n\n{"q": "b"}\n')
    assert [e.id for e in load_examples(str(tmp_path / "d.jsonl"))] == ["0", "1"]


def test_jsonl_relative_path_resolves_against_graph_dir(tmp_path):
    (tmp_path / "data").mkdir()
    _write_jsonl(tmp_path / "data" / "d.jsonl", [{"id": "r1", "q": "x"}])
    assert load_examples("data/d.jsonl", graph_dir=str(tmp_path))[0].id == "r1"
    with pytest.raises(DatasetError, match="not found: expected"):
        load_examples("data/d.jsonl", graph_dir=str(tmp_path / "elsewhere"))


@pytest.mark.parametrize("text, message", [
    ('{"id": 1}\n{"id": 1}\n', r"d\.jsonl:2: duplicate id '1' \(first on line 1\)"),
    ('{"id": 1}\n{"id": \n', r"d\.jsonl:2: invalid JSON"),
    ('[1, 2]\n', r"d\.jsonl:1: each line must be a JSON object"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, text, message):
    (tmp_path / "d.jsonl").write_text(text)
    with pytest.raises(DatasetError, match=message) as info:
        load_examples(str(tmp_path / "d.jsonl"))
    assert "\n" not in str(info.value)


def test_with_target_names_the_row_without_the_field():
    examples = [Example("r1", {"q": "x", "a": "1"}), Example("r2", {"q": "y"})]
    with pytest.raises(DatasetError, match=r"example 'r2' has no field 'a' \(its fields: q\)"):
        with_target(examples, "a")
    assert with_target(examples[:1], "a")[0] == Example("r1", {"q": "x", "a": "1"}, "1")


# --- lookup and errors -------------------------------------------------------------------


def test_missing_file_error_is_one_clear_line(tmp_path):
    with pytest.raises(DatasetError) as info:
        load_examples("gsm8k", data_dir=str(tmp_path))
    message = str(info.value)
    expected = tmp_path / "gsm8k" / "train.jsonl"
    assert message == (f"dataset 'gsm8k' not found in {tmp_path}: expected {expected}; pass "
                       "--data-dir or install the optional 'datasets' package for the Hugging "
                       "Face hub")


def test_missing_bbh_task_lists_tasks_present(data_dir):
    with pytest.raises(DatasetError, match=r"bbh/no_such_task\.json; tasks present: "
                                           r"boolean_expressions, "):
        load_examples("bbh/no_such_task", data_dir=data_dir)


def test_no_data_dir_and_no_hub_package():
    with pytest.raises(DatasetError, match=r"no data directory given \(--data-dir or "
                                           r"\$SEMBACK_DATA_DIR\)"):
        load_examples("liar")


def test_environment_variable_is_the_default_data_dir(data_dir, monkeypatch):
    monkeypatch.setenv(DATA_DIR_ENV, data_dir)
    assert len(load_examples("bbh/navigate")) == 250


@pytest.mark.parametrize("spec, message", [
    ("mnist", r"unknown dataset 'mnist' \(known: gsm8k, "),
    ("gsm8k/valid", r"unknown split 'valid' of 'gsm8k'"),
    ("liar/dev", r"unknown split 'dev' of 'liar'"),
    ("bbh", r"needs a task name: bbh/<task>"),
    ("bbh/../gsm8k/train", r"needs a task name"),
])
def test_bad_specs(tmp_path, spec, message):
    with pytest.raises(DatasetError, match=message):
        load_examples(spec, data_dir=str(tmp_path))


# --- the optional hub path, with a fake `datasets` module (never the network) -----------


class _FakeHub:
    def __init__(self, tables: dict, fail: bool = False):
        self.tables, self.fail, self.calls = tables, fail, []

    def load_dataset(self, repo, config=None, split=None):
        self.calls.append((repo, config, split))
        if self.fail:
            raise ConnectionError("Couldn't reach the hub\nsecond line")
        return self.tables[(repo, config, split)]


def _install_fake_hub(monkeypatch, hub: _FakeHub) -> None:
    module = types.ModuleType("datasets")
    module.load_dataset = hub.load_dataset
    monkeypatch.setitem(sys.modules, "datasets", module)


def test_hub_fallback_maps_names(monkeypatch, tmp_path):
    hub = _FakeHub({
        ("lukaemon/bbh", "navigate", "test"): [{"input": "Go left.", "target": "No"}],
        ("openai/gsm8k", "main", "train"): [{"question": "1+1?", "answer": "2\n#### 2"}],
        ("openai/gsm8k", "main", "test"): [{"question": "2+2?", "answer": "4\n#### 4"}],
    })
    _install_fake_hub(monkeypatch, hub)
    assert [e.id for e in load_examples("bbh/navigate", data_dir=str(tmp_path))] == [
        "navigate-0"]
    assert [(e.id, e.target) for e in load_examples("gsm8k")] == [("train-0", "2"),
                                                                  ("test-0", "4")]
    assert hub.calls == [("lukaemon/bbh", "navigate", "test"), ("openai/gsm8k", "main", "train"),
                         ("openai/gsm8k", "main", "test")]


def test_hub_liar_uses_label_names(monkeypatch):
    class Table(list):  # stands in for datasets.Dataset: rows plus label names
        features: ClassVar[dict] = {"label": types.SimpleNamespace(
            int2str=lambda i: ["false", "half-true", "mostly-true", "true"][i])}

    row = {"id": "9.json", "statement": "S", "subject": "s", "speaker": "p",
           "job_title": "Mayor", "state_info": "Ohio", "party_affiliation": "green",
           "context": "c"}
    table = Table([{**row, "label": 0}, {**row, "id": "8.json", "label": 1},
                   {**row, "id": "7.json", "label": 3}])
    _install_fake_hub(monkeypatch, _FakeHub({("ucsbnlp/liar", None, "validation"): table}))
    examples = load_examples("liar/valid")
    assert [(e.id, e.target, e.fields["state"]) for e in examples] == [("9", "Yes", "Ohio"),
                                                                       ("7", "No", "Ohio")]


def test_hub_failure_becomes_one_line_dataset_error(monkeypatch):
    _install_fake_hub(monkeypatch, _FakeHub({}, fail=True))
    with pytest.raises(DatasetError) as info:
        load_examples("gsm8k/test")
    assert str(info.value) == ("dataset 'gsm8k/test' is not in the data directory and the "
                               "Hugging Face hub failed: Couldn't reach the hub")


def test_local_files_win_over_the_hub(monkeypatch, data_dir):
    hub = _FakeHub({})
    _install_fake_hub(monkeypatch, hub)
    assert len(load_examples("bbh/snarks", data_dir=data_dir)) == 178
    assert hub.calls == []


# --- splits ------------------------------------------------------------------------------


def test_splits_of_a_real_dataset_are_disjoint_and_seeded(data_dir):
    examples = _load("liar/train")
    splits = split_examples(examples, seed=0, n_train=50, n_val=50, n_test=200)
    ids = [{e.id for e in part} for part in (splits.train, splits.val, splits.test)]
    assert [len(s) for s in ids] == [50, 50, 200]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
    again = split_examples(examples, seed=0, n_train=50, n_val=50, n_test=200)
    assert again == splits
    other = split_examples(examples, seed=1, n_train=50, n_val=50, n_test=200)
    assert [e.id for e in other.train] != [e.id for e in splits.train]
    rest = split_examples(examples, seed=0, n_train=50, n_val=50, n_test=None)
    assert len(rest.test) == len(examples) - 100


def test_splits_reject_too_few_examples_and_duplicate_ids():
    examples = [Example(str(i), {}) for i in range(5)]
    with pytest.raises(SplitError, match="only 5"):
        split_examples(examples, seed=0, n_train=3, n_val=3, n_test=0)
    with pytest.raises(SplitError, match="duplicate"):
        split_examples(examples + examples[:1], seed=0, n_train=1, n_val=1, n_test=1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 60), seed=st.integers(0, 2**32), data=st.data())
def test_split_property_disjoint_sized_and_deterministic(n, seed, data):
    examples = [Example(f"e{i}", {"i": str(i)}) for i in range(n)]
    n_train = data.draw(st.integers(0, n))
    n_val = data.draw(st.integers(0, n - n_train))
    n_test = data.draw(st.none() | st.integers(0, n - n_train - n_val))
    splits = split_examples(examples, seed, n_train, n_val, n_test)
    parts = [[e.id for e in p] for p in (splits.train, splits.val, splits.test)]
    flat = [i for p in parts for i in p]
    assert len(flat) == len(set(flat))
    assert set(flat) <= {e.id for e in examples}
    expected_test = n - n_train - n_val if n_test is None else n_test
    assert [len(p) for p in parts] == [n_train, n_val, expected_test]
    assert split_examples(examples, seed, n_train, n_val, n_test) == splits
