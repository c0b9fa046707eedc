"""Bare JSON tool calls: an output that ends in JSON objects where a tool call is expected.

Some models (and some corrupted outputs of Hermes or DSML models that lost their envelope)
write a tool call as a bare JSON object: ``{"name": "f", "arguments": {...}}``. A single
valid JSON value is ordinary content (a model asked to answer in JSON), so this dialect
never reports a valid call; it only finds near misses at the end of an output:

* two or more JSON values glued on one line (``{...}{...}``, the same call emitted twice is
  the typical case); values on separate lines are JSON Lines and stay content;
* a tool-call-like object (first key ``name``, ``function``, ``tool``, ``arguments`` or
  ``parameters``) that does not parse (unbalanced braces, a missing quote), or a whole
  output that is one JSON object (``{"`` ... ``}``) that does not parse.

The JSON must start a line and run to the end of the output (an end-of-turn token aside),
so JSON quoted inside prose or in a fenced block is not a near miss.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.declare import Entry
from harness.dialects.jsonstrict import StrictJSONError, raw_decode_strict
from harness.dialects.markup import Tools
from harness.dialects.stream import MarkupStream, Stream
from harness.errors import UsageError

#: End-of-turn tokens that may follow the JSON in a raw output.
_EOS = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<\uff5cend\u2581of\u2581sentence\uff5c>")
#: A line that starts a JSON object (or an array of objects) with a string key.
_START = re.compile(r'\n[ \t]*(\[\s*)?\{\s*"')  # a literal first: jumps newline to newline
_CALL_KEY = re.compile(r'\[?\s*\{\s*"(?:name|function|tool|tool_name|arguments|parameters)"')
_WS = " \t\r\n"


def _body(text: str) -> str:
    body = text.rstrip()
    for eos in _EOS:
        if body.endswith(eos):
            return body[: -len(eos)]
    return body


def _scan(text: str) -> tuple[int, int, str] | None:
    """(start of the JSON, offset of the near miss, reason), or None."""
    body = _body(text).rstrip(_WS)
    if not body.endswith(("}", "]")):
        return None
    for m in _START.finditer("\n" + body):
        start = m.end() - len(m.group(0).lstrip("\n \t")) - 1
        found = _check(body, start)
        if found is not None:
            return start, found[0], found[1]
        if _decodes_to_end(body, start):
            return None  # valid JSON (one value or JSON Lines) up to the end: content
    return None


def _decodes_to_end(body: str, pos: int) -> bool:
    try:
        while pos < len(body):
            _, pos = raw_decode_strict(body, pos)
            while pos < len(body) and body[pos] in _WS:
                pos += 1
    except StrictJSONError:
        return False
    return True


def _check(body: str, start: int) -> tuple[int, str] | None:
    pos, values = start, 0
    while True:
        try:
            _, end = raw_decode_strict(body, pos)
        except StrictJSONError as exc:
            # a call-shaped object, or a whole output that is one broken JSON object
            whole = start == 0 and body.startswith("{")
            if values == 0 and (whole or _CALL_KEY.match(body, start)):
                return exc.pos, f"tool call JSON does not parse ({exc.message})"
            return None
        values += 1
        gap = end
        while gap < len(body) and body[gap] in " \t":
            gap += 1
        if gap >= len(body):
            return None  # one value, or JSON Lines ending here: content
        if body[gap] in "\r\n":
            return None  # values on separate lines: JSON Lines, content
        if body[gap] not in "{[":
            rest = body[gap:]
            if values == 1 and not rest.strip("}] \t") and _CALL_KEY.match(body, start):
                return gap, "unbalanced braces after the tool call JSON"
            return None  # JSON followed by text on the same line: prose quoting JSON
        return gap, "two JSON values concatenated where one tool call belongs"


def first_marker(text: str) -> int:
    if "{" not in text:
        return -1
    found = _scan(text)
    return -1 if found is None else found[0]


def parse(text: str, *, server_content: bool = False) -> ParseResult:
    """Near misses of a bare JSON tool call (a valid one is left as content)."""
    found = _scan(text) if "{" in text else None
    if found is None:
        return ParseResult(content=text)
    _, offset, reason = found
    return ParseResult(text, found=True, ok=False, error=reason, offset=offset, dialect="json")


@dataclass(frozen=True)
class JsonCallDialect:
    """Bare JSON tool calls: only their near misses are markup (valid JSON is content)."""

    name: str = "json"

    def first_marker(self, text: str) -> int:
        return first_marker(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return parse(text, server_content=server_content)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        raise UsageError("the json dialect only finds near misses: it has no encoding")

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return ()

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content)


# (bare JSON is what every envelope holds: tried only when no other dialect finds markup)
DIALECTS = (Entry(JsonCallDialect(), rank=900, fallback=True),)
