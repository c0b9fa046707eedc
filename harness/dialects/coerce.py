"""Typing the string values of XML-style dialects (Qwen3-Coder, GLM, MiniMax-M2).

Those formats write every argument as text: strings raw, other values as JSON (Qwen's
template writes booleans the Jinja way, ``True``). A value becomes typed the way vLLM's
``coerce_to_schema_type`` does it:

* with a schema for the parameter (the tool definitions of the request), its declared
  types are tried in the order null > integer > number > boolean > object > array > string:
  ``null`` only as the text ``null``; an integer by ``int()``, a number as a JSON number;
  a boolean from ``true``/``false``/``1``/``0`` (any case); an object or array as JSON.
  When no declared type fits, the value is JSON if it parses, else the string;
* without a schema (no tools given, an unknown tool or parameter), a value that is a JSON
  number, ``true``/``false``/``null``, object or array (or Python's ``True``/``False``/
  ``None``) is that value, anything else the string. ``"3"`` meant as a string therefore
  comes back as 3: pass the tools when the type matters.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")
_PY = {"True": True, "False": False, "None": None}
_NO = object()


def parameters(tools: Sequence[Mapping[str, Any]] | None, name: str) -> Mapping[str, Any] | None:
    """The ``properties`` of tool ``name`` in OpenAI tool definitions, or None."""
    for tool in tools or ():
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters")
            if isinstance(params, Mapping):
                props = params.get("properties")
                return props if isinstance(props, Mapping) else {}
            return {}
    return None


def _types(schema: Mapping[str, Any]) -> set[str]:
    declared = schema.get("type")
    types = {declared} if isinstance(declared, str) else set(declared or ())
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            if isinstance(sub, Mapping):
                types |= _types(sub)
    return {t for t in types if isinstance(t, str)}


def _json(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return _NO


def _as(kind: str, raw: str) -> Any:
    text = raw.strip()
    if kind == "null":
        return None if text == "null" else _NO
    if kind == "integer":
        try:
            return int(text)
        except ValueError:
            return _NO
    if kind == "number":
        value = _json(text)
        return value if isinstance(value, int | float) and not isinstance(value, bool) else _NO
    if kind == "boolean":
        low = text.lower()
        return True if low in ("true", "1") else False if low in ("false", "0") else _NO
    if kind in ("object", "array"):
        value = _json(text)
        return value if isinstance(value, dict if kind == "object" else list) else _NO
    return raw  # string


def guess(raw: str) -> Any:
    """A value with no schema: JSON when it is a JSON literal or container, else the text."""
    if raw in _PY:
        return _PY[raw]
    value = _json(raw)
    return raw if value is _NO or isinstance(value, str) else value


def coerce(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """The value of one parameter written as ``raw`` (see the module doc)."""
    if schema is None:
        return guess(raw)
    types = _types(schema)
    if not types:
        return guess(raw)
    for kind in _ORDER:
        if kind in types:
            value = _as(kind, raw)
            if value is not _NO:
                return value
    value = _json(raw)
    return raw if value is _NO else value


def coerce_args(
    raw: Mapping[str, str], name: str, tools: Sequence[Mapping[str, Any]] | None
) -> dict[str, Any]:
    props = parameters(tools, name)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        schema = props.get(key) if props is not None else None
        out[key] = coerce(value, schema if isinstance(schema, Mapping) else None)
    return out


def xml_value(value: Any, *, python_literals: bool = False) -> str:
    """How the templates write one value as text: strings raw, the rest as JSON.

    ``python_literals``: booleans as Jinja writes them (``True``), as Qwen's template does
    (its ``None`` is written ``null`` here, the one spelling both servers read as null).
    """
    if isinstance(value, str):
        return value
    if python_literals and isinstance(value, bool):
        return "True" if value else "False"
    return json.dumps(value, ensure_ascii=False)
