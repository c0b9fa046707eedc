"""Kimi-K2 tool calls (vLLM and SGLang ``kimi_k2``).

Canonical turn (one line, ASCII special tokens, no separators)::

    text<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0
    <|tool_call_argument_begin|>{"city": "Tokyo"}<|tool_call_end|><|tool_call_begin|>
    functions.get_time:1<|tool_call_argument_begin|>{}<|tool_call_end|>
    <|tool_calls_section_end|><|im_end|>

The header is ``functions.NAME:IDX``; ``IDX`` counts calls over the whole conversation, so
any number is accepted (``encode`` counts from 0). Arguments are a strict JSON object.
Accepted but non-canonical: a header without ``functions.`` (SGLang accepts it),
whitespace between the tokens, no end-of-turn token. Near misses: a mangled token, a call
outside a section, a header without ``:IDX`` (vLLM drops the call), arguments that are not
a JSON object, an unclosed call or section, text after the section.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from harness.dialects.base import ToolCall
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.jsonstrict import StrictJSONError, loads_strict
from harness.dialects.markup import NC_NEWLINES, BlockGrammar, Fail, Tools, closes, expect_ws, need

NAME = "kimi-k2"
SECTION_BEGIN, SECTION_END = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CALL_BEGIN, CALL_END = "<|tool_call_begin|>", "<|tool_call_end|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
EOS = "<|im_end|>"
NC_NO_PREFIX = "call header without functions."

_OPENER = re.compile(re.escape(SECTION_BEGIN))
FRAGMENT = re.compile(
    r"(?:<\|?|\|)[ \t]?tool[_ ]?calls?[_ ]?(?:section[_ ]?|argument[_ ]?)?(?:begin|end)"
    r"[ \t]?(?:\|>?|>)",
    re.IGNORECASE,
)
_HEADER = re.compile(r"(functions\.)?([^\s:<>|]+):(\d+)")


def _need(body: str, pos: int, expected: str, calls: list[ToolCall]) -> Fail:
    return need(body, pos, expected, calls, "section")


def _scan(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
    calls: list[ToolCall] = []
    p = expect_ws(body, start + len(SECTION_BEGIN), "", nc)
    while True:
        if (end := closes(body, p, SECTION_END, calls)) >= 0:
            return calls, end
        if not body.startswith(CALL_BEGIN, p):
            raise _need(body, p, f"{CALL_BEGIN} or {SECTION_END}", calls)
        p = expect_ws(body, p + len(CALL_BEGIN), "", nc)
        args_at = body.find(ARGS_BEGIN, p)
        stray = FRAGMENT.search(body, p, args_at if args_at >= 0 else len(body))
        if stray is not None:
            raise Fail(f"call header broken by {stray.group(0)!r}", stray.start(), calls)
        if args_at < 0:
            raise Fail(f"truncated section: call header without {ARGS_BEGIN}", p, calls)
        header = body[p:args_at].strip()
        m = _HEADER.fullmatch(header)
        if m is None:
            if re.fullmatch(r"(functions\.)?[^\s:<>|]+", header):
                raise Fail(f"call header {header!r} without :INDEX", p, calls)
            raise Fail(f"malformed call header {header!r}", p, calls)
        if not m.group(1):
            nc.append(NC_NO_PREFIX)
        if header != body[p:args_at]:
            nc.append(NC_NEWLINES)  # whitespace around the header
        p = args_at + len(ARGS_BEGIN)
        end = body.find(CALL_END, p)
        stray = FRAGMENT.search(body, p, end if end >= 0 else len(body))
        if stray is not None:
            raise Fail(f"call not closed before {stray.group(0)!r}", stray.start(), calls)
        if end < 0:
            raise Fail("truncated section: arguments not closed", p, calls)
        try:
            args = loads_strict(body[p:end])
        except StrictJSONError as exc:
            reason = f"arguments are not valid JSON ({exc.kind}: {exc.message})"
            raise Fail(reason, p + exc.pos, calls) from None
        if not isinstance(args, dict):
            raise Fail("arguments are JSON but not an object", p, calls)
        calls.append(ToolCall(m.group(2), args))
        p = expect_ws(body, end + len(CALL_END), "", nc)


def _write(calls: Sequence[ToolCall]) -> str:
    body = "".join(
        f"{CALL_BEGIN}functions.{c.name}:{i}{ARGS_BEGIN}"
        f"{json.dumps(c.arguments, ensure_ascii=False)}{CALL_END}"
        for i, c in enumerate(calls)
    )
    return f"{SECTION_BEGIN}{body}{SECTION_END}"


# (arguments are JSON: not coerced)
GRAMMAR = BlockGrammar(
    NAME, _OPENER, FRAGMENT, _scan, eos=(EOS,), separator="", what="Kimi-K2", write=_write
)
encode = GRAMMAR.encode

DIALECTS = (Entry(MarkupDialect.of(GRAMMAR), rank=70, auto=True, aliases=("kimi_k2", "kimi")),)
