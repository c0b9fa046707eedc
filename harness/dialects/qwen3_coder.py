"""Qwen3-Coder / Qwen3.5 XML tool calls (vLLM and SGLang ``qwen3_coder``).

Canonical turn (the model's chat template)::

    text
    <tool_call>
    <function=get_weather>
    <parameter=city>
    Tokyo
    </parameter>
    </function>
    </tool_call>
    <tool_call>
    <function=get_time>
    </function>
    </tool_call><|im_end|>

One block per call, newline-separated; text may precede the calls, not follow them. A value
loses one ``\\n`` at each end (both servers strip them) and is typed by ``coerce``
(strings are raw, dicts/lists JSON, booleans ``True``/``False``). Accepted but
non-canonical: missing or extra newlines between the tags, no end-of-turn token. Near
misses: any piece of the markup outside a well-formed block (``<function=`` without
``<tool_call>``, an orphan ``</parameter>``), an unclosed parameter (both servers guess
differently), a missing ``</function>`` or ``</tool_call>``, Hermes JSON inside the
block, a repeated parameter, text after the calls, a truncated block.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.dialects.base import ToolCall
from harness.dialects.coerce import coerce_args, xml_value
from harness.dialects.declare import Entry, MarkupDialect
from harness.dialects.markup import (
    NC_NEWLINES,
    BlockGrammar,
    Fail,
    Tools,
    expect_ws,
    need,
    next_block,
    tag_blocks,
    value_end,
)

NAME = "qwen3-coder"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNC_CLOSE, PARAM_CLOSE = "</function>", "</parameter>"
EOS = "<|im_end|>"

_OPENER = re.compile(re.escape(OPEN))
FRAGMENT = re.compile(
    r"<[ \t]{0,2}/?[ \t]{0,2}tool[_-]?call[ \t]{0,2}>"
    r"|<[ \t]{0,2}/[ \t]{0,2}(?:function|parameter)[ \t]{0,2}>"
    r"|<[ \t]{0,2}(?:function|parameter)[ \t]{0,2}=",
    re.IGNORECASE,
)
_FUNC = re.compile(r"<function=([^<>\n]+)>")
_PARAM = re.compile(r"<parameter=([^<>\n]+)>")
_INNER_TAG = re.compile(r"<parameter=|</function>|</?tool_call>")


def _scan(body: str, pos: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
    calls: list[ToolCall] = []
    while True:
        p = expect_ws(body, pos + len(OPEN), "\n", nc)
        m = _FUNC.match(body, p)
        if m is None:
            if body.startswith("{", p):  # (at the opener: another dialect's shape)
                raise Fail("Hermes JSON inside a Qwen3-Coder <tool_call>", pos, calls)
            raise need(body, p, "<function=NAME> after <tool_call>", calls)
        name = m.group(1).strip()
        p = m.end()
        raw: dict[str, str] = {}
        while True:
            p = expect_ws(body, p, "\n", nc)
            if body.startswith(FUNC_CLOSE, p):
                p += len(FUNC_CLOSE)
                break
            pm = _PARAM.match(body, p)
            if pm is None:
                raise need(body, p, "<parameter=NAME> or </function>", calls)
            key, vstart = pm.group(1).strip(), pm.end()
            vend = value_end(body, vstart, PARAM_CLOSE, _INNER_TAG, f"parameter {key!r}", calls)
            value = body[vstart:vend]
            if value.startswith("\n") and value.endswith("\n") and len(value) >= 2:
                value = value[1:-1]
            else:
                nc.append(NC_NEWLINES)
                value = value.removeprefix("\n").removesuffix("\n")
            if key in raw:
                raise Fail(f"repeated parameter {key!r}", pm.start(), calls)
            raw[key] = value
            p = vend + len(PARAM_CLOSE)
        p = expect_ws(body, p, "\n", nc)
        if not body.startswith(CLOSE, p):
            raise need(body, p, "</tool_call> after </function>", calls)
        calls.append(ToolCall(name, coerce_args(raw, name, tools)))
        p += len(CLOSE)
        if (pos := next_block(body, p, OPEN, "\n", nc)) < 0:
            return calls, p


def _write(calls: Sequence[ToolCall]) -> str:
    """One block per call, newline-separated."""
    return tag_blocks(
        calls,
        lambda call, params: f"{OPEN}\n<function={call.name}>\n{params}{FUNC_CLOSE}\n{CLOSE}",
        lambda key, value: (
            f"<parameter={key}>\n{xml_value(value, python_literals=True)}\n{PARAM_CLOSE}\n"
        ),
        "\n",
    )


GRAMMAR = BlockGrammar(NAME, _OPENER, FRAGMENT, _scan, eos=(EOS,), what="Qwen3-Coder", write=_write)
encode = GRAMMAR.encode

DIALECTS = (
    Entry(MarkupDialect.of(GRAMMAR), rank=30, auto=True, aliases=("qwen3_coder", "qwen3_xml")),
)
