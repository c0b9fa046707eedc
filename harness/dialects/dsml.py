"""DSML, the tool-call markup of DeepSeek V3.2 (``function_calls``) and V4 (``tool_calls``).

The grammar is in the project docs (docs/dsml.md): values are kept byte for byte,
``string="false"`` values are strict JSON, parameters keep their order and may not repeat.
Harmless deviations that servers accept (a self-closing zero-argument invoke, indented
tags, no blank line before the block, a canonical newline missing between tags, no
end-of-turn token, a JSON object as the body of an invoke) parse and are listed in
``ParseResult.noncanonical``. DSML quoted in a fenced code block is content. Anything
DSML-like that does not parse (a near miss: a mutated marker or block name, a lost
opener, text after the block, a truncated block) is an error with the offset where
parsing stopped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.dsml_grammar import (
    BAR,
    BLOCKS,
    EOS,
    MARK,
    NC_NO_EOS,
    NC_TRAILING_WS,
    DsmlError,
    content_before,
    describe_fragment,
    find_fragment,
    find_opener,
    newline,
    parse_invoke,
    skip_indent,
    split_eos,
)
from harness.dialects.markup import mask_fences
from harness.errors import UsageError

__all__ = [
    "BAR",
    "BLOCKS",
    "EOS",
    "MARK",
    "DsmlError",
    "encode_block",
    "encode_turn",
    "encode_value",
    "find_fragment",
    "parse",
]

VERSIONS = ("auto", "v4", "v32")
#: Either version's block opener (where fenced code stops being searched).
OPENER = re.compile("|".join(re.escape(f"<{MARK}{block}>") for block in BLOCKS.values()))


# --------------------------------------------------------------------------- encoding


def encode_value(value: Any) -> tuple[str, str]:
    """(text, string-attribute) for one argument value, as DeepSeek's encoder writes it."""
    if isinstance(value, str):
        return value, "true"
    return json.dumps(value, ensure_ascii=False), "false"


def _name_args(call: ToolCall | Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    if isinstance(call, ToolCall):
        return call.name, call.arguments
    args = call["arguments"]
    if isinstance(args, str):
        args = json.loads(args)
    return str(call["name"]), args


def encode_block(calls: Iterable[ToolCall | Mapping[str, Any]], version: str = "v4") -> str:
    """The DSML block for ``calls`` (no leading blank line, no end-of-turn token).

    A call is a ToolCall or a mapping with ``name`` and ``arguments`` (an object, or a JSON
    string as in OpenAI's ``tool_calls``).
    """
    block = BLOCKS[version]
    invokes = []
    for call in calls:
        name, args = _name_args(call)
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


def _fail(text: str, eos: bool, reason: str, offset: int, dialect: str = "") -> ParseResult:
    return ParseResult(
        content=text, found=True, ok=False, error=reason, offset=offset, eos=eos, dialect=dialect
    )


def parse(text: str, version: str = "auto", *, server_content: bool = False) -> ParseResult:
    """Parse one assistant output (the content part; reasoning already split off).

    ``version``: "v4", "v32", or "auto" (whichever block appears). ``server_content``:
    the text is a server's ``message.content``, from which servers strip the end-of-turn
    token, so a missing one is not even non-canonical.
    """
    if version not in VERSIONS:
        raise UsageError(f"unknown DSML version {version!r}: use one of {', '.join(VERSIONS)}")
    body, eos = split_eos(text)
    masked = mask_fences(body, OPENER)  # markup quoted in a fenced code block is content
    start, found_version = find_opener(masked)
    if start < 0:
        frag = find_fragment(masked)
        if frag is not None:
            return _fail(
                text,
                eos,
                describe_fragment(masked, frag),
                frag.start(),
            )
        return ParseResult(content=body, eos=eos)
    dialect = f"dsml-{found_version}"
    if version != "auto" and found_version != version:
        return _fail(
            text, eos, f"{BLOCKS[found_version]} block in a {version} turn", start, dialect
        )
    noncanonical: list[str] = []
    content = content_before(body, start, noncanonical)
    frag = find_fragment(masked, 0, start)
    if frag is not None:
        return _fail(
            text,
            eos,
            describe_fragment(masked, frag) + " before the block",
            frag.start(),
            dialect,
        )
    try:
        calls, end = parse_block(body, start, found_version, noncanonical)
    except DsmlError as exc:
        return _fail(text, eos, exc.reason, exc.offset, dialect)
    rest = body[end:]
    if rest.strip() != "":
        off = end + (len(rest) - len(rest.lstrip()))
        frag = find_fragment(body, end)
        what = "a DSML-like fragment" if frag is not None else "text"
        return _fail(text, eos, f"{what} after the tool-call block", off, dialect)
    if rest:
        noncanonical.append(NC_TRAILING_WS)
    if not eos and not server_content:
        noncanonical.append(NC_NO_EOS)
    return ParseResult(
        content=content,
        calls=tuple(calls),
        found=True,
        ok=True,
        noncanonical=tuple(dict.fromkeys(noncanonical)),
        eos=eos,
        dialect=dialect,
    )


def parse_block(
    text: str, start: int, version: str, noncanonical: list[str]
) -> tuple[list[ToolCall], int]:
    """Parse the block whose opener is at ``start``: (calls, offset after the closer)."""
    block = BLOCKS[version]
    opener, closer = f"<{MARK}{block}>", f"</{MARK}{block}>"
    pos = newline(text, start + len(opener), noncanonical)
    calls: list[ToolCall] = []
    while True:
        pos = skip_indent(text, pos, noncanonical)
        if text.startswith(closer, pos):
            if not calls:
                raise DsmlError("tool-call block with no invoke", pos)
            return calls, pos + len(closer)
        call, pos = parse_invoke(text, pos, version, noncanonical)
        calls.append(call)


def first_marker(text: str) -> int:
    """Offset of the first DSML markup (block opener or near-miss fragment), or -1."""
    body, _ = split_eos(text)
    body = mask_fences(body, OPENER)
    start, _v = find_opener(body)
    frag = find_fragment(body)
    offs = [o for o in (start, frag.start() if frag else -1) if o >= 0]
    return min(offs) if offs else -1
