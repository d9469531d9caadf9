"""What a backend needs to know of a reply's JSON schema: how many tokens a reply to it may
take, and the name of its reasoning field. The schemas themselves belong to the prompt
layer (engine/prompts/structured.py)."""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_ITEMS = 8  # an array without maxItems is budgeted as this many items


def reasoning_key(names: list[str]) -> str:
    """The reasoning field's name: `reasoning`, unless an input is called that."""
    key = "reasoning"
    while key in names:
        key += "_"
    return key


def token_budget(schema: dict[str, Any]) -> int:
    """Generated tokens that always fit a reply to `schema`: its longest strings at about
    three characters a token (grammar-constrained text is ordinary words), plus the JSON
    punctuation and field names."""
    chars, fields = 0, 0
    for field in schema.get("properties", {}).values():
        fields += 1
        if field.get("type") == "array":
            chars += field["items"]["maxLength"] * field.get("maxItems", DEFAULT_MAX_ITEMS)
            fields += field.get("maxItems", DEFAULT_MAX_ITEMS)
        else:
            chars += field.get("maxLength", 0)
    return chars // 3 + 8 * fields + 16
