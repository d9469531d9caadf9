"""Shared fixtures. Helpers (graphs, data, running the engine, reading the run log) live
in tests/support/ and are imported from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.graphs import SHARED_DATASETS
from tests.support.models import browser_missing, embedded_model_missing


def pytest_collection_modifyitems(config, items):
    """Tests marked `embedded_model` or `browser` are skipped, with the reason, on a machine
    without the model or the browser (markers in pyproject.toml)."""
    missing = {"embedded_model": embedded_model_missing, "browser": browser_missing}
    reasons: dict[str, str | None] = {}
    for item in items:
        for marker, why in missing.items():
            if item.get_closest_marker(marker):
                if marker not in reasons:
                    reasons[marker] = why()
                if reasons[marker]:
                    item.add_marker(pytest.mark.skip(reason=reasons[marker]))


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"benchmark data sets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS
