"""The default embedded model, Qwen2.5-Coder-0.5B, end to end from the command line: joined
from its PyPI parts, verified, and recorded by name and SHA-256 (a minute or two on two
cores; the fast tests run SmolLM2 or the scripted backend)."""

from __future__ import annotations

import pytest

from engine.cli import main
from engine.llm import models
from tests.support.graphs import REPO
from tests.support.runlog import rows

pytestmark = [pytest.mark.embedded_model, pytest.mark.slow]

QWEN = models.MODELS["qwen2.5-coder-0.5b"]


def test_the_demo_runs_on_the_default_model_and_logs_its_identity(tmp_path):
    if models.missing_packages(QWEN):
        pytest.skip(f"the default model is not installed ({QWEN.pip_command})")
    db = tmp_path / "runs.duckdb"
    assert main(["run", str(REPO / "sample_graphs" / "demo.yaml"), "--backend", "local",
                 "--steps", "0", "--train", "2", "--val", "2", "--test", "0",
                 "--db", str(db)]) == 0
    assert rows(db, "SELECT model, model_sha256, config->>'model' FROM runs") == [
        ("qwen2.5-coder-0.5b", QWEN.sha256, "qwen2.5-coder-0.5b")]
    # every forward call asked to stop at the closing tag, and every reply was read
    assert rows(db, "SELECT count(*) FROM node_outputs WHERE output_text = ''") == [(0,)]
    assert rows(db, "SELECT count(*) FROM node_outputs WHERE raw_text LIKE '%</output>%'"
                ) == [(0,)]
