"""Validate a reply against the JSON schema it was asked to follow."""

from __future__ import annotations

import json
from typing import Any

import pytest


def assert_follows(schema: dict[str, Any], reply: str) -> dict[str, Any]:
    """The reply parsed as JSON; fails the test unless it is valid under `schema`
    (lengths included), and unless its fields come in the schema's order."""
    jsonschema = pytest.importorskip("jsonschema")
    value = json.loads(reply)
    jsonschema.validate(value, schema)
    assert list(value) == list(schema["properties"]), "fields out of the schema's order"
    return value
