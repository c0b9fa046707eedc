"""JSON bytes for values that came from a server: ``dumps`` never writes half a line.

orjson refuses a lone surrogate (``"\\ud800"`` escaped in a model's tool arguments decodes to
one) and nesting deeper than 255; the standard library escapes the surrogate
(``ensure_ascii``) and nests as deep as the interpreter's recursion limit allows. Past both,
``Unencodable``: the caller stores the value as it arrived (the raw string) instead.

``printable`` is the other way: a value read back from turns.jsonl, made fit for every writer
that needs UTF-8 (parquet, HTML, Markdown, JUnit, the terminal): a lone surrogate becomes its
escape, shown as text (``\\ud800``), everything else left as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson


class Unencodable(ValueError):
    """A value neither encoder can write (nesting too deep, a type JSON has not)."""


def dumps(value: Any) -> bytes:
    """``value`` as JSON bytes (orjson when it can; the standard library, all ASCII, else)."""
    try:
        return orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        pass
    try:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode("ascii")
    except (TypeError, ValueError, RecursionError) as exc:
        raise Unencodable(f"{type(exc).__name__}: {exc}") from None


def loads(raw: bytes) -> Any:
    """orjson, or the standard library for what orjson refuses (a lone surrogate's escape,
    an integer past 64 bits, NaN): the same values as ``json.loads``, faster."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


#: A code point of the surrogate range: in a Python string, always a lone one (a pair read
#: from JSON is one character outside the range).
_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    return f"\\u{ord(m.group()):04x}"


def printable(value: Any) -> Any:
    """``value`` with every lone surrogate in its strings (keys too) written as its escape
    (``"\\ud800"``, six characters), so that it encodes as UTF-8."""
    if isinstance(value, str):
        return _SURROGATE.sub(_escape, value) if _SURROGATE.search(value) else value
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable(v) for v in value]
    return value
