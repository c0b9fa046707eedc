"""JSON bytes for values that came from a server: ``dumps`` never writes half a line.

orjson refuses a lone surrogate (``"\\ud800"`` escaped in a model's tool arguments decodes to
one) and nesting deeper than 255; the standard library escapes the surrogate
(``ensure_ascii``) and nests as deep as the interpreter's recursion limit allows. Past both,
``Unencodable``: the caller stores the value as it arrived (the raw string) instead.
"""

from __future__ import annotations

import json
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
