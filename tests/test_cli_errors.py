"""What a command says when it refuses: under --json the error as JSON on standard output
too, and every flag a hint names is one the command takes (or one of the command the hint
names, as in "import-traces --val N")."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from engine.cli.commands import build_parser, command_parser, flags_of, main
from tests.support.otlp_traces import three_call_trace, write_lines

ROOT = Path(__file__).resolve().parents[1]
ALL = None  # every function of the file

# Where each command's refusals and hints are written: file -> the functions whose
# messages it can print (ALL: the whole file).
SOURCES: dict[str, dict[str, set[str] | None]] = {
    "import-traces": {"engine/traces/importer.py": ALL, "engine/traces/infer.py": ALL,
                      "engine/traces/flows.py": ALL,
                      "engine/traces/otlp.py": ALL,
                      "engine/cli/traces.py": {"cmd_import_traces"}},
    "backprop": {"engine/traces/backprop.py": ALL, "engine/runlog/traces.py": ALL,
                 "engine/runlog/state.py": ALL, "engine/cli/traces.py": {"cmd_backprop"}},
    "blame": {"engine/probes/blame.py": {"blame", "parse_methods"},
              "engine/probes/selection.py": {"select_examples"},
              "engine/probes/plan.py": {"plan_step"}, "engine/probes/report.py": {"summarize"},
              "engine/probes/probe.py": ALL, "engine/cli/probes.py": {"cmd_blame"}},
    "probe": {"engine/probes/single.py": {"probe"},
              "engine/probes/selection.py": {"proposed_prompt", "select_examples"},
              "engine/probes/probe.py": ALL, "engine/cli/probes.py": {"cmd_probe"}},
    "diff": {"engine/probes/diff.py": ALL, "engine/cli/diff.py": ALL},
    "export": {"engine/runlog/otel.py": ALL, "engine/cli/commands.py": {"cmd_export", "_headers"}},
    "import": {"engine/runlog/export.py": {"import_json"}, "engine/cli/commands.py": {"cmd_import"}},
    "run": {"engine/cli/commands.py": {"cmd_run"}, "engine/cli/probes.py": {"cmd_fork"}},
    "prompts": {"engine/runs/handback.py": ALL, "engine/cli/prompts.py": ALL},
}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _text(node: ast.AST) -> str:
    """A message's words: an f-string's literal parts, "{}" for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(v) if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp):  # "..." + "..."
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " " + _text(node.orelse)
    return ""


def messages(path: str, functions: set[str] | None) -> list[str]:
    """The messages of the exceptions a file's functions raise (and the error lines they
    print), each as its literal text."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    found = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
              and (functions is None or n.name in functions)]
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                found += [t for t in (_text(a) for a in node.exc.args) if t]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "print":
                found += [t for t in (_text(a) for a in node.args) if "error" in t]
    return found


def owners(message: str, commands: list[str]) -> list[tuple[str, str | None]]:
    """Each flag of `message` with the command the message names just before it ("engine
    X", "`X", "X --"), None where it names none."""
    named = re.compile(r"(?:engine |`|\b)(" + "|".join(
        re.escape(c) for c in sorted(commands, key=len, reverse=True)) + r")(?=`| --| [A-Z_]+ --)")
    marks = [(m.start(), m.group(1)) for m in named.finditer(message)]
    out = []
    for flag in FLAG.finditer(message):
        before = [c for at, c in marks if at < flag.start()]
        out.append((flag.group(), before[-1] if before else None))
    return out


def test_every_flag_a_hint_names_is_one_the_command_or_the_named_command_takes():
    parser = build_parser()
    commands = sorted(c for c in _choices(parser))
    wrong = []
    for command, files in SOURCES.items():
        own = flags_of(command_parser(parser, command))
        for path, functions in files.items():
            for message in messages(path, functions):
                for flag, named in owners(message, commands):
                    takes = own | (flags_of(command_parser(parser, named)) if named else set())
                    if flag not in takes:
                        wrong.append(f"{command}: {path}: {flag} in {message!r}")
    assert not wrong, "\n".join(wrong)


def _choices(parser) -> list[str]:
    import argparse

    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


def test_the_check_sees_a_flag_the_command_does_not_take():
    parser = build_parser()
    commands = _choices(parser)
    backprop = flags_of(command_parser(parser, "backprop"))
    [(flag, named)] = owners("no server: use --backend local", commands)
    assert (flag, named) == ("--backend", None) and flag not in backprop
    assert owners("import the traces again with import-traces --val N, or leave "
                  "--proposals out", commands) == [("--val", "import-traces"),
                                                   ("--proposals", "import-traces")]
    assert "--proposals" in backprop  # the command's own flag, whichever command is named


def test_missing_credentials_name_the_flags_of_the_command_that_ran(tmp_path, capsys,
                                                                     monkeypatch):
    """backprop without a server: it takes --base-url, not --backend."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    db = _imported(tmp_path, capsys)
    assert main(["backprop", "r1", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no OpenAI credentials") and "--base-url URL" in err, err
    parser = build_parser()
    assert all(f in flags_of(command_parser(parser, "backprop")) for f in FLAG.findall(err))


def _imported(tmp_path: Path, capsys) -> Path:
    spans = []
    for i, (sentence, n) in enumerate([("Lena packed 7 boxes.", "7"),
                                       ("Omar planted 12 trees.", "12")]):
        spans += three_call_trace(i, sentence, f"The number is {2 * int(n)}.",
                                  f"Topic: {sentence.split()[1]} and things", str(2 * int(n)))
    targets = tmp_path / "targets.jsonl"
    targets.write_text("".join(json.dumps({"input": s, "target": n}) + "\n" for s, n in
                               [("Lena packed 7 boxes.", "7"), ("Omar planted 12 trees.", "12")]))
    db = tmp_path / "r.duckdb"
    assert main(["import-traces", str(write_lines(tmp_path / "t.jsonl", spans)), "--db", str(db),
                 "--targets", str(targets), "--metric", "numeric", "--run-id", "r1"]) == 0
    capsys.readouterr()
    return db


@pytest.mark.parametrize("argv", [
    ["import-traces", "{tmp}/none.jsonl", "--db", "{tmp}/x.duckdb"],
    ["backprop", "nosuch", "--db", "{db}"],
    ["blame", "nosuch", "--db", "{db}"],
    ["runs", "--db", "{tmp}/none.duckdb"],
])
def test_json_prints_the_error_as_json_too(tmp_path, capsys, argv):
    db = _imported(tmp_path, capsys)
    argv = [a.format(tmp=tmp_path, db=db) for a in argv]
    assert main(argv) == 2
    plain = capsys.readouterr()
    assert plain.err.startswith("error: ") and not plain.out
    assert main([*argv, "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.err == plain.err  # the error line is as it was
    assert json.loads(captured.out) == {"error": plain.err.removeprefix("error: ").strip()}


def test_json_turns_an_argument_error_into_json_too(capsys):
    with pytest.raises(SystemExit) as info:
        main(["blame", "r1", "--repeats", "many", "--json"])
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert "invalid" in json.loads(captured.out)["error"]
    assert "error: argument --repeats" in captured.err


def test_backprop_marks_unchanged_proposals_and_does_not_count_them(tmp_path, capsys,
                                                                   monkeypatch):
    """An update call that gives the prompt back (here: with other spacing) proposes no
    edit: `unchanged` in the output and its JSON, never counted among the proposals."""
    from engine.llm.scripted import ScriptedBackend
    from engine.traces import backprop as backprop_module
    from tests.support.otlp_traces import SYSTEMS

    db = _imported(tmp_path, capsys)
    same = "  " + SYSTEMS["count"].replace(" ", "\n ") + "\n"

    def responder(request):
        if request.purpose == "update" and request.meta.get("node") == "you_count":
            return f"<prompt>{same}</prompt>"
        return None

    real = backprop_module.backprop

    async def scripted(*args, **kwargs):
        backend = ScriptedBackend(responder=responder)
        return await real(*args, **kwargs, forward_backend=backend, optimizer_backend=backend)

    monkeypatch.setattr(backprop_module, "backprop", scripted)
    assert main(["backprop", "r1", "--db", str(db), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    by_node = {n["node_id"]: n for n in got["nodes"]}
    assert by_node["you_count"]["unchanged"] is True
    assert not by_node["you_give"]["unchanged"] and not by_node["you_name"]["unchanged"]
    assert (got["proposals"], got["unchanged"]) == (2, 1)
