"""MiniMax-M2 tool calls (vLLM ``minimax_m2``, SGLang ``minimax-m2``).

Canonical block (after the content and a newline; the turn ends with ``[e~[``)::

    <minimax:tool_call>
    <invoke name="get_weather">
    <parameter name="city">Tokyo</parameter>
    </invoke>
    <invoke name="get_time">
    </invoke>
    </minimax:tool_call>

Values are raw text (strings unescaped, other values JSON), kept byte for byte and typed by
``coerce``. Accepted but non-canonical: other whitespace between the tags (the block on one
line), no end-of-turn token. Near misses: a piece of the markup outside the wrapper
(``<invoke`` without ``<minimax:tool_call>``, an orphan ``</parameter>``), a mangled
wrapper, a name in single quotes or unquoted (SGLang refuses it), an unclosed parameter or
invoke, an unclosed block, a repeated parameter, text after the block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.dialects.base import ToolCall
from harness.dialects.coerce import coerce_args, xml_value
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.markup import (
    BlockGrammar,
    Fail,
    Tools,
    closes,
    expect_ws,
    need,
    snippet,
    tag_blocks,
    value_end,
)

NAME = "minimax-m2"
OPEN, CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_CLOSE, PARAM_CLOSE = "</invoke>", "</parameter>"
EOS = "[e~["

_OPENER = re.compile(re.escape(OPEN))
FRAGMENT = re.compile(
    r"<[ \t]{0,2}/?[ \t]{0,2}minimax[:_ ]?[ \t]?tool[_ ]?calls?[ \t]{0,2}>"
    r"|<[ \t]{0,2}(?:invoke|parameter)[ \t]{1,3}name[ \t]?="
    r"|<[ \t]{0,2}/[ \t]{0,2}(?:invoke|parameter)[ \t]{0,2}>",
    re.IGNORECASE,
)
_INVOKE = re.compile(r'<invoke name="([^"<>\n]+)">')
_PARAM = re.compile(r'<parameter name="([^"<>\n]+)">')
_INNER = re.compile(r"<(?:invoke|parameter)[ \t]|</invoke>|</?minimax:tool_call>")


def _need(body: str, pos: int, expected: str, calls: list[ToolCall]) -> Fail:
    if ">" not in body[pos:]:
        return Fail(f"truncated block: expected {expected}", pos, calls)
    if body.startswith(("<invoke", "<parameter"), pos):
        tag = snippet(body, pos)
        return Fail(f"malformed tag {tag} (the name must be in double quotes)", pos, calls)
    return need(body, pos, expected, calls)


def _scan(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
    calls: list[ToolCall] = []
    p = expect_ws(body, start + len(OPEN), "\n", nc)
    while True:
        if (end := closes(body, p, CLOSE, calls, "block with no invoke")) >= 0:
            return calls, end
        m = _INVOKE.match(body, p)
        if m is None:
            raise _need(body, p, f'<invoke name="..."> or {CLOSE}', calls)
        name, p = m.group(1), m.end()
        raw: dict[str, str] = {}
        while True:
            p = expect_ws(body, p, "\n", nc)
            if body.startswith(INVOKE_CLOSE, p):
                p += len(INVOKE_CLOSE)
                break
            pm = _PARAM.match(body, p)
            if pm is None and _INVOKE.match(body, p):
                raise Fail(f"invoke {name!r} not closed before the next <invoke>", p, calls)
            if pm is None:
                raise _need(body, p, f'<parameter name="..."> or {INVOKE_CLOSE}', calls)
            key, vstart = pm.group(1), pm.end()
            vend = value_end(body, vstart, PARAM_CLOSE, _INNER, f"parameter {key!r}", calls)
            if key in raw:
                raise Fail(f"repeated parameter {key!r}", pm.start(), calls)
            raw[key] = body[vstart:vend]
            p = vend + len(PARAM_CLOSE)
        calls.append(ToolCall(name, coerce_args(raw, name, tools)))
        p = expect_ws(body, p, "\n", nc)


def _write(calls: Sequence[ToolCall]) -> str:
    invokes = tag_blocks(
        calls,
        lambda c, params: f'<invoke name="{c.name}">\n{params}{INVOKE_CLOSE}\n',
        lambda k, v: f'<parameter name="{k}">{xml_value(v)}{PARAM_CLOSE}\n',
        "",
    )
    return f"{OPEN}\n{invokes}{CLOSE}"


GRAMMAR = BlockGrammar(NAME, _OPENER, FRAGMENT, _scan, eos=(EOS,), what="MiniMax", write=_write)
encode = GRAMMAR.encode

DIALECTS = (
    Entry(MarkupDialect.of(GRAMMAR), rank=150, auto=True, aliases=("minimax_m2", "minimax")),
)
