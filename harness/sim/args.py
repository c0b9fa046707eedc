"""Arguments for a declared tool, following its JSON schema and what the session has seen.

String parameters named (or described) like a path take paths that appeared in earlier tool
results and were not used yet; query-like ones take identifiers seen in tool results; the
rest follow the schema: enums, integer bounds (small sensible values), booleans, arrays and
nested objects.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

_PATH_WORDS = re.compile(r"path|file|dir|folder|target|module|location", re.I)
_DIR_WORDS = re.compile(r"dir|folder|directory", re.I)
_QUERY_WORDS = re.compile(r"query|pattern|regex|search|term|keyword|symbol|^q$|identifier", re.I)
_COMMAND_WORDS = re.compile(r"command|cmd|shell", re.I)
_COUNT_WORDS = re.compile(r"limit|max|count|num|lines|results|size|top|depth", re.I)
_LIST_TOOL = re.compile(r"list|ls|tree|dir", re.I)


@dataclass
class Seen:
    """What earlier turns revealed: paths (most recent last), identifiers, used strings."""

    files: list[str] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)
    identifiers: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)

    def unused(self, pool: Sequence[str]) -> list[str]:
        return [p for p in pool if p not in self.used]


def is_path_param(name: str, schema: Mapping[str, Any]) -> bool:
    if _QUERY_WORDS.search(name):
        return False
    if _PATH_WORDS.search(name):
        return True
    desc = str(schema.get("description", ""))
    return bool(re.search(r"\b(path|file|directory)\b", desc, re.I)) and name != "query"


def is_list_tool(name: str) -> bool:
    return bool(_LIST_TOOL.search(name))


def schema_type(schema: Mapping[str, Any]) -> str:
    """The JSON type a value for ``schema`` should have (first non-null one)."""
    if "const" in schema:
        return "const"
    if "enum" in schema:
        return "enum"
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "null")
    if isinstance(t, str):
        return t
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, Mapping) and option.get("type") != "null":
                    return "sub:" + key
    if "properties" in schema:
        return "object"
    return "string"


class ArgMaker:
    """Builds argument dicts for one turn; remembers what it used within the turn."""

    def __init__(self, rng: random.Random, seen: Seen) -> None:
        self.rng = rng
        self.seen = seen

    def arguments(
        self, tool_name: str, parameters: Mapping[str, Any], all_optional: bool = False
    ) -> dict[str, Any]:
        props = parameters.get("properties")
        if not isinstance(props, Mapping):
            return {}
        required = parameters.get("required")
        required = set(required) if isinstance(required, list) else set()
        args: dict[str, Any] = {}
        for name, schema in props.items():
            if not isinstance(schema, Mapping):
                schema = {}
            if name in required or all_optional or self.rng.random() < 0.45:
                args[name] = self.value(tool_name, name, schema)
        return args

    def value(self, tool_name: str, name: str, schema: Mapping[str, Any]) -> Any:
        kind = schema_type(schema)
        rng = self.rng
        if kind == "const":
            return schema["const"]
        if kind == "enum":
            return rng.choice(list(schema["enum"]))
        if kind.startswith("sub:"):
            options = [o for o in schema[kind[4:]] if isinstance(o, Mapping)]
            option = next(o for o in options if o.get("type") != "null")
            return self.value(tool_name, name, option)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "integer":
            return self.integer(name, schema)
        if kind == "number":
            lo = float(schema.get("minimum", 0.0))
            hi = float(schema.get("maximum", lo + 10.0))
            return round(rng.uniform(lo, hi), 2)
        if kind == "array":
            items = schema.get("items")
            items = items if isinstance(items, Mapping) else {"type": "string"}
            lo = int(schema.get("minItems", 1))
            hi = max(lo, int(schema.get("maxItems", max(lo, 3))))
            n = rng.randint(lo, min(hi, lo + 2))
            return [self.value(tool_name, name, items) for _ in range(n)]
        if kind == "object":
            return self.arguments(tool_name, schema)
        if kind == "null":
            return None
        return self.string(tool_name, name, schema)

    def integer(self, name: str, schema: Mapping[str, Any]) -> int:
        lo = schema.get("minimum")
        if lo is None and "exclusiveMinimum" in schema:
            lo = int(schema["exclusiveMinimum"]) + 1
        lo = int(lo) if lo is not None else (1 if _COUNT_WORDS.search(name) else 0)
        hi = schema.get("maximum")
        if hi is None and "exclusiveMaximum" in schema:
            hi = int(schema["exclusiveMaximum"]) - 1
        hi = int(hi) if hi is not None else lo + 200
        if _COUNT_WORDS.search(name):
            nice = [n for n in (10, 20, 50, 100, 200, 400) if lo <= n <= hi]
            if nice:
                return self.rng.choice(nice)
        return self.rng.randint(lo, max(lo, min(hi, lo + 200)))

    def string(self, tool_name: str, name: str, schema: Mapping[str, Any]) -> str:
        if is_path_param(name, schema):
            want_dir = (
                bool(_DIR_WORDS.search(name))
                or is_list_tool(tool_name)
                or "director" in str(schema.get("description", "")).lower()
            )
            value = self.path(want_dir)
        elif _QUERY_WORDS.search(name):
            value = self.identifier()
        elif _COMMAND_WORDS.search(name):
            value = "python -m pytest -q " + self.path(want_dir=True)
        else:
            value = self.phrase(name)
        lo = int(schema.get("minLength", 0))
        hi = int(schema.get("maxLength", 10_000))
        if len(value) < lo:
            value = value + "x" * (lo - len(value))
        return value[:hi]

    def path(self, want_dir: bool) -> str:
        seen = self.seen
        parents = list(dict.fromkeys(f.rsplit("/", 1)[0] for f in seen.files if "/" in f))
        pools = (seen.dirs, parents) if want_dir else (seen.files,)
        for pool in pools:
            fresh = seen.unused(pool)
            if fresh:
                # prefer what the latest results showed, as an agent following a trail does
                choice = self.rng.choice(fresh[-6:])
                seen.used.add(choice)
                return choice
        if want_dir:
            return "."
        return self.rng.choice(seen.files[-6:]) if seen.files else "README.md"

    def identifier(self) -> str:
        fresh = self.seen.unused(self.seen.identifiers)
        if fresh:
            choice = self.rng.choice(fresh[-12:])
            self.seen.used.add(choice)
            return choice
        return self.rng.choice(["TODO", "def main", "class .*Error", "import", "lock"])

    def phrase(self, name: str) -> str:
        subject = self.rng.choice(self.seen.identifiers[-8:] or ["the current module"])
        return self.rng.choice(
            [
                f"Check how {subject} is used",
                f"Notes on {subject}",
                f"Inspect {subject} for the reported problem",
                f"{name.replace('_', ' ')} for {subject}",
            ]
        )
