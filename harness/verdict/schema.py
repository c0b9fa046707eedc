"""Minimal argument checks for tool calls: declared name, JSON object, JSON schema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from harness.dialects.base import ToolCall


def _schemas(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]] | None:
    if not tools:
        return None
    out: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function", tool)
        out[fn["name"]] = fn.get("parameters") or {"type": "object"}
    return out


def _check(name: str, args: Any, schemas: dict[str, dict[str, Any]] | None) -> list[str]:
    if schemas is not None and name not in schemas:
        return [f"unknown tool {name!r}"]
    if not isinstance(args, dict):
        return [f"{name}: arguments are not a JSON object"]
    if schemas is not None:
        err = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schemas[name]).iter_errors(args)
        )
        if err is not None:
            return [f"{name}: {err.message}"]
    return []


def check_calls(calls: list[ToolCall], tools: list[dict[str, Any]] | None) -> list[str]:
    schemas = _schemas(tools)
    return [p for c in calls for p in _check(c.name, c.arguments, schemas)]


def check_server_calls(
    calls: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> list[str]:
    schemas = _schemas(tools)
    problems: list[str] = []
    for call in calls:
        fn = call.get("function", call)
        raw = fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except json.JSONDecodeError as exc:
            problems.append(f"{fn.get('name')}: arguments are not valid JSON ({exc.msg})")
            continue
        problems += _check(str(fn.get("name")), args, schemas)
    return problems
