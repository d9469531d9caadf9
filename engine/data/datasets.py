"""Named benchmark loaders (gsm8k, liar, bbh/<task>) and plain .jsonl files -> Examples.

Files are read from a data directory (`data_dir`, else the SEMBACK_DATA_DIR environment
variable) laid out as `gsm8k/{train,test}.jsonl`, `liar/{train,valid,test}.tsv` and
`bbh/<task>.json`. Only when a file is not there and the optional `datasets` package is
importable do the loaders fall back to the Hugging Face hub.

Every named dataset also keeps its target as a field, so `with_target(examples, field)`
works the same for every source: gsm8k `answer` (the number after ####), bbh `target`,
liar `is_lie` (Yes for label false, No for label true). Fields that only restate the
answer are not kept (GSM8K's worked solution, LIAR's six-way label); `validate` refuses a
node that reads a field holding the answer (engine/data/answers.py).
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

from engine.data.examples import Example

DATA_DIR_ENV = "SEMBACK_DATA_DIR"
NAMED_DATASETS = ("gsm8k", "gsm8k/train", "gsm8k/test", "liar", "liar/train", "liar/valid",
                  "liar/test", "bbh/<task>")

GSM8K_FILES = ("train", "test")
LIAR_FILES = ("train", "valid", "test")
LIAR_COLUMNS = ("id", "label", "statement", "subject", "speaker", "job_title", "state",
                "party", "barely_true_count", "false_count", "half_true_count",
                "mostly_true_count", "pants_on_fire_count", "context")
# Fields nodes may read: the 6-way `label` holds the answer, so it is not among them.
LIAR_FIELDS = ("statement", "subject", "speaker", "job_title", "state", "party", "context")
# As in the paper's reference code, a statement is kept only when each field its graph
# shows is present: a value with no letters, or whose letters spell "none", is missing.
LIAR_REQUIRED = ("statement", "job_title", "state", "party", "context")
# The paper asks "is this statement a lie?": only the two clear-cut labels are kept.
LIAR_TARGETS = {"false": "Yes", "true": "No"}

# Grouping of the 27 BIG-Bench Hard tasks used by Suzgun et al. (2022) and the paper.
BBH_NLP_TASKS = (
    "causal_judgement", "date_understanding", "disambiguation_qa", "formal_fallacies",
    "hyperbaton", "movie_recommendation", "penguins_in_a_table",
    "reasoning_about_colored_objects", "ruin_names", "salient_translation_error_detection",
    "snarks", "sports_understanding",
)
BBH_ALGORITHMIC_TASKS = (
    "boolean_expressions", "dyck_languages", "geometric_shapes",
    "logical_deduction_three_objects", "logical_deduction_five_objects",
    "logical_deduction_seven_objects", "multistep_arithmetic_two", "navigate",
    "object_counting", "temporal_sequences", "tracking_shuffled_objects_three_objects",
    "tracking_shuffled_objects_five_objects", "tracking_shuffled_objects_seven_objects",
    "web_of_lies", "word_sorting",
)

_HUB_NAMES = {"gsm8k": ("openai/gsm8k", "main"), "liar": ("ucsbnlp/liar", None),
              "bbh": ("lukaemon/bbh", None)}
_HUB_SPLITS = {"gsm8k": {"train": "train", "test": "test"},
               "liar": {"train": "train", "valid": "validation", "test": "test"}}
_TASK_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


class DatasetError(Exception):
    """A dataset that cannot be found or read, described in one line."""


# --- public entry points ----------------------------------------------------------------


def load_examples(dataset: str, *, data_dir: str | None = None,
                  graph_dir: str | None = None) -> list[Example]:
    """Examples for a dataset spec: a .jsonl path, gsm8k[/train|/test], liar[/train|/valid|
    /test] or bbh/<task>.

    Relative .jsonl paths are resolved against `graph_dir` (the graph file's folder). Named
    datasets come from `data_dir` (default: $SEMBACK_DATA_DIR), then the Hugging Face hub if
    the optional `datasets` package is installed. Raises DatasetError.
    """
    spec = dataset.strip()
    if spec.endswith(".jsonl"):
        path = Path(spec).expanduser()
        if not path.is_absolute() and graph_dir is not None:
            path = Path(graph_dir) / path
        if not path.is_file():
            raise DatasetError(f"dataset file '{spec}' not found: expected {path}")
        return load_jsonl(path)
    name, _, part = spec.partition("/")
    _check_spec(spec, name, part)
    root = data_dir or os.environ.get(DATA_DIR_ENV) or None
    files = _local_files(name, part, Path(root)) if root else []
    if root and all(f.is_file() for f in files):
        return _read_local(name, files)
    examples = _load_from_hub(spec, name, part)
    if examples is not None:
        return examples
    hint = "pass --data-dir or install the optional 'datasets' package for the Hugging Face hub"
    if not root:
        raise DatasetError(f"dataset '{spec}': no data directory given (--data-dir or "
                           f"${DATA_DIR_ENV}); {hint}")
    missing = next(f for f in files if not f.is_file())
    present = bbh_tasks(root) if name == "bbh" else []
    if present:
        hint = f"tasks present: {', '.join(present)}; or {hint}"
    raise DatasetError(f"dataset '{spec}' not found in {root}: expected {missing}; {hint}")


def with_target(examples: Iterable[Example], target_field: str) -> list[Example]:
    """New Examples whose target is `fields[target_field]`; DatasetError names a row without it."""
    out = []
    for example in examples:
        if target_field not in example.fields:
            known = ", ".join(sorted(example.fields)) or "none"
            where = f"{example.source}: " if example.source else ""
            raise DatasetError(f"{where}example '{example.id}' has no field '{target_field}' "
                               f"(its fields: {known})")
        out.append(Example(example.id, dict(example.fields), example.fields[target_field],
                           example.source))
    return out


def check_input_fields(examples: Iterable[Example], input_fields: Iterable[str],
                       dataset: str) -> None:
    """Every row must give every input field as text; DatasetError names the file and line
    of the first row that does not (a missing, null or nested value would otherwise reach
    the model as an empty input)."""
    wanted = list(input_fields)
    for example in examples:
        for name in wanted:
            if name not in example.fields:
                where = example.source or f"dataset '{dataset}'"
                known = ", ".join(sorted(example.fields)) or "none"
                raise DatasetError(f"{where}: example '{example.id}' has no text for input "
                                   f"field '{name}' (missing, null or nested; its fields: "
                                   f"{known})")


def bbh_tasks(data_dir: str | Path | None = None) -> list[str]:
    """Names of the BBH task files present in `data_dir`/bbh (default: $SEMBACK_DATA_DIR)."""
    root = data_dir or os.environ.get(DATA_DIR_ENV)
    if not root:
        return []
    return sorted(p.stem for p in (Path(root) / "bbh").glob("*.json"))


def load_jsonl(path: str | Path) -> list[Example]:
    """One Example per JSON object line; `id` column or 0-based row index; target left empty."""
    path = Path(path)
    examples: list[Example] = []
    seen: dict[str, int] = {}
    for line_no, row in _json_lines(path):
        if not isinstance(row, dict):
            raise DatasetError(f"{path}:{line_no}: each line must be a JSON object")
        fields = {str(k): _text(v) for k, v in row.items() if _is_scalar(v)}
        example_id = fields.get("id") or str(len(examples))
        if example_id in seen:
            raise DatasetError(f"{path}:{line_no}: duplicate id '{example_id}' "
                               f"(first on line {seen[example_id]})")
        seen[example_id] = line_no
        examples.append(Example(example_id, fields, source=f"{path}:{line_no}"))
    return examples


# --- local files --------------------------------------------------------------------------


def _check_spec(spec: str, name: str, part: str) -> None:
    known = "known: " + ", ".join(NAMED_DATASETS) + ", or a path ending in .jsonl"
    if name not in _HUB_NAMES:
        raise DatasetError(f"unknown dataset '{spec}' ({known})")
    if name == "bbh":
        if not part or not _TASK_NAME.match(part):
            raise DatasetError(f"dataset '{spec}' needs a task name: bbh/<task>, "
                               f"e.g. bbh/boolean_expressions")
    elif part and part not in _HUB_SPLITS[name]:
        allowed = ", ".join(f"{name}/{p}" for p in _HUB_SPLITS[name])
        raise DatasetError(f"unknown split '{part}' of '{name}' (allowed: {name}, {allowed})")


def _local_files(name: str, part: str, root: Path) -> list[Path]:
    if name == "gsm8k":
        return [root / "gsm8k" / f"{p}.jsonl" for p in ([part] if part else GSM8K_FILES)]
    if name == "liar":
        return [root / "liar" / f"{p}.tsv" for p in ([part] if part else LIAR_FILES)]
    return [root / "bbh" / f"{part}.json"]


def _read_local(name: str, files: list[Path]) -> list[Example]:
    if name == "gsm8k":
        return [e for f in files for e in _gsm8k_examples(f.stem, _gsm8k_rows(f), str(f))]
    if name == "liar":
        rows = [(f.stem, row, f"{f}:{n}") for f in files for n, row in _tsv_rows(f)]
        return _liar_examples(rows)
    path = files[0]
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["examples"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DatasetError(f"{path}: not a BBH task file with an 'examples' list "
                           f"({exc.__class__.__name__})") from None
    return _bbh_examples(path.stem, rows, str(path))


def _json_lines(path: Path) -> Iterable[tuple[int, object]]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: cannot read file ({exc.__class__.__name__})") from None
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield line_no, json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{line_no}: invalid JSON ({exc.msg})") from None


def _gsm8k_rows(path: Path) -> list[dict]:
    rows = []
    for line_no, row in _json_lines(path):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise DatasetError(f"{path}:{line_no}: expected an object with 'question' and "
                               f"'answer'")
        rows.append(row)
    return rows


def _tsv_rows(path: Path) -> list[tuple[int, list[str]]]:
    """LIAR rows. Quotes are literal text in these files (QUOTE_NONE); a row cut short by a
    line break inside a field is joined with the next physical line."""
    try:
        with path.open(encoding="utf-8", newline="") as handle:
            raw = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DatasetError(f"{path}: cannot read TSV ({exc.__class__.__name__})") from None
    rows: list[tuple[int, list[str]]] = []
    pending: list[str] | None = None
    start = 0
    for line_no, cells in enumerate(raw, start=1):
        if pending is None:
            pending, start = cells, line_no
        elif not cells:
            pending[-1] += "\n"
        else:
            pending = [*pending[:-1], pending[-1] + "\n" + cells[0], *cells[1:]]
        if len(pending) >= len(LIAR_COLUMNS) or not any(c.strip() for c in pending):
            rows.append((start, pending))
            pending = None
    if pending is not None:
        rows.append((start, pending))
    for line_no, cells in rows:
        if any(c.strip() for c in cells) and len(cells) != len(LIAR_COLUMNS):
            raise DatasetError(f"{path}:{line_no}: expected {len(LIAR_COLUMNS)} tab-separated "
                               f"columns, found {len(cells)}")
    return [(n, c) for n, c in rows if any(x.strip() for x in c)]


# --- rows -> Examples (shared by local files and the hub) ----------------------------------


def _gsm8k_examples(split: str, rows: Iterable[dict], where: str) -> list[Example]:
    examples = []
    for index, row in enumerate(rows):
        solution = str(row["answer"])
        if "####" not in solution:
            raise DatasetError(f"{where}: row {index} has no '#### <answer>' line")
        answer = solution.rsplit("####", 1)[1].strip().replace(",", "")
        # the worked solution ends in the answer: no node may read it, so it is not kept
        fields = {"question": str(row["question"]), "answer": answer}
        examples.append(Example(f"{split}-{index}", fields, answer))
    return examples


def _liar_examples(rows: Iterable[tuple[str, list[str], str]]) -> list[Example]:
    """rows: (file split, 14 cells, location). Ids are the statement ids without '.json'."""
    examples = []
    seen: set[str] = set()
    for split, cells, where in rows:
        record = dict(zip(LIAR_COLUMNS, (c.strip() for c in cells), strict=True))
        target = LIAR_TARGETS.get(record["label"])
        if target is None or any(_liar_missing(record[k]) for k in LIAR_REQUIRED):
            continue
        example_id = record["id"].removesuffix(".json")
        if not example_id:
            raise DatasetError(f"{where}: statement without an id")
        if example_id in seen:
            example_id = f"{split}-{example_id}"
        if example_id in seen:
            raise DatasetError(f"{where}: duplicate statement id '{record['id']}'")
        seen.add(example_id)
        fields = {k: record[k] for k in LIAR_FIELDS}
        fields["is_lie"] = target
        examples.append(Example(example_id, fields, target, where))
    return examples


def _liar_missing(value: str) -> bool:
    letters = "".join(ch for ch in value if ch.isalpha())
    return letters.lower() in ("", "none")


def _bbh_examples(task: str, rows: Iterable[dict], where: str) -> list[Example]:
    examples = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or "input" not in row or "target" not in row:
            raise DatasetError(f"{where}: example {index} needs 'input' and 'target'")
        target = _text(row["target"])
        fields = {"input": _text(row["input"]), "target": target}
        examples.append(Example(f"{task}-{index}", fields, target))
    return examples


def _is_scalar(value: object) -> bool:
    return isinstance(value, (str, int, float, bool))


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


# --- Hugging Face hub (optional; never used when the files are present) ------------------


def _load_from_hub(spec: str, name: str, part: str) -> list[Example] | None:
    """Examples from the hub, or None when the optional `datasets` package is missing."""
    try:
        import datasets as hf  # type: ignore[import-not-found]
    except ImportError:
        return None
    repo, config = _HUB_NAMES[name]
    try:
        if name == "bbh":
            rows = hf.load_dataset(repo, part, split="test")
            return _bbh_examples(part, rows, f"hub {repo}/{part}")
        parts = [part] if part else list(_HUB_SPLITS[name])
        loaded = [(p, hf.load_dataset(repo, config, split=_HUB_SPLITS[name][p]))
                  for p in parts]
    except Exception as exc:  # noqa: BLE001 - the hub raises many types (offline, auth, ...)
        reason = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
        raise DatasetError(f"dataset '{spec}' is not in the data directory and the Hugging "
                           f"Face hub failed: {reason}") from None
    if name == "gsm8k":
        return [e for p, rows in loaded for e in _gsm8k_examples(p, rows, f"hub {repo}/{p}")]
    return _liar_examples((p, _liar_hub_cells(rows, row), f"hub {repo}/{p}")
                          for p, rows in loaded for row in rows)


def _liar_hub_cells(rows, row: dict) -> list[str]:
    """A hub LIAR row (integer label, renamed columns) as the 14 cells of the TSV."""
    label = row["label"]
    if isinstance(label, int):
        label = rows.features["label"].int2str(label)
    names = {"state": "state_info", "party": "party_affiliation"}
    cells = [str(row.get(names.get(c, c), "") or "") for c in LIAR_COLUMNS]
    cells[1] = str(label)
    return cells
