"""function_schema and schema_hash."""

from __future__ import annotations

from typing import Literal

from agentrft.tools.schema import function_schema, parse_docstring, schema_hash


def lookup(
    query: str,
    k: int = 5,
    mode: Literal["fast", "exact"] = "fast",
    tags: list[str] | None = None,
    scale: float = 1.0,
    strict: bool = False,
) -> str:
    """Find things by keywords.

    Longer explanation that stays in the description.

    Args:
        query: what to look for,
            continued on a second line.
        k (int): how many results.
        mode: speed or precision.

    Returns:
        text.
    """
    return query


def test_schema_types_required_and_descriptions() -> None:
    s = function_schema(lookup)
    assert s["type"] == "function"
    fn = s["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == "Find things by keywords.\n\nLonger explanation that stays in the description."
    params = fn["parameters"]
    assert params["required"] == ["query"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["query"] == {"type": "string", "description": "what to look for, continued on a second line."}
    assert props["k"] == {"type": "integer", "description": "how many results.", "default": 5}
    assert props["mode"] == {
        "type": "string",
        "enum": ["fast", "exact"],
        "description": "speed or precision.",
        "default": "fast",
    }
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["scale"] == {"type": "number", "default": 1.0}
    assert props["strict"] == {"type": "boolean", "default": False}


def test_bound_method_has_no_self_and_name_override() -> None:
    class Box:
        def get(self, key: str) -> str:
            """Get a key."""
            return key

    s = function_schema(Box().get, name="fetch")
    assert s["function"]["name"] == "fetch"
    assert list(s["function"]["parameters"]["properties"]) == ["key"]


def test_parse_docstring_without_args() -> None:
    assert parse_docstring("One line.") == ("One line.", {})
    assert parse_docstring(None) == ("", {})


def test_schema_hash_is_canonical_and_sensitive() -> None:
    a = [function_schema(lookup)]
    b = [{"function": a[0]["function"], "type": "function"}]  # same content, other key order
    assert schema_hash(a) == schema_hash(b)
    assert len(schema_hash(a)) == 16
    changed = [function_schema(lookup, description="Other.")]
    assert schema_hash(changed) != schema_hash(a)
