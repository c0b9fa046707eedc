"""Hermes / Qwen tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Canonical turn (Qwen's chat template): content, then one block per call, each
``<tool_call>\\n{json}\\n</tool_call>``, separated by newlines, then ``<|im_end|>``. The JSON
is strict (no repeated keys, no NaN, one object per block); ``arguments`` is an object.
Accepted but non-canonical: ``arguments`` as a JSON-encoded string, ``parameters`` in place
of ``arguments``, no ``arguments`` at all, no end-of-turn token. Near misses (an unclosed
or unopened tag, broken JSON, text after the calls) are errors with an offset. A block
without the canonical newlines (``<tool_call>{...}</tool_call>``) is accepted by both
servers: non-canonical. Markup inside a fenced code block is content.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.jsonstrict import StrictJSONError, loads_strict
from harness.dialects.markup import (
    NC_NEWLINES,
    NC_NO_EOS,
    Fail,
    Tools,
    failed,
    mask_fences,
    parsed,
    turn,
)

NAME = "hermes"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
EOS = "<|im_end|>"
NC_STRING_ARGS = "arguments as a JSON string"
NC_PARAMETERS = "parameters instead of arguments"
NC_NO_ARGS = "no arguments key"

#: Hermes-like tags, exact or mangled (singular: ``<tool_calls>`` belongs to DSML).
_FRAGMENT = re.compile(r"<[ \t]{0,2}/?[ \t]{0,2}tool[_-]?call[ \t]{0,2}>", re.IGNORECASE)
_KEYS = {"name", "arguments", "parameters"}


_OPENER = re.compile(re.escape(OPEN))


def first_marker(text: str) -> int:
    m = _FRAGMENT.search(mask_fences(text, _OPENER))
    return m.start() if m else -1


def _call(obj: Any, offset: int, noncanonical: list[str]) -> ToolCall:
    if not isinstance(obj, dict):
        raise Fail("tool call is JSON but not an object", offset)
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        raise Fail("tool call without a string name", offset)
    extra = set(obj) - _KEYS
    if extra:
        raise Fail(f"unexpected keys in the tool call: {sorted(extra)}", offset)
    if "arguments" in obj and "parameters" in obj:
        raise Fail("both arguments and parameters in the tool call", offset)
    if "parameters" in obj:
        noncanonical.append(NC_PARAMETERS)
    args = obj.get("arguments", obj.get("parameters"))
    if args is None and "arguments" not in obj and "parameters" not in obj:
        noncanonical.append(NC_NO_ARGS)
        args = {}
    if isinstance(args, str):
        noncanonical.append(NC_STRING_ARGS)
        try:
            args = loads_strict(args)
        except StrictJSONError as exc:
            raise Fail(f"arguments string is not valid JSON ({exc.message})", offset) from None
    if not isinstance(args, dict):
        raise Fail("arguments is not a JSON object", offset)
    return ToolCall(name, args)


def _parse_blocks(body: str, pos: int, noncanonical: list[str]) -> list[ToolCall]:
    calls: list[ToolCall] = []
    while True:
        inner_start = pos + len(OPEN)
        close = body.find(CLOSE, inner_start)
        reopen = body.find(OPEN, inner_start)
        if close < 0:
            truncated = reopen < 0
            reason = "truncated tool call" if truncated else "unclosed <tool_call>"
            raise Fail(reason, pos, calls)
        if 0 <= reopen < close:
            raise Fail("unclosed <tool_call> (a closer lost)", pos, calls)
        inner = body[inner_start:close]
        try:
            obj = loads_strict(inner)
        except StrictJSONError as exc:
            raise Fail(
                f"tool call is not valid JSON ({exc.kind}: {exc.message})",
                inner_start + exc.pos,
                calls,
            ) from None
        try:
            calls.append(_call(obj, inner_start, noncanonical))
        except Fail as exc:
            raise Fail(exc.reason, exc.offset, calls) from None
        if not (inner.startswith("\n") and inner.endswith("\n")) or inner[1:2].isspace():
            noncanonical.append(NC_NEWLINES)
        end = close + len(CLOSE)
        pos = end
        while pos < len(body) and body[pos] in " \t\n\r":
            pos += 1
        if body.startswith(OPEN, pos):
            if body[end:pos] != "\n":
                noncanonical.append(NC_NEWLINES)
            continue
        if pos < len(body):
            frag = _FRAGMENT.search(body, pos)
            what = "a stray tag" if frag is not None and frag.start() == pos else "text"
            raise Fail(f"{what} after the tool calls", pos, calls)
        return calls


def parse(text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
    """Parse one assistant output in the Hermes dialect (arguments are JSON: not coerced)."""
    return _analyse(text, server_content)[0]


def complete_calls(text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
    """The calls complete in ``text`` (all of them, or those before the first error)."""
    return _analyse(text, True)[1]


def _analyse(text: str, server_content: bool) -> tuple[ParseResult, tuple[ToolCall, ...]]:
    eos = text.endswith(EOS)
    body = text[: -len(EOS)] if eos else text
    masked = mask_fences(body, _OPENER)
    first = masked.find(OPEN)
    frag = _FRAGMENT.search(masked, 0, first if first >= 0 else len(body))
    if frag is not None:
        reason = f"Hermes-like tag {frag.group(0)!r} outside a well-formed block"
        return failed(text, reason, frag.start(), "", eos), ()  # (no dialect named)
    if first < 0:
        return ParseResult(content=body, eos=eos), ()
    noncanonical: list[str] = []
    try:
        calls = _parse_blocks(body, first, noncanonical)
    except Fail as exc:
        return failed(text, exc.reason, exc.offset, NAME, eos), exc.calls
    if not eos and not server_content:
        noncanonical.append(NC_NO_EOS)
    return parsed(body[:first].rstrip("\n"), calls, noncanonical, eos, NAME), tuple(calls)


def encode(content: str, calls: Sequence[ToolCall]) -> str:
    """The canonical raw turn (Qwen's chat template)."""
    return encode_turn(content, list(calls))


def encode_turn(content: str, calls: list[ToolCall], eos: bool = True) -> str:
    """A canonical Hermes turn (used by tests and the simulator)."""
    blocks = [
        f"{OPEN}\n"
        + json.dumps({"name": c.name, "arguments": c.arguments}, ensure_ascii=False)
        + f"\n{CLOSE}"
        for c in calls
    ]
    return turn(content, "\n".join(blocks), EOS if eos else "")


# (tokens: none, a broken Hermes block is also a broken Qwen3-Coder or GLM one)
DIALECTS = (
    Entry(MarkupDialect(NAME, first_marker, parse, encode, complete_calls), rank=20, auto=True,
          aliases=("qwen3_json", "qwen25", "qwen")),
)  # fmt: skip
