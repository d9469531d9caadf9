"""Shared fixtures. Helpers (graphs, data, running the engine, reading the run log) live
in tests/support/ and are imported from there."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.graphs import SHARED_DATASETS
from tests.support.models import browser_missing, embedded_model_missing
from tests.support.postgres import postgres_missing, start_postgres, stop_postgres


def pytest_collection_modifyitems(config, items):
    """Tests marked `embedded_model`, `browser` or `postgres` are skipped, with the reason, on a machine
    without the model or the browser (markers in pyproject.toml)."""
    missing = {"embedded_model": embedded_model_missing, "browser": browser_missing,
               "postgres": postgres_missing}
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


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server on 127.0.0.1 for the session (tests/support/postgres.py)."""
    why = postgres_missing()
    if why:
        pytest.skip(why)
    server = start_postgres()
    yield server
    stop_postgres(server)


@pytest.fixture
def lake(postgres, tmp_path, monkeypatch):
    """A fresh, empty team lake: a new database on the session's server as its catalog and
    a folder under tmp_path as its data path; this process's environment reaches it."""
    import uuid

    from tests.support.postgres import PASSWORD

    name = postgres.create_database(f"lake_{uuid.uuid4().hex[:12]}")
    data = tmp_path / "lake-data"
    data.mkdir()
    monkeypatch.setenv("PGPASSWORD", PASSWORD)
    monkeypatch.setenv("SEMBACK_DATA_PATH", str(data))
    return f"ducklake:postgres:{postgres.dsn(name)}"


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for a module's browser tests (tests/support/browser.py)."""
    from tests.support.browser import chromium

    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser):
    """A fresh 1400x1800 tab that dismisses dialogs and records requests leaving the machine
    (`page.outside`); a module overrides it for another size (tests/support/browser.py)."""
    from tests.support.browser import open_page

    with open_page(browser) as tab:
        yield tab
