"""Model identity: the run log records the local model's name and SHA-256, the reply cache
keys on the SHA-256 (two files of one name never share replies), and a version-5 log gains
the columns in place. Forward calls stop at </output>, and the cut reply still parses."""

from __future__ import annotations

import asyncio

import duckdb

from engine.llm.cache import Cache
from engine.llm.client import LLMClient
from engine.llm.scripted import ScriptedBackend
from engine.prompts.templates import parse_output
from engine.runlog.schema import SCHEMA_VERSION
from engine.runlog.writer import open_for_writing
from engine.runs.execute import RunConfig, execute
from tests.support.graphs import REPO
from tests.support.runlog import log_at_version, rows

SHA_A, SHA_B = "a" * 64, "b" * 64


class FileModel(ScriptedBackend):
    """A local backend as the engine sees one: a model file's name and its SHA-256."""

    name = "local"

    def __init__(self, sha256: str, **kwargs):
        super().__init__(**kwargs)
        self.model_name, self.model_sha256 = "same.gguf", sha256


def test_two_files_of_the_same_name_never_share_cached_replies():
    cache = Cache("readwrite")

    async def ask(backend):
        client = LLMClient(forward_backend=backend, forward_model="same.gguf", cache=cache)
        return await client.call(client.request("forward", [("user", "hi")]), step=0)

    first, second = FileModel(SHA_A), FileModel(SHA_B)
    asyncio.run(ask(first))
    record = asyncio.run(ask(second))
    assert not record.cache_hit and len(second.requests) == 1
    again = FileModel(SHA_A)
    assert asyncio.run(ask(again)).cache_hit and again.requests == []


def test_a_provider_request_keeps_its_cache_key_without_a_file_hash():
    client = LLMClient(forward_backend=ScriptedBackend(), forward_model="m")
    request = client.request("loss", [("user", "hi")])
    assert request.model_sha256 is None and "model_sha256" not in request.key_fields()


def demo_config(tmp_path, steps: int = 1) -> RunConfig:
    return RunConfig(graph=str(REPO / "sample_graphs" / "demo.yaml"), backend="local",
                     steps=steps, train=4, val=4, test=0, db=str(tmp_path / "runs.duckdb"))


def test_the_run_log_records_the_model_name_and_sha256(tmp_path):
    config = demo_config(tmp_path)
    asyncio.run(execute(config, forward_backend=FileModel(SHA_A)))
    assert rows(config.db, "SELECT model, model_sha256, optimizer_model, "
                           "optimizer_model_sha256 FROM runs") == [
        ("same.gguf", SHA_A, "same.gguf", SHA_A)]
    # the run's config names the model it ran, so a resume or fork loads the same one
    assert rows(config.db, "SELECT config->>'model' FROM runs") == [("same.gguf",)]


def test_a_logged_local_run_without_a_model_was_smollm2():
    config = RunConfig.from_json({"graph": "g.yaml", "backend": "local", "model": None})
    assert config.model == "smollm2-135m"
    assert RunConfig.from_json({"graph": "g.yaml", "backend": "openai"}).model is None


def test_a_version_6_log_gains_the_model_sha256_columns_in_place(tmp_path):
    db = tmp_path / "v6.duckdb"
    log_at_version(db, 6, "runs", ",\n        model_sha256 VARCHAR, optimizer_model_sha256 "
                                  "VARCHAR", ("runs", {"run_id": "r", "model": "m"}))
    assert "model_sha256" not in str(rows(db, "DESCRIBE runs"))
    open_for_writing(db)
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT max(version) FROM schema_version").fetchone()[0] == \
            SCHEMA_VERSION == 9
        assert con.execute("SELECT run_id, model, model_sha256, optimizer_model_sha256 "
                           "FROM runs").fetchall() == [("r", "m", None, None)]


def test_forward_calls_stop_at_the_closing_tag_and_the_cut_reply_parses(tmp_path):
    backend = FileModel(SHA_A, responder=lambda r: "<output>7</output> and then more"
                        if r.purpose == "forward" else None)
    config = demo_config(tmp_path, steps=0)
    asyncio.run(execute(config, forward_backend=backend))
    forward = [r for r in backend.requests if r.purpose == "forward"]
    assert forward and all(r.stop == ("</output>",) for r in forward)
    assert all(r.stop == () for r in backend.requests if r.purpose != "forward")
    # the backend cut each reply at the stop; the output is read with no fallback
    assert rows(config.db, "SELECT DISTINCT raw_text, output_text, parse_error "
                           "FROM node_outputs") == [("<output>7", "7", None)]


def test_parse_output_reads_an_output_cut_by_the_stop_but_not_one_cut_by_the_limit():
    assert parse_output("Thinking. <output>7", stopped=True) == ("7", None)
    output, problem = parse_output("Thinking. <output>7", stopped=False)
    assert output == "7" and problem and "unclosed" in problem
    # a closed block is read as before; the stop adds nothing to it
    assert parse_output("<output>3</output>", stopped=True) == ("3", None)


class _Made(ScriptedBackend):
    """What engine.llm.factory.make_backend would build for a local model: its file's
    name and SHA-256 (the test's stand-in for LocalBackend)."""

    name = "local"

    def __init__(self, model: str, **_):
        super().__init__()
        from engine.llm.models import resolve_model

        resolved = resolve_model(model)
        self.model_name, self.model_sha256 = resolved.name, resolved.sha256


def _client(tmp_path, monkeypatch, **settings):
    from engine.llm import factory
    from engine.llm.cache import Cache
    from engine.runs.execute import make_client

    made: list[str] = []

    def make_backend(kind, **options):
        made.append(str(options["model"]))
        return _Made(options["model"])

    monkeypatch.setattr(factory, "make_backend", make_backend)
    config = RunConfig(graph="g.yaml", backend="local", db=str(tmp_path / "r.duckdb"),
                       **settings)
    return make_client(config, Cache("off"), None, None), made


def test_an_optimizer_model_of_its_own_gets_a_backend_of_its_own(tmp_path, monkeypatch):
    """--optimizer-model naming another embedded model loads that model for the optimizer's
    calls (a local backend runs one file); the run log names and hashes what ran."""
    small, large = tmp_path / "small.gguf", tmp_path / "large.gguf"
    small.write_bytes(b"GGUF small"), large.write_bytes(b"GGUF large")
    client, made = _client(tmp_path, monkeypatch, model=str(small),
                           optimizer_model=str(large))
    assert made == [str(small), str(large)]
    assert client.optimizer_backend is not client.forward_backend
    assert (client.forward_model, client.optimizer_model) == ("small.gguf", "large.gguf")
    assert client.optimizer_backend.model_sha256 != client.forward_backend.model_sha256
    # the same file named again is the same model: one backend serves both
    client, made = _client(tmp_path, monkeypatch, model=str(small),
                           optimizer_model=str(small))
    assert made == [str(small)] and client.optimizer_backend is client.forward_backend


def test_the_default_model_pairs_with_the_larger_optimizer_when_it_is_installed(
        tmp_path, monkeypatch, capsys):
    from engine.llm import models

    files = {}
    for name in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"):
        files[name] = tmp_path / f"{name}.gguf"
        files[name].write_bytes(name.encode())
    monkeypatch.setattr(models, "_resolve_named",
                        lambda spec: models.ResolvedModel(spec.name, files[spec.name], 1,
                                                          spec.name * 2, spec.licence))
    installed = {"qwen2.5-coder-1.5b": True}
    monkeypatch.setattr(models, "list_models", lambda: [
        models.ModelListing(n, installed.get(n, True), None, None, None, "")
        for n in models.MODELS])
    client, made = _client(tmp_path, monkeypatch, model="qwen2.5-coder-0.5b")
    assert made == ["qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
    assert client.optimizer_model == "qwen2.5-coder-1.5b"
    # not installed: the model writes its own gradients, and a note says how to install
    installed["qwen2.5-coder-1.5b"] = False
    client, made = _client(tmp_path, monkeypatch, model="qwen2.5-coder-0.5b")
    assert made == ["qwen2.5-coder-0.5b"]
    assert client.optimizer_backend is client.forward_backend
    assert "python -m engine models install qwen2.5-coder-1.5b" in capsys.readouterr().err
    # a model with no pair, and an optimizer model given by hand, are left as they are
    installed["qwen2.5-coder-1.5b"] = True
    client, made = _client(tmp_path, monkeypatch, model="qwen2.5-coder-1.5b")
    assert made == ["qwen2.5-coder-1.5b"]
    client, made = _client(tmp_path, monkeypatch, model="qwen2.5-coder-0.5b",
                           optimizer_model="qwen2.5-coder-0.5b")
    assert made == ["qwen2.5-coder-0.5b"]
