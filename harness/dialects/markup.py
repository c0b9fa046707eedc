"""What the block-shaped dialects share: fences, end-of-turn tokens, near misses, results.

Most dialects write content, then one block (or a run of blocks) of tool-call markup, then
the end-of-turn token. ``BlockGrammar`` holds what differs between them (the exact opener,
the near-miss fragments, the scanner of the block) and does the rest the same way:

* markup inside a fenced code block (```` ``` ```` or ``~~~`` lines, closed) is content:
  a model quoting a tool call is not calling it (``mask_fences``);
* any fragment of the dialect's markup in the content before the first well-formed block
  (an orphan closer such as ``</parameter>``, a mangled opener) is a near miss;
* text after the calls is a near miss (the formats end the turn with the calls);
* harmless deviations (a missing canonical newline, no end-of-turn token) are accepted and
  listed in ``ParseResult.noncanonical``;
* the canonical turn is the content, the block (after ``separator`` when there is
  content) and the end-of-turn token (``BlockGrammar.encode``: the module writes the block).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.dialects.base import ParseResult, ToolCall
from harness.errors import UsageError

Tools = Sequence[Mapping[str, Any]] | None

NC_NO_EOS = "no end-of-turn token"
NC_NEWLINES = "canonical newlines missing or extra"
NC_TRAILING_WS = "whitespace after the calls"
NC_NO_SEPARATOR = "no newline between the content and the calls"

#: Stands in for fenced text in a masked copy: not whitespace, not part of any marker.
MASK = "\x00"
_FENCE = re.compile(r"^[ ]{0,3}(`{3,}|~{3,})[^\n]*$", re.MULTILINE)


class Fail(Exception):
    """A near miss found while scanning: why, where, and the calls complete before it."""

    def __init__(self, reason: str, offset: int, calls: Sequence[ToolCall] = ()) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset
        self.calls = tuple(calls)


def mask_fences(text: str, opener: re.Pattern[str] | None = None) -> str:
    """``text`` with every closed fenced code block blanked out (same length, newlines kept).

    Scanning stops at the first ``opener`` outside a fence: from there on the text is the
    tool-call markup (DeepSeek V3 writes a ```` ```json ```` fence inside its calls).
    """
    if "```" not in text and "~~~" not in text:
        return text
    out: list[str] = []
    pos = 0
    while True:
        fence = _FENCE.search(text, pos)
        if fence is None:
            break
        if opener is not None:
            op = opener.search(text, pos, fence.start())
            if op is not None:
                break
        mark = fence.group(1)
        close = re.compile(rf"^[ ]{{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*$", re.M)
        end = close.search(text, fence.end() + 1) if fence.end() < len(text) else None
        if end is None:
            break
        out.append(text[pos : fence.start()])
        out.append(re.sub(r"[^\n]", MASK, text[fence.start() : end.end()]))
        pos = end.end()
    out.append(text[pos:])
    return "".join(out)


def open_fence(text: str) -> bool:
    """True when ``text`` ends inside a fenced code block (an opener with no closer yet)."""
    return _FENCE.search(mask_fences(text)) is not None


def split_eos(text: str, tokens: Sequence[str]) -> tuple[str, bool]:
    for token in tokens:
        if token and text.endswith(token):
            return text[: -len(token)], True
    return text, False


def failed(text: str, reason: str, offset: int, dialect: str, eos: bool = False) -> ParseResult:
    return ParseResult(
        content=text, found=True, ok=False, error=reason, offset=offset, eos=eos, dialect=dialect
    )


def parsed(
    content: str, calls: Sequence[ToolCall], nc: Sequence[str], eos: bool, dialect: str
) -> ParseResult:
    """The result of markup that parsed (the deviations ``nc`` listed once each)."""
    return ParseResult(
        content=content,
        calls=tuple(calls),
        found=True,
        ok=True,
        noncanonical=tuple(dict.fromkeys(nc)),
        eos=eos,
        dialect=dialect,
    )


def known_version(version: str, versions: Mapping[str, object], what: str) -> str:
    """``version`` when it is one of ``versions``; a UsageError naming them otherwise."""
    if version not in versions:
        raise UsageError(f"unknown {what} {version!r}: use one of {', '.join(versions)}")
    return version


def turn(content: str, block: str, eos: str, separator: str = "\n") -> str:
    """A canonical raw turn: the content, ``separator`` when there are both content and a
    block of calls, the block, the end-of-turn token."""
    return content + (separator if content and block else "") + block + eos


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def expect_ws(text: str, pos: int, canonical: str, nc: list[str]) -> int:
    """Skip whitespace at ``pos``; anything but exactly ``canonical`` is non-canonical."""
    end = skip_ws(text, pos)
    if text[pos:end] != canonical:
        nc.append(NC_NEWLINES)
    return end


def next_block(body: str, end: int, opener: str, separator: str, nc: list[str]) -> int:
    """Where the next block starts after whitespace from ``end`` (-1: no ``opener`` follows);
    whitespace other than ``separator`` before it is non-canonical."""
    nxt = skip_ws(body, end)
    if not body.startswith(opener, nxt):
        return -1
    if body[end:nxt] != separator:
        nc.append(NC_NEWLINES)
    return nxt


def first_of(pattern: re.Pattern[str], text: str, start: int = 0, end: int | None = None) -> int:
    m = pattern.search(text, start, len(text) if end is None else end)
    return m.start() if m else -1


def snippet(text: str, pos: int, size: int = 30) -> str:
    return repr(text[pos : pos + size].split("\n", 1)[0])


def closes(
    body: str, pos: int, closer: str, calls: Sequence[ToolCall], empty: str = "section with no call"
) -> int:
    """Where the markup ends when ``closer`` stands at ``pos`` (-1 when it does not); a
    closer before any call is a near miss (a tool-call ``empty``)."""
    if not body.startswith(closer, pos):
        return -1
    if not calls:
        raise Fail(f"tool-call {empty}", pos, calls)
    return pos + len(closer)


def need(
    body: str, pos: int, expected: str, calls: Sequence[ToolCall], unit: str = "block"
) -> Fail:
    """The failure of a scanner that wanted ``expected`` at ``pos`` (a truncated ``unit``
    when nothing but whitespace follows)."""
    if not body[pos:].strip():
        return Fail(f"truncated {unit}: expected {expected}", pos, calls)
    return Fail(f"expected {expected}, found {snippet(body, pos)}", pos, calls)


def value_end(
    body: str, start: int, closer: str, inner: re.Pattern[str], what: str, calls: Sequence[ToolCall]
) -> int:
    """Where ``closer`` ends the value that starts at ``start``, with none of the grammar's
    other tags (``inner``) before it; a Fail naming ``what`` (an unclosed or cut-off value)
    otherwise."""
    end = body.find(closer, start)
    tag = inner.search(body, start, end if end >= 0 else len(body))
    if tag is not None:
        raise Fail(f"{what} not closed before {tag.group(0).strip()!r}", tag.start(), calls)
    if end < 0:
        raise Fail(f"truncated block: {what} not closed", start, calls)
    return end


def tag_blocks(
    calls: Sequence[ToolCall],
    block: Callable[[ToolCall, str], str],
    param: Callable[[str, Any], str],
    separator: str,
) -> str:
    """The calls written one ``block(call, params)`` each, ``separator`` between them, its
    ``params`` the ``param(key, value)`` of each argument in order."""
    return separator.join(
        block(c, "".join(param(k, v) for k, v in c.arguments.items())) for c in calls
    )


#: scan(body, start, noncanonical, tools) -> (calls, offset after the markup); raises Fail
Scanner = Callable[[str, int, list[str], Tools], tuple[list[ToolCall], int]]
#: write(calls) -> the canonical block of markup for the calls (one call at least)
Writer = Callable[[Sequence[ToolCall]], str]


@dataclass(frozen=True)
class BlockGrammar:
    """A dialect written as: content, a tool-call block, the end-of-turn token."""

    dialect: str
    opener: re.Pattern[str]  #: the exact opener of the markup
    fragment: re.Pattern[str]  #: any piece of the markup, exact or mangled
    scan: Scanner
    eos: tuple[str, ...] = ()
    separator: str = "\n"  #: what the canonical text puts between content and block
    what: str = "tool-call"  #: how errors name the markup
    write: Writer | None = None  #: the canonical block (None: the dialect is read only)
    answer_eos: str | None = None  #: what ends a turn without calls (None: ``eos[0]``)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        """The canonical raw turn (end-of-turn token included)."""
        if self.write is None:
            raise UsageError(f"the {self.dialect} dialect has no encoding")
        if not calls:
            return content + (self.eos[0] if self.answer_eos is None else self.answer_eos)
        return turn(content, self.write(calls), self.eos[0], self.separator)

    def first_marker(self, text: str) -> int:
        body, _ = split_eos(text, self.eos)
        masked = mask_fences(body, self.opener)
        offs = [
            o for o in (first_of(self.opener, masked), first_of(self.fragment, masked)) if o >= 0
        ]
        return min(offs) if offs else -1

    def analyse(
        self, text: str, *, server_content: bool = False, tools: Tools = None
    ) -> tuple[ParseResult, tuple[ToolCall, ...]]:
        """(the parse, the calls complete before the first error: all of them when ok)."""
        body, eos = split_eos(text, self.eos)
        masked = mask_fences(body, self.opener)
        opener = self.opener.search(masked)
        start = opener.start() if opener else -1
        frag = self.fragment.search(masked, 0, start if start >= 0 else len(masked))
        if frag is not None:
            reason = f"{self.what} tag {frag.group(0)!r} outside a well-formed block"
            return failed(text, reason, frag.start(), self.dialect, eos), ()
        if start < 0:
            return ParseResult(content=body, eos=eos), ()
        nc: list[str] = []
        pre = body[:start]
        content = pre.rstrip()
        if content and self.separator and not pre.endswith(self.separator):
            nc.append(NC_NO_SEPARATOR)
        try:
            calls, end = self.scan(body, start, nc, tools)
        except Fail as exc:
            return failed(text, exc.reason, exc.offset, self.dialect, eos), exc.calls
        rest = body[end:]
        if rest.strip():
            off = skip_ws(body, end)
            frag = self.fragment.match(body, off)
            what = "a stray tag" if frag is not None else "text"
            return failed(text, f"{what} after the tool calls", off, self.dialect, eos), tuple(
                calls
            )
        if rest:
            nc.append(NC_TRAILING_WS)
        if not eos and not server_content:
            nc.append(NC_NO_EOS)
        return parsed(content, calls, nc, eos, self.dialect), tuple(calls)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return self.analyse(text, server_content=server_content, tools=tools)[0]

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return self.analyse(text, server_content=True, tools=tools)[1]
