"""DSML, the tool-call markup of DeepSeek V3.2 (``function_calls``) and V4 (``tool_calls``).

The grammar is in the project docs (docs/dsml.md): values are kept byte for byte,
``string="false"`` values are JSON, parameters keep their order and may not repeat.
Harmless deviations that servers accept (a self-closing zero-argument invoke, indented
tags, no blank line before the block, no end-of-turn token) parse and are listed in
``ParseResult.noncanonical``. Anything DSML-like that does not parse is an error with the
offset where parsing stopped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from harness.dialects.base import ParseResult, ToolCall

BAR = "\uff5c"  # FULLWIDTH VERTICAL LINE
MARK = f"{BAR}DSML{BAR}"
EOS = f"<{BAR}end\u2581of\u2581sentence{BAR}>"
BLOCKS = {"v4": "tool_calls", "v32": "function_calls"}

_WS = " \t"

#: Fragments that only DSML-like markup contains; any of them outside a parsed block is
#: a near miss (a mutated or broken envelope).
_FRAGMENT = re.compile(
    r"DSML|[\uff5c|\u2016]{1,2}\s*DSML|<[\uff5c|]?\s*/?\s*(?:tool_?calls|function_?calls|calls)\s*>"
    r"|<[^<>\n]{0,12}invoke\s+name\s*=|<[^<>\n]{0,12}parameter\s+name\s*=|</[^<>\n]{0,12}(?:invoke|parameter)>",
    re.IGNORECASE,
)


class DsmlError(ValueError):
    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset


# --------------------------------------------------------------------------- encoding


def encode_value(value: Any) -> tuple[str, str]:
    """(text, string-attribute) for one argument value, as DeepSeek's encoder writes it."""
    if isinstance(value, str):
        return value, "true"
    return json.dumps(value, ensure_ascii=False), "false"


def encode_block(calls: Iterable[ToolCall | Mapping[str, Any]], version: str = "v4") -> str:
    """The DSML block for ``calls`` (no leading blank line, no end-of-turn token)."""
    block = BLOCKS[version]
    invokes = []
    for call in calls:
        name, args = (
            (call.name, call.arguments)
            if isinstance(call, ToolCall)
            else (call["name"], call["arguments"])
        )
        params = []
        for key, value in args.items():
            text, is_str = encode_value(value)
            params.append(
                f'<{MARK}parameter name="{key}" string="{is_str}">{text}</{MARK}parameter>'
            )
        invokes.append(f'<{MARK}invoke name="{name}">\n' + "\n".join(params) + f"\n</{MARK}invoke>")
    return f"<{MARK}{block}>\n" + "\n".join(invokes) + f"\n</{MARK}{block}>"


def encode_turn(
    content: str,
    calls: Iterable[ToolCall | Mapping[str, Any]] = (),
    version: str = "v4",
    eos: bool = True,
) -> str:
    """A whole assistant turn: content, then ``\\n\\n`` and the block when there are calls."""
    calls = list(calls)
    text = content
    if calls:
        text += "\n\n" + encode_block(calls, version)
    return text + (EOS if eos else "")


# --------------------------------------------------------------------------- parsing


def find_fragment(text: str, start: int = 0) -> re.Match[str] | None:
    """The first DSML-like fragment in ``text`` at or after ``start``."""
    return _FRAGMENT.search(text, start)


def parse(text: str, version: str = "auto") -> ParseResult:
    """Parse one raw assistant output (content part; reasoning already split off)."""
    eos = False
    body = text
    if body.endswith(EOS):
        body = body[: -len(EOS)]
        eos = True
    opener_v4 = f"<{MARK}{BLOCKS['v4']}>"
    opener_v32 = f"<{MARK}{BLOCKS['v32']}>"
    i4, i32 = body.find(opener_v4), body.find(opener_v32)
    candidates = [(i, v) for i, v in ((i4, "v4"), (i32, "v32")) if i >= 0]
    if not candidates:
        frag = find_fragment(body)
        if frag is not None:
            return ParseResult(
                content=text,
                found=True,
                ok=False,
                error=f"DSML-like fragment {frag.group(0)!r} outside a well-formed block",
                offset=frag.start(),
                eos=eos,
            )
        return ParseResult(content=body, eos=eos)
    start, found_version = min(candidates)
    if version in BLOCKS and found_version != version:
        return ParseResult(
            content=text,
            found=True,
            ok=False,
            error=f"{BLOCKS[found_version]} block in a {version} turn",
            offset=start,
            eos=eos,
        )
    noncanonical: list[str] = []
    if not eos:
        noncanonical.append("no end-of-turn token")
    content = body[:start]
    if content.endswith("\n\n"):
        content = content[:-2]
    elif content.strip(" \t\n") == "":
        content = ""
        if body[:start] != "":
            noncanonical.append("no blank line before the block")
    else:
        noncanonical.append("no blank line before the block")
        content = content.rstrip("\n")
    frag = find_fragment(content)
    if frag is not None:
        return ParseResult(
            content=text,
            found=True,
            ok=False,
            error=f"DSML-like fragment {frag.group(0)!r} before the block",
            offset=frag.start(),
            eos=eos,
        )
    try:
        calls, end = _parse_block(body, start, BLOCKS[found_version], noncanonical)
    except DsmlError as exc:
        return ParseResult(
            content=text, found=True, ok=False, error=exc.reason, offset=exc.offset, eos=eos
        )
    rest = body[end:]
    if rest.strip() != "":
        off = end + (len(rest) - len(rest.lstrip()))
        return ParseResult(
            content=text,
            found=True,
            ok=False,
            error="text after the tool-call block",
            offset=off,
            eos=eos,
        )
    if rest:
        noncanonical.append("whitespace after the block")
    return ParseResult(
        content=content,
        calls=tuple(calls),
        found=True,
        ok=True,
        noncanonical=tuple(noncanonical),
        eos=eos,
    )


_INVOKE = re.compile(r'<\uff5cDSML\uff5cinvoke name="([^"\n<>]*)"(/?)>')
_PARAM = re.compile(r'<\uff5cDSML\uff5cparameter name="([^"\n<>]*)" string="(true|false)">')
_PARAM_CLOSE = f"</{MARK}parameter>"
_INVOKE_CLOSE = f"</{MARK}invoke>"


def _skip_indent(text: str, pos: int, noncanonical: list[str]) -> int:
    j = pos
    while j < len(text) and text[j] in _WS:
        j += 1
    if j != pos and "indented tags" not in noncanonical:
        noncanonical.append("indented tags")
    return j


def _expect_newline(text: str, pos: int, what: str) -> int:
    if text.startswith("\n", pos):
        return pos + 1
    raise DsmlError(f"expected a newline after {what}", pos)


def _parse_block(
    text: str, start: int, block: str, noncanonical: list[str]
) -> tuple[list[ToolCall], int]:
    opener = f"<{MARK}{block}>"
    closer = f"</{MARK}{block}>"
    pos = _expect_newline(text, start + len(opener), "the block opener")
    calls: list[ToolCall] = []
    while True:
        pos = _skip_indent(text, pos, noncanonical)
        if text.startswith(closer, pos):
            if not calls:
                raise DsmlError("tool-call block with no invoke", pos)
            return calls, pos + len(closer)
        m = _INVOKE.match(text, pos)
        if m is None:
            if pos >= len(text):
                raise DsmlError("truncated block: no closing tag", pos)
            raise DsmlError("expected an invoke or the block closer", pos)
        name = m.group(1)
        pos = m.end()
        if m.group(2) == "/":
            noncanonical.append("self-closing invoke")
            calls.append(ToolCall(name, {}))
            pos = _expect_newline(text, pos, "the invoke")
            continue
        pos = _expect_newline(text, pos, "the invoke opener")
        args: dict[str, Any] = {}
        pos = _skip_indent(text, pos, noncanonical)
        if text.startswith("\n", pos):  # zero arguments: an empty line
            pos = _skip_indent(text, pos + 1, noncanonical)
        else:
            while True:
                pm = _PARAM.match(text, pos)
                if pm is None:
                    if text.startswith(_INVOKE_CLOSE, pos) and not args:
                        noncanonical.append("no empty line in a zero-argument invoke")
                        break
                    if pos >= len(text):
                        raise DsmlError("truncated block inside an invoke", pos)
                    raise DsmlError("expected a parameter", pos)
                key, is_str = pm.group(1), pm.group(2)
                vstart = pm.end()
                vend = text.find(_PARAM_CLOSE, vstart)
                if vend < 0:
                    raise DsmlError("unclosed parameter", vstart)
                raw = text[vstart:vend]
                if key in args:
                    raise DsmlError(f"repeated parameter {key!r}", pm.start())
                if is_str == "true":
                    args[key] = raw
                else:
                    try:
                        args[key] = json.loads(raw)
                    except json.JSONDecodeError as exc:
                        raise DsmlError(
                            f"parameter {key!r} is not valid JSON: {exc.msg}", vstart + exc.pos
                        ) from None
                pos = _expect_newline(text, vend + len(_PARAM_CLOSE), "a parameter")
                pos = _skip_indent(text, pos, noncanonical)
                if text.startswith(_INVOKE_CLOSE, pos):
                    break
        if not text.startswith(_INVOKE_CLOSE, pos):
            if pos >= len(text):
                raise DsmlError("truncated block: invoke not closed", pos)
            raise DsmlError("expected the invoke closer", pos)
        calls.append(ToolCall(name, args))
        pos = _expect_newline(text, pos + len(_INVOKE_CLOSE), "the invoke closer")
