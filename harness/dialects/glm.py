"""GLM tool calls: GLM-4.5 / 4.6 (``glm45``) and GLM-4.7 / 5 (``glm47``).

GLM-4.5 writes, after the content and a newline, one block per call::

    <tool_call>get_weather
    <arg_key>city</arg_key>
    <arg_value>Tokyo</arg_value>
    </tool_call>

(``<tool_call>get_time\\n</tool_call>`` with no arguments), blocks separated by newlines.
GLM-4.7 writes the same without any newline: ``<tool_call>get_time</tool_call>``. The
turn ends with ``<|observation|>`` after calls (``<|user|>`` otherwise). Values are raw
text (strings are not quoted or escaped, other values JSON) typed by ``coerce``.

Accepted but non-canonical: the other version's layout (SGLang's glm45 needs the newline
after the name, its glm47 takes 4.5's ``name\\n`` as an unknown name; vLLM reads both),
other whitespace between the tags, no end-of-turn token. Near misses: a piece of the markup
outside a well-formed block (an orphan ``</arg_value>``), a mangled tag, a key without its
value, an unclosed key or value, a missing name, a repeated key, text after the calls,
a cut-off block, Hermes JSON or Qwen3-Coder markup inside ``<tool_call>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from harness.dialects.base import ToolCall
from harness.dialects.coerce import coerce_args, xml_value
from harness.dialects.declare import Versions
from harness.dialects.markup import (
    NC_NEWLINES,
    BlockGrammar,
    Fail,
    Scanner,
    Tools,
    Writer,
    expect_ws,
    need,
    next_block,
    skip_ws,
    tag_blocks,
    value_end,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
KEY, KEY_CLOSE, VALUE, VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"
EOS = ("<|observation|>", "<|user|>", "<|endoftext|>")
VERSIONS = {"glm45": "\n", "glm47": ""}  # version -> the newline it writes between tags

_OPENER = re.compile(re.escape(OPEN))
FRAGMENT = re.compile(
    r"<[ \t]{0,2}/?[ \t]{0,2}tool[ _-]?call[ \t]{0,2}>"
    r"|<[ \t]{0,2}/?[ \t]{0,2}arg[_ -]?(?:key|value)[ \t]{0,2}>",
    re.IGNORECASE,
)
_NAME = re.compile(r"[^\n<>]*")
_INNER = re.compile(r"</?arg_(?:key|value)>|</?tool_call>")


def _scanner(version: str) -> Scanner:
    nl = VERSIONS[version]

    def scan(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
        calls: list[ToolCall] = []
        while True:
            p = start + len(OPEN)
            m = _NAME.match(body, p)
            assert m is not None  # the pattern matches the empty string
            name = m.group(0).strip()
            if not name:
                q = skip_ws(body, p)
                if body.startswith("{", q):  # (at the opener: another dialect's shape)
                    raise Fail("Hermes JSON inside a GLM <tool_call>", start, calls)
                if body.startswith("<function=", q):
                    raise Fail("Qwen3-Coder markup inside a GLM <tool_call>", start, calls)
                raise need(body, q, "a function name after <tool_call>", calls)
            if re.search(r"[\s\"'{}()\[\]=,:]", name):
                raise Fail(f"malformed function name {name!r}", start, calls)
            if m.group(0) != name:
                nc.append(NC_NEWLINES)
            p = m.end()
            raw: dict[str, str] = {}
            while True:
                p = expect_ws(body, p, nl, nc)
                if body.startswith(CLOSE, p):
                    break
                if not body.startswith(KEY, p):
                    raise need(body, p, f"{KEY} or {CLOSE}", calls)
                kstart = p + len(KEY)
                kend = value_end(body, kstart, KEY_CLOSE, _INNER, "<arg_key>", calls)
                key = body[kstart:kend].strip()
                if key != body[kstart:kend]:
                    nc.append(NC_NEWLINES)
                if not key:
                    raise Fail("empty <arg_key>", kstart, calls)
                p = expect_ws(body, kend + len(KEY_CLOSE), nl, nc)
                if not body.startswith(VALUE, p):
                    raise need(body, p, f"{VALUE} after the key {key!r}", calls)
                vstart = p + len(VALUE)
                vend = value_end(
                    body, vstart, VALUE_CLOSE, _INNER, f"<arg_value> of {key!r}", calls
                )
                if key in raw:
                    raise Fail(f"repeated key {key!r}", kstart, calls)
                raw[key] = body[vstart:vend]
                p = vend + len(VALUE_CLOSE)
            calls.append(ToolCall(name, coerce_args(raw, name, tools)))
            p += len(CLOSE)
            if (start := next_block(body, p, OPEN, nl, nc)) < 0:
                return calls, p

    return scan


def _writer(nl: str) -> Writer:
    def write(calls: Sequence[ToolCall]) -> str:
        return tag_blocks(
            calls,
            lambda c, args: f"{OPEN}{c.name}{nl}{args}{CLOSE}",
            lambda k, v: f"{KEY}{k}{KEY_CLOSE}{nl}{VALUE}{xml_value(v)}{VALUE_CLOSE}{nl}",
            nl,
        )

    return write


# a turn with calls ends with <|observation|>, an answer with <|user|>
GRAMMARS = {
    v: BlockGrammar(v, _OPENER, FRAGMENT, _scanner(v), eos=EOS, separator=nl, what="GLM",
                    write=_writer(nl), answer_eos="<|user|>")
    for v, nl in VERSIONS.items()
}  # fmt: skip


#: a GLM tag right after a line break (4.5/4.6) or right after other text (4.7/5); the
#: closers of keys and values follow their text in both layouts, so they tell nothing
_AFTER_NEWLINE = re.compile(
    r"\n[ \t]*(?:<arg_key>|<arg_value>|</tool_call>)|</tool_call>\n<tool_call>"
)
_AFTER_TEXT = re.compile(r"[^\s](?:<arg_key>|<arg_value>|</tool_call>)|</tool_call><tool_call>")


#: ``layout``: ``glm45`` when the tags mostly stand on lines of their own (``\n<arg_key>``),
#: ``glm47`` when they mostly follow the text before them (``get_time</tool_call>``).
#: ``encode(content, calls, version)``: in the GLM-4.5 (``glm45``) or 4.7 (``glm47``) layout.
FAMILY = Versions("GLM version", GRAMMARS, (_AFTER_NEWLINE, _AFTER_TEXT))
layout, encode = FAMILY.layout, FAMILY.encode

DIALECTS = FAMILY.entries(50, {"glm45": ("glm4_moe", "glm-4.5"), "glm47": ("glm-4.7",)})
