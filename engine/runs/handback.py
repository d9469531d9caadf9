"""The better prompts, handed back (`python -m engine prompts`, docs/traces.md): the prompt
each node of a run keeps, with the evidence that kept it, as YAML or JSON, or written into
a DSPy program's saved state.

A node's kept prompt is its latest accepted version; the evidence is the step that kept it
and, where an update proposed it, validation before and after that step on the run's `n`
validation examples with each score's 95% Wilson interval (engine/data/stats.py). A
templated prompt is handed back as the template it is.

DSPy saves a program (`program.save("p.json")`) as one entry per named predictor, each with
its signature's `instructions` and fields, and `program.load` needs every one of them. The
traces name no predictor, so the program's own saved file is the base: each node is matched
to the one predictor whose instructions are the node's original prompt (whitespace aside),
else whose signature's field names are the node's, and a node that matches none or several
is refused. Only the instructions of a changed node's predictor are replaced.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from engine.data.stats import Z95, wilson
from engine.events import same_prompt
from engine.prompts.recorded import FIELD_HEADER, RECORDED_FIELD
from engine.runlog.schema import RunLogError, check_readable

FORMATS = ("yaml", "json", "dspy")
# DSPy's ChatAdapter: a field in the system message's lists (a section header is
# engine/prompts/recorded.py's FIELD_HEADER)
FIELD_LISTED = re.compile(r"^\d+\. `(\w+)`", re.M)
FIELD_DESCRIPTION = re.compile(r"^\$\{(\w+)\}$")
DSPY_END = "completed"  # the header DSPy closes every reply with: no field


class HandBackError(ValueError):
    """Prompts that cannot be handed back as asked (bad input: one `error:` line, status 2,
    nothing written)."""


@dataclass
class KeptPrompt:
    node_id: str
    prompt: str
    original: str
    step: int
    evidence: dict[str, Any]
    fields: set[str] = field(default_factory=set)  # the field names its calls carried

    @property
    def changed(self) -> bool:
        return not same_prompt(self.original, self.prompt)

    def as_json(self) -> dict[str, Any]:
        return {"prompt": self.prompt, "original": self.original, "changed": self.changed,
                "step": self.step, "evidence": self.evidence}


@dataclass
class HandBack:
    run_id: str
    nodes: list[KeptPrompt]

    def as_json(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "nodes": {n.node_id: n.as_json() for n in self.nodes}}


def kept_prompts(db: str | Path, run_id: str) -> HandBack:
    """Every prompted node's kept prompt with its evidence, in the graph's order."""
    # the reader (and pandas) only where a run is read: the CLI imports this module for
    # FORMATS, and a command that only writes (import-traces) keeps pandas out of memory
    from engine.runlog.reader import example_fields, kept_prompt_rows, run_record, split_sizes

    check_readable(db)
    record = run_record(db, run_id)
    if record is None:
        raise RunLogError(f"{db}: no run '{run_id}' (see: python -m engine runs --db {db})")
    graph = yaml.safe_load(record.get("graph_yaml") or "") or {}
    order = [str(n.get("id")) for n in graph.get("nodes") or [] if isinstance(n, dict)]
    inputs = {str(n.get("id")): [str(i) for i in n.get("inputs") or []]
              for n in graph.get("nodes") or [] if isinstance(n, dict)}
    gated = bool(json.loads(record.get("config") or "{}").get("gate", True))
    n_val = split_sizes(db, run_id).get("val", 0)
    recorded = _recorded_calls(example_fields(db, run_id))
    nodes = []
    for row in kept_prompt_rows(db, run_id):
        if not (row["prompt"] or row["original"]):  # a function node: no prompt
            continue
        node = row["node_id"]
        nodes.append(KeptPrompt(node, row["prompt"] or "", row["original"] or "",
                                int(row["step"]), _evidence(row, n_val, gated),
                                _recorded_fields(recorded.get(node))
                                or {node, *inputs.get(node, [])}))
    nodes.sort(key=lambda n: (order.index(n.node_id) if n.node_id in order else len(order),
                              n.node_id))
    if not nodes:
        raise HandBackError(f"run '{run_id}' has no prompt to hand back (no prompt version "
                            "was logged)")
    return HandBack(run_id, nodes)


def _known(value: Any) -> float | None:
    return None if value is None or value != value else float(value)


def _evidence(row: dict[str, Any], n: int, gated: bool) -> dict[str, Any]:
    """Why the node holds this prompt: `kept_by` "gate" (an update the validation gate
    accepted), "no gate" (accepted under --no-gate), "start" (the starting prompt) or "hand"
    (set by hand at a fork), the step that kept it, and for an update validation before
    and after that step on the run's `n` validation examples: each score, the examples it
    passed and its 95% Wilson interval (null where the step scored none)."""
    if row["proposed"]:
        how = "gate" if gated else "no gate"
    elif row["version"] == row["original_version"] or row["prompt"] == row["original"]:
        how = "start"
    else:
        how = "hand"
    out: dict[str, Any] = {"kept_by": how, "step": int(row["step"]), "validation": None}
    if row["proposed"]:
        out["validation"] = {"n": n, "before": _scored(row["val_before"], n),
                             "after": _scored(row["val_after"], n)}
        alone = _known(row.get("val_alone"))
        if alone is not None:  # the per-node gate scored this edit alone
            out["validation"]["alone"] = alone
    return out


def _scored(value: Any, n: int) -> dict[str, Any] | None:
    score = _known(value)
    if score is None or n <= 0:
        return None
    passed = round(min(max(score, 0.0), 1.0) * n, 2)  # partial credit counts its share
    low, high = wilson(passed, n, Z95)
    return {"score": score, "passed": int(passed) if passed == int(passed) else passed,
            "interval_95": [round(low, 4), round(high, 4)]}


def _recorded_calls(fields_json: str | None) -> dict[str, Any]:
    try:
        fields = json.loads(fields_json or "{}")
        return json.loads(fields.get(RECORDED_FIELD) or "{}")
    except (json.JSONDecodeError, AttributeError, TypeError):
        return {}


def _recorded_fields(template: Any) -> set[str]:
    """The DSPy field names an imported node's call carried: its `[[ ## name ## ]]`
    sections and the fields its system message lists."""
    text = json.dumps(template, ensure_ascii=False).replace("\\n", "\n") if template else ""
    names = set(FIELD_HEADER.findall(text)) | set(FIELD_LISTED.findall(text))
    return names - {DSPY_END}


# --- writing ----------------------------------------------------------------------------


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None  # a prompt of several lines reads as written
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


def _pair(dumper: yaml.SafeDumper, value: list) -> yaml.Node:
    flow = all(isinstance(v, (int, float)) for v in value)  # an interval on one line
    return dumper.represent_sequence("tag:yaml.org,2002:seq", value, flow_style=flow)


def _mapping(dumper: yaml.SafeDumper, value: dict) -> yaml.Node:
    flow = bool(value) and all(isinstance(v, (int, float, list)) and not isinstance(v, bool)
                               for v in value.values())  # a score, its count and interval
    return dumper.represent_mapping("tag:yaml.org,2002:map", value.items(), flow_style=flow)


_Dumper.add_representer(str, _text)
_Dumper.add_representer(list, _pair)
_Dumper.add_representer(dict, _mapping)


def as_yaml(hand: HandBack) -> str:
    return yaml.dump(hand.as_json(), Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                     width=100)


def render(hand: HandBack, fmt: str, program: str | Path | None = None
           ) -> tuple[str, dict[str, tuple[str, str]]]:
    """(the document `prompts --format fmt` writes, and for dspy each node's predictor and
    what matched it)."""
    if fmt not in FORMATS:
        raise HandBackError(f"--format {fmt!r}: choose {', '.join(FORMATS)}")
    if fmt == "dspy":
        if not program:
            raise HandBackError("--format dspy needs --program FILE.json, the program's own "
                                "save (program.save('FILE.json')): its predictors get the "
                                "kept instructions")
        state, matched = dspy_state(hand, read_program(program), f"--program {program}")
        return json.dumps(state, ensure_ascii=False, indent=2) + "\n", matched
    if fmt == "json":
        return json.dumps(hand.as_json(), ensure_ascii=False, indent=1) + "\n", {}
    return as_yaml(hand), {}


# --- DSPy -------------------------------------------------------------------------------


def read_program(path: str | Path) -> dict[str, Any]:
    try:
        state = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise HandBackError(f"--program {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HandBackError(f"--program {path}: not a DSPy program's JSON "
                            f"({exc.__class__.__name__})") from None
    if not isinstance(state, dict) or not predictors_of(state):
        raise HandBackError(f"--program {path}: no predictor in it (expected a DSPy "
                            "program's save(PATH.json): one entry per predictor with its "
                            "signature)")
    return state


def predictors_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: entry for name, entry in state.items() if isinstance(entry, dict)
            and isinstance(entry.get("signature"), dict)
            and isinstance(entry["signature"].get("instructions"), str)}


def predictor_fields(entry: dict[str, Any]) -> set[str]:
    """A saved predictor's field names: DSPy saves each field's prefix and description,
    whose default is `${name}`; else the name is read back from the prefix ("Question
    Text:" -> question_text)."""
    names = set()
    for f in entry["signature"].get("fields") or []:
        if not isinstance(f, dict):
            continue
        found = FIELD_DESCRIPTION.match(str(f.get("description") or ""))
        names.add(found[1] if found else "_".join(
            str(f.get("prefix") or "").rstrip(":").lower().split()))
    return names - {""}


def _words(text: str) -> str:
    return " ".join(text.split())


def dspy_state(hand: HandBack, program: dict[str, Any], where: str = "--program"
               ) -> tuple[dict[str, Any], dict[str, tuple[str, str]]]:
    """(the program's state with each changed node's predictor given the kept prompt as its
    instructions, node id -> (predictor, matched by)). HandBackError when a node matches
    no predictor or several, or two nodes one."""
    predictors = predictors_of(program)
    matched: dict[str, tuple[str, str]] = {}
    for node in hand.nodes:
        by = "instructions"
        names = [p for p, e in predictors.items()
                 if _words(e["signature"]["instructions"]) == _words(node.original)]
        if not names:
            by = "fields"
            names = [p for p, e in predictors.items()
                     if node.fields in (predictor_fields(e),
                                        predictor_fields(e) - {"reasoning"})]
        if not names:
            raise HandBackError(
                f"{where}: node '{node.node_id}' matches no predictor: none has its original "
                f"prompt as instructions, none the fields {', '.join(sorted(node.fields))} "
                f"(predictors: {', '.join(predictors)})")
        if len(names) > 1:
            raise HandBackError(f"{where}: node '{node.node_id}' matches {len(names)} "
                                f"predictors ({', '.join(names)}, by {by}): which one it is "
                                "cannot be told")
        other = next((n for n, (p, _) in matched.items() if p == names[0]), None)
        if other is not None:
            raise HandBackError(f"{where}: nodes '{other}' and '{node.node_id}' both match "
                                f"predictor '{names[0]}'")
        matched[node.node_id] = (names[0], by)
    state = copy.deepcopy(program)
    for node in hand.nodes:
        if node.changed:
            state[matched[node.node_id][0]]["signature"]["instructions"] = node.prompt
    return state, matched
