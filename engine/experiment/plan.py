"""Plans: a YAML file of entries, read and validated into `Plan`, `Entry` and `Variant`.

A plan has a `name`, a `description` and a list of `entries`. Each entry is a graph run
with several methods (or named variants of a method, for ablations) on one dataset, or on
every BBH task (`tasks: all`), for one or more seeds. Any problem is a `PlanError` of one
line naming the entry at fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from engine.core.graph import GraphError, load_graph
from engine.data.datasets import BBH_ALGORITHMIC_TASKS, BBH_NLP_TASKS
from engine.methods import METHODS, make_method

PLAN_KEYS = ("name", "description", "entries")
ENTRY_KEYS = ("name", "description", "graph", "dataset", "test_dataset", "tasks", "methods",
              "variants", "steps", "proposals", "train", "val", "test", "seeds", "failures",
              "update_mode", "gate", "paper")
VARIANT_KEYS = ("name", "method", "update_mode", "gate", "options")
NAME = re.compile(r"^[A-Za-z0-9_-]+$")
GROUPS = {"nlp": ("BBH NLP", BBH_NLP_TASKS), "algorithmic": ("BBH algorithmic",
                                                          BBH_ALGORITHMIC_TASKS)}


class PlanError(ValueError):
    """A plan that cannot be run, described in one line."""


# --- the plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    name: str
    method: str
    update_mode: str = "all"
    gate: bool = True
    options: tuple[tuple[str, Any], ...] = ()  # method options, e.g. (("m0", 2),) for gtbp

    def describe(self) -> str:
        flags = [self.method] + [f"{k}={v}" for k, v in self.options] \
            + (["one prompt at a time"] if self.update_mode == "one" else []) \
            + ([] if self.gate else ["no gate"])
        return self.name if flags == [self.name] else f"{self.name} ({', '.join(flags)})"


@dataclass(frozen=True)
class Entry:
    name: str
    graph: str
    variants: tuple[Variant, ...]
    dataset: str | None = None
    test_dataset: str | None = None
    tasks: tuple[str, ...] | None = None  # ("all",) expands to every BBH task file
    steps: int = 4  # default: the graph's `steps:`, else 4
    proposals: int = 1  # candidate prompt sets a step; default: the graph's, else 1
    train: int | None = None
    val: int | None = None
    test: int | None = None  # None: every example left (or the whole test_dataset)
    seeds: tuple[int, ...] = (0,)
    failures: int = 2
    paper: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    name: str
    path: str
    entries: tuple[Entry, ...]
    description: str = ""


def load_plan(path: str | Path) -> Plan:
    """Read and validate a plan; raises PlanError with one line naming the entry at fault."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"{path}: plan file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PlanError(f"{path}: cannot read plan ({exc.__class__.__name__})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise PlanError(f"{path}{where}: YAML syntax error: "
                        f"{getattr(exc, 'problem', None) or exc.__class__.__name__}") from None
    if not isinstance(data, dict):
        raise PlanError(f"{path}: a plan must be a YAML mapping with an 'entries' list")
    _check_keys(data, PLAN_KEYS, f"{path}")
    name = str(data.get("name") or path.stem)
    if not NAME.match(name):
        raise PlanError(f"{path}: plan name '{name}' may only use letters, digits, _ and -")
    items = data.get("entries")
    if not isinstance(items, list) or not items:
        raise PlanError(f"{path}: 'entries' must be a non-empty list")
    entries = [_parse_entry(item, i, path) for i, item in enumerate(items)]
    names = [e.name for e in entries]
    for n in names:
        if names.count(n) > 1:
            raise PlanError(f"{path}: entry name '{n}' is used twice")
    return Plan(name, str(path), tuple(entries), str(data.get("description") or ""))


def _check_keys(data: dict, allowed: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in allowed:
            raise PlanError(f"{where}: unknown key {str(key)!r} (allowed: {', '.join(allowed)})")


def _parse_entry(item: Any, index: int, path: Path) -> Entry:
    if not isinstance(item, dict):
        raise PlanError(f"{path}: entry {index + 1} must be a mapping with 'name' and 'graph'")
    name = item.get("name")
    where = f"{path}: entry '{name}'" if name else f"{path}: entry {index + 1}"
    _check_keys(item, ENTRY_KEYS, where)
    if not isinstance(name, str) or not NAME.match(name):
        raise PlanError(f"{where}: needs a 'name' of letters, digits, _ and -")
    if not item.get("graph"):
        raise PlanError(f"{where}: missing 'graph'")
    graph = _find_graph(str(item["graph"]), path, where)
    default = Variant("", "", _choice(item, "update_mode", ("all", "one"), "all", where),
                      _flag(item, "gate", True, where))
    methods = item.get("methods") or []
    if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
        raise PlanError(f"{where}: 'methods' must be a list of method names")
    variants = [replace(default, name=m, method=m) for m in methods]
    for v in item.get("variants") or []:
        variants.append(_parse_variant(v, default, where))
    if not variants:
        raise PlanError(f"{where}: give 'methods' or 'variants'")
    for v in variants:
        if v.method not in METHODS:
            raise PlanError(f"{where}: unknown method '{v.method}' "
                            f"(known: {', '.join(sorted(METHODS))})")
        try:
            make_method(v.method, **dict(v.options))
        except (TypeError, ValueError) as exc:
            raise PlanError(f"{where}: variant '{v.name}': bad options for '{v.method}': "
                            f"{exc}") from None
        if [w.name for w in variants].count(v.name) > 1:
            raise PlanError(f"{where}: variant or method '{v.name}' appears twice")
    tasks = item.get("tasks")
    if tasks is not None:
        tasks = ("all",) if tasks == "all" else tasks
        if not isinstance(tasks, (list, tuple)) or not tasks or \
                not all(isinstance(t, str) and NAME.match(t) for t in tasks):
            raise PlanError(f"{where}: 'tasks' must be 'all' or a list of BBH task names")
        if item.get("dataset") or item.get("test_dataset"):
            raise PlanError(f"{where}: 'tasks' picks the dataset (bbh/<task>); "
                            f"drop 'dataset' and 'test_dataset'")
    steps, proposals = _graph_defaults(item, graph, where)
    seeds = item.get("seeds", [0])
    seeds = [seeds] if isinstance(seeds, int) and not isinstance(seeds, bool) else seeds
    if not isinstance(seeds, list) or not seeds or not all(_is_int(s) for s in seeds):
        raise PlanError(f"{where}: 'seeds' must be a list of whole numbers")
    entry = Entry(
        name=name, graph=graph, variants=tuple(variants),
        dataset=_text(item, "dataset", where), test_dataset=_text(item, "test_dataset", where),
        tasks=tuple(tasks) if tasks else None, steps=steps, proposals=proposals,
        train=_count(item, "train", where), val=_count(item, "val", where),
        test=_count(item, "test", where), seeds=tuple(seeds),
        failures=_count(item, "failures", where, 2), paper=_paper(item, where))
    if entry.failures < 1:
        raise PlanError(f"{where}: 'failures' (examples back-propagated per step) must be "
                        f"at least 1")
    _check_paper_labels(entry, where)
    return entry


def _parse_variant(item: Any, default: Variant, where: str) -> Variant:
    if not isinstance(item, dict) or not item.get("name") or not item.get("method"):
        raise PlanError(f"{where}: each variant needs a 'name' and a 'method'")
    _check_keys(item, VARIANT_KEYS, f"{where}: variant '{item['name']}'")
    if not NAME.match(str(item["name"])):
        raise PlanError(f"{where}: variant name '{item['name']}' may only use letters, "
                        f"digits, _ and -")
    vwhere = f"{where}: variant '{item['name']}'"
    options = item.get("options") or {}
    if not isinstance(options, dict):
        raise PlanError(f"{vwhere}: 'options' must map option names to values")
    return Variant(str(item["name"]), str(item["method"]),
                   _choice(item, "update_mode", ("all", "one"), default.update_mode, vwhere),
                   _flag(item, "gate", default.gate, vwhere), tuple(sorted(options.items())))


def _graph_defaults(item: dict, graph: str, where: str) -> tuple[int, int]:
    """The entry's steps and candidate prompt sets a step: as it gives them, else the
    graph file's own (`steps:`, `proposals:`, which `run` takes too), else 4 and 1."""
    own: dict[str, int] = {}
    if "steps" not in item or "proposals" not in item:
        try:
            own = load_graph(graph).run_defaults()
        except GraphError as exc:
            raise PlanError(f"{where}: {exc}") from None
    steps = _count(item, "steps", where, own.get("steps", 4))
    proposals = _count(item, "proposals", where, own.get("proposals", 1))
    if proposals < 1:
        raise PlanError(f"{where}: 'proposals' (candidate prompt sets a step) must be at "
                        f"least 1")
    return steps, proposals


def _find_graph(text: str, plan_path: Path, where: str) -> str:
    """A graph path as given (from the working directory), else relative to the plan's
    folder or one of its parents (plans in benchmarks/plans/ name sample_graphs/...)."""
    given = Path(text).expanduser()
    if given.is_absolute() or given.is_file():
        if not given.is_file():
            raise PlanError(f"{where}: graph '{text}' not found")
        return str(given)
    folder = plan_path.resolve().parent
    for base in (folder, *folder.parents):
        if (base / given).is_file():
            return str(base / given)
    raise PlanError(f"{where}: graph '{text}' not found (looked in the working directory "
                    f"and above {folder})")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count(item: dict, key: str, where: str, default: int | None = None) -> int | None:
    value = item.get(key, default)
    if value is not None and (not _is_int(value) or value < 0):
        raise PlanError(f"{where}: '{key}' must be a whole number of at least 0"
                        + (" or null" if default is None else ""))
    return value


def _choice(item: dict, key: str, allowed: tuple[str, ...], default: str, where: str) -> str:
    value = item.get(key, default)
    if value not in allowed:
        raise PlanError(f"{where}: '{key}' must be one of {', '.join(allowed)}")
    return value


def _flag(item: dict, key: str, default: bool, where: str) -> bool:
    value = item.get(key, default)
    if not isinstance(value, bool):
        raise PlanError(f"{where}: '{key}' must be true or false")
    return value


def _text(item: dict, key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise PlanError(f"{where}: '{key}' must be a dataset name")
    return value


def _paper(item: dict, where: str) -> dict[str, float]:
    paper = item.get("paper") or {}
    if not isinstance(paper, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in paper.values()):
        raise PlanError(f"{where}: 'paper' must map a method or variant (for BBH: "
                        f"group/method) to the paper's figure in percent")
    return {str(k): float(v) for k, v in paper.items()}


def _check_paper_labels(entry: Entry, where: str) -> None:
    names = {v.name for v in entry.variants}
    for label in entry.paper:
        group, _, name = label.rpartition("/")
        if name not in names or (group and (not entry.tasks or group not in GROUPS)) or \
                (entry.tasks and not group):
            expected = "nlp/<method>, algorithmic/<method>" if entry.tasks else "<method>"
            raise PlanError(f"{where}: 'paper' label '{label}' matches no row "
                            f"(expected {expected} with one of: {', '.join(sorted(names))})")
