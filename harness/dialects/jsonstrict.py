"""Strict JSON for tool-call arguments.

``json.loads`` accepts things a tool-call argument must not be: a repeated key (the last
one silently wins), ``NaN``/``Infinity``, and it reports two concatenated objects
(``{..}{..}``, a typical corruption) only as "Extra data". ``loads_strict`` refuses all of
them and says which it was. Nor does it bound the nesting: a server's arguments nested
10,000 deep raise ``RecursionError`` from deep inside the decoder. Here a value nested deeper
than ``MAX_DEPTH`` is invalid JSON for a tool call ("nested deeper than 128 levels"), said
before decoding; the server's output, not a failure of the harness.
"""

from __future__ import annotations

import json
import re
from typing import Any

INVALID = "invalid_json"
DUPLICATE_KEY = "duplicate_key"
CONCATENATED = "concatenated_json"


class StrictJSONError(ValueError):
    def __init__(self, kind: str, message: str, pos: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.pos = pos


class _RepeatedKeyError(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise _RepeatedKeyError(key)
        obj[key] = value
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_no_constant)
_WS = " \t\n\r"
#: The deepest nesting taken in tool-call arguments (orjson's own limit is 255; real
#: arguments stay within a dozen levels).
MAX_DEPTH = 128
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)


def _too_deep(text: str, start: int = 0) -> int | None:
    """The offset where ``text`` (from ``start``) nests deeper than ``MAX_DEPTH``, or None.
    Brackets inside strings do not count; the scan runs only when there are enough
    brackets at all."""
    if text.count("[", start) + text.count("{", start) <= MAX_DEPTH:
        return None
    depth = 0
    pos = start
    for piece in _STRING.split(text[start:]):
        for i, ch in enumerate(piece):
            if ch in "[{":
                depth += 1
                if depth > MAX_DEPTH:
                    return pos + i
            elif ch in "]}":
                depth -= 1
        pos += len(piece)
    return None


def _deep(pos: int) -> StrictJSONError:
    return StrictJSONError(INVALID, f"nested deeper than {MAX_DEPTH} levels", pos)


def loads_strict(text: str) -> Any:
    """Parse ``text`` as exactly one JSON value (surrounding whitespace allowed)."""
    start = len(text) - len(text.lstrip(_WS))
    if (deep := _too_deep(text, start)) is not None:
        raise _deep(deep)
    try:
        value, end = _DECODER.raw_decode(text, start)
    except _RepeatedKeyError as exc:
        needle = json.dumps(exc.key, ensure_ascii=False)
        first = text.find(needle)
        second = text.find(needle, first + 1) if first >= 0 else -1
        raise StrictJSONError(DUPLICATE_KEY, f"repeated key {exc.key!r}", max(second, 0)) from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(INVALID, exc.msg, exc.pos) from None
    except ValueError as exc:  # NaN / Infinity
        raise StrictJSONError(INVALID, str(exc), start) from None
    except RecursionError:  # deeper than the interpreter allows, in a short text
        raise _deep(start) from None
    rest = text[end:]
    stripped = rest.lstrip(_WS)
    if stripped:
        pos = end + len(rest) - len(stripped)
        if stripped[0] in "{[":
            raise StrictJSONError(CONCATENATED, "two JSON values concatenated", pos)
        raise StrictJSONError(INVALID, "extra data after the JSON value", pos)
    return value


def raw_decode_strict(text: str, pos: int) -> tuple[Any, int]:
    """Decode one JSON value at ``pos`` (no leading whitespace): (value, end offset)."""
    try:
        value, end = _DECODER.raw_decode(text, pos)
    except _RepeatedKeyError as exc:
        raise StrictJSONError(DUPLICATE_KEY, f"repeated key {exc.key!r}", pos) from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(INVALID, exc.msg, exc.pos) from None
    except ValueError as exc:
        raise StrictJSONError(INVALID, str(exc), pos) from None
    except RecursionError:  # nested deeper than the interpreter allows
        raise _deep(pos) from None
    if (deep := _too_deep(text[pos:end])) is not None:
        raise _deep(pos + deep)
    return value, end
