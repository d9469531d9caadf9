"""Shared fixtures. Helpers (graphs, data, running the engine, reading the run log) live
in tests/support/ and are imported from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.graphs import SHARED_DATASETS


@pytest.fixture
def shared_datasets() -> Path:
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"benchmark data sets not found at {SHARED_DATASETS}")
    return SHARED_DATASETS
