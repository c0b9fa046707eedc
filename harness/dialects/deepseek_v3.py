"""DeepSeek V3 / R1 and V3.1 tool calls, the markers before DSML (``deepseek_v3``,
``deepseek_v31`` in vLLM; ``deepseekv3``, ``deepseekv31`` in SGLang).

``｜`` is U+FF5C FULLWIDTH VERTICAL LINE, ``▁`` U+2581 LOWER ONE EIGHTH BLOCK. V3, V3-0324,
R1 and R1-0528 write a type, the name and a fenced JSON object, calls separated by a
newline::

    text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Tokyo"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>…<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>

V3.1 has no type, no fence and no newline:
``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Tokyo"}
<｜tool▁call▁end｜><｜tool▁calls▁end｜>`` (one line).

Arguments are a strict JSON object. Accepted but non-canonical: other whitespace around
the fence or between the markers, a fence without ``json``, no end-of-turn token. Near
misses: a mangled marker, a call outside the section, a type other than ``function``, a V3
call without its fence, a V3-style call in a V3.1 turn (vLLM reads it as a call named
``function``) or a V3.1-style one in a V3 turn, bad JSON, an unclosed call or section,
text after the section (vLLM keeps it, SGLang drops it).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from harness.dialects.base import ToolCall
from harness.dialects.declare import Versions
from harness.dialects.jsonstrict import StrictJSONError, loads_strict
from harness.dialects.markup import (
    NC_NEWLINES,
    BlockGrammar,
    Fail,
    Scanner,
    Tools,
    Writer,
    closes,
    expect_ws,
    need,
)

BAR, SP = "\uff5c", "\u2581"
CALLS_BEGIN = f"<{BAR}tool{SP}calls{SP}begin{BAR}>"
CALLS_END = f"<{BAR}tool{SP}calls{SP}end{BAR}>"
CALL_BEGIN = f"<{BAR}tool{SP}call{SP}begin{BAR}>"
CALL_END = f"<{BAR}tool{SP}call{SP}end{BAR}>"
SEP = f"<{BAR}tool{SP}sep{BAR}>"
EOS = f"<{BAR}end{SP}of{SP}sentence{BAR}>"
VERSIONS = {"v3": "deepseek-v3", "v31": "deepseek-v31"}

_OPENER = re.compile(re.escape(CALLS_BEGIN))
FRAGMENT = re.compile(
    rf"<?[{BAR}|][ \t]?tool[{SP}_ ]?(?:calls?[{SP}_ ]?)?(?:begin|end|sep)[ \t]?[{BAR}|]?>?"
    rf"|<[ \t]?tool{SP}[^<>\n]{{0,20}}?(?:begin|end|sep)[^<>\n]{{0,3}}>",
    re.IGNORECASE,
)
_FENCED = re.compile(
    r"([^\n`<>]+?)([ \t]*\n?)```(json)?([ \t]*\n?)(.*?)(\n?[ \t]*)```([ \t]*)", re.S
)
_CANON_FENCE = ("\n", "json", "\n", "\n", "")


def _need(body: str, pos: int, expected: str, calls: list[ToolCall]) -> Fail:
    return need(body, pos, expected, calls, "section")


def _json(raw: str, at: int, calls: list[ToolCall]) -> dict[str, object]:
    try:
        args = loads_strict(raw)
    except StrictJSONError as exc:
        reason = f"arguments are not valid JSON ({exc.kind}: {exc.message})"
        raise Fail(reason, at + exc.pos, calls) from None
    if not isinstance(args, dict):
        raise Fail("arguments are JSON but not an object", at, calls)
    return args


def _scanner(version: str) -> Scanner:
    def scan(body: str, start: int, nc: list[str], tools: Tools) -> tuple[list[ToolCall], int]:
        calls: list[ToolCall] = []
        p = expect_ws(body, start + len(CALLS_BEGIN), "", nc)
        while True:
            if (end := closes(body, p, CALLS_END, calls)) >= 0:
                return calls, end
            if not body.startswith(CALL_BEGIN, p):
                raise _need(body, p, f"{CALL_BEGIN} or {CALLS_END}", calls)
            p += len(CALL_BEGIN)
            end = body.find(CALL_END, p)
            sep = body.find(SEP, p, end if end >= 0 else len(body))
            stray = FRAGMENT.search(
                body, sep + len(SEP) if sep >= 0 else p, end if end >= 0 else len(body)
            )
            if stray is not None:
                raise Fail(f"call not closed before {stray.group(0)!r}", stray.start(), calls)
            if sep < 0:
                if end < 0:
                    raise Fail(f"truncated section: call without {SEP}", p, calls)
                raise Fail(f"call without {SEP}", p, calls)
            if end < 0:
                raise Fail("truncated section: call not closed", sep, calls)
            head, rest, at = body[p:sep], body[sep + len(SEP) : end], sep + len(SEP)
            if version == "v3":
                calls.append(_v3_call(head, rest, p, at, nc, calls))
            else:
                if head.strip() == "function" and "```" in rest:
                    raise Fail("V3-style call (type and fence) in a V3.1 turn", p, calls)
                name = head.strip()
                if not name or re.search(r"\s", name):
                    raise Fail(f"malformed function name {head!r}", p, calls)
                if head != name:
                    nc.append(NC_NEWLINES)
                calls.append(ToolCall(name, _json(rest, at, calls)))
            p = end + len(CALL_END)
            canonical = "\n" if version == "v3" else ""
            q = expect_ws(body, p, "", [])
            p = expect_ws(body, p, canonical if body.startswith(CALL_BEGIN, q) else "", nc)

    return scan


def _v3_call(
    head: str, rest: str, p: int, at: int, nc: list[str], calls: list[ToolCall]
) -> ToolCall:
    if head != "function":
        if head.strip() == "function":
            nc.append(NC_NEWLINES)
        elif "```" not in rest:
            raise Fail("V3.1-style call (no type, no fence) in a V3 turn", p, calls)
        else:
            raise Fail(f"call type {head!r} is not function", p, calls)
    m = _FENCED.fullmatch(rest)
    if m is None:
        raise Fail("arguments without their ```json fence", at, calls)
    name = m.group(1).strip()
    if (
        m.group(2),
        m.group(3),
        m.group(4),
        m.group(6),
        m.group(7),
    ) != _CANON_FENCE or name != m.group(1):
        nc.append(NC_NEWLINES)
    return ToolCall(name, _json(m.group(5), at + m.start(5), calls))


def _writer(version: str) -> Writer:
    def write(calls: Sequence[ToolCall]) -> str:
        parts = []
        for c in calls:
            args = json.dumps(c.arguments, ensure_ascii=False)
            if version == "v3":
                parts.append(f"{CALL_BEGIN}function{SEP}{c.name}\n```json\n{args}\n```{CALL_END}")
            else:
                parts.append(f"{CALL_BEGIN}{c.name}{SEP}{args}{CALL_END}")
        joined = ("\n" if version == "v3" else "").join(parts)
        return f"{CALLS_BEGIN}{joined}{CALLS_END}"

    return write


GRAMMARS = {
    v: BlockGrammar(name, _OPENER, FRAGMENT, _scanner(v), eos=(EOS,), separator="",
                    what="DeepSeek", write=_writer(v))
    for v, name in VERSIONS.items()
}  # fmt: skip


#: V3 writes a type and a fence around the arguments, V3.1 the JSON right after the separator
_V3_LAYOUT = re.compile(rf"function[ \t]*{re.escape(SEP)}|{re.escape(SEP)}[^\n<{{]*\n[ \t]*```")
_V31_LAYOUT = re.compile(rf"{re.escape(SEP)}[^\n<{{`]*{{")


#: ``layout``: ``deepseek-v3`` when the calls mostly carry a type and a fence,
#: ``deepseek-v31`` when their JSON mostly follows the name.
#: ``encode(content, calls, version)``: with the V3/R1 (``v3``) or V3.1 (``v31``) markers.
FAMILY = Versions("DeepSeek version", GRAMMARS, (_V3_LAYOUT, _V31_LAYOUT))
layout, encode = FAMILY.layout, FAMILY.encode

DIALECTS = FAMILY.entries(
    80, {"v3": ("deepseek_v3", "deepseekv3", "deepseek-r1"), "v31": ("deepseek_v31", "deepseekv31")}
)
