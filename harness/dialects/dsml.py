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

``StreamParser(version).feed(delta)`` returns events as soon as they are certain:

- ``TextEvent(text)``: visible content. A possible marker prefix (a ``<``, a bar, ``DSML``
  within the last ``FRAGMENT_MAX`` characters), trailing whitespace (it may be the blank
  line before a block) and the end-of-turn token are held back until the parser can
  decide, so no piece of markup is ever emitted as text.
- ``CallEvent(call, index)``: one invoke, emitted when it is complete and parses.

``flush()`` ends the input and returns the last events; ``finish()`` ends it and returns
the ``ParseResult``, identical to ``parse`` of the whole text whatever the chunking.
The events depend only on the whole text too: the joined text events are the parsed
content (or, for a broken turn, the text before the first broken piece) and the call
events are the calls (or, for a broken block, the invokes that parsed before the break:
like a server's streaming parser, they cannot be taken back, so trust ``finish()``).

The dialects: ``dsml-v4``, ``dsml-v32`` and ``dsml`` (either, whichever appears).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.dialects.base import CallEvent, Event, ParseResult, TextEvent, ToolCall
from harness.dialects.declare import Entry
from harness.dialects.dsml_grammar import (
    BAR,
    BLOCKS,
    EOS,
    FRAGMENT_MAX,
    MARK,
    NC_NO_EOS,
    NC_TRAILING_WS,
    OPENERS,
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
from harness.dialects.markup import Tools, failed, mask_fences, open_fence, parsed
from harness.dialects.stream import Stream
from harness.errors import UsageError

__all__ = [
    "BAR",
    "BLOCKS",
    "EOS",
    "MARK",
    "DsmlError",
    "StreamParser",
    "encode_block",
    "encode_turn",
    "encode_value",
    "find_fragment",
    "parse",
    "parse_stream",
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
    return failed(text, reason, offset, dialect, eos)


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
    return parsed(content, calls, noncanonical, eos, dialect)


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


# --------------------------------------------------------------------------- streaming


_TRIGGERS = frozenset("<|\uff5c\u2016\u2223\u2502\u00a6")
_WS = " \t\n\r"


def _opener_prefix(text: str, pos: int) -> bool:
    """True when ``text[pos:]`` is a proper prefix of a block opener."""
    tail = text[pos:]
    return any(op.startswith(tail) and op != tail for op in OPENERS.values())


class StreamParser:
    """DSML's own stream parser (see the module doc)."""

    def __init__(self, version: str = "auto", *, server_content: bool = False) -> None:
        if version not in VERSIONS:
            parse("", version)  # raises the UsageError
        self.version = version
        self.server_content = server_content
        self._text = ""
        self._emitted = 0  # text[:emitted] was sent as TextEvents
        self._state = "text"  # text -> block -> after | broken
        self._block_version = ""
        self._pos = 0  # in block state: where the next invoke (or the closer) starts
        self._calls = 0
        self._need_newline = False  # the newline right after the block opener
        self._closed = False
        self._result: ParseResult | None = None

    # ------------------------------------------------------------------ public API

    def feed(self, delta: str) -> list[Event]:
        if self._closed:
            raise ValueError("feed() after the end of the stream")
        self._text += delta
        return self._advance(final=False)

    def flush(self) -> list[Event]:
        """End of input: the remaining events (an empty list when already flushed)."""
        if self._closed:
            return []
        self._closed = True
        return self._advance(final=True)

    def finish(self) -> ParseResult:
        """End of input: the parse of the whole text (same as ``dsml.parse``)."""
        self.flush()
        if self._result is None:
            self._result = parse(self._text, self.version, server_content=self.server_content)
        return self._result

    @property
    def text(self) -> str:
        return self._text

    # ------------------------------------------------------------------ internals

    def _emit_to(self, end: int, events: list[Event]) -> None:
        if end > self._emitted:
            events.append(TextEvent(self._text[self._emitted : end]))
            self._emitted = end

    def _safe_end(self) -> int:
        """How far text can be emitted while more input may come."""
        text, n = self._text, len(self._text)
        end = n
        for i in range(max(self._emitted, n - FRAGMENT_MAX + 1), n):
            ch = text[i]
            if ch in _TRIGGERS or (ch == "D" and "DSML".startswith(text[i : i + 4])):
                end = i
                break
        while end > self._emitted and text[end - 1] in _WS:  # maybe the blank line
            end -= 1
        return end

    def _advance(self, final: bool) -> list[Event]:
        events: list[Event] = []
        if self._state == "text":
            self._text_step(final, events)
        if self._state == "block":
            self._block_step(events, final)
        return events

    def _text_step(self, final: bool, events: list[Event]) -> None:
        text = self._text
        probe = text
        if not final:  # a last line that may yet close a fence (or open one) is not read
            line = text.rfind("\n") + 1
            if text[line:].lstrip(" ")[:1] in ("`", "~"):
                probe = text[:line]
        scan = mask_fences(probe, OPENER)  # markup in fenced code is content
        start, version = find_opener(scan[self._emitted :])
        if start >= 0:
            start += self._emitted
        body_end = len(split_eos(text)[0]) if final else len(probe)
        frag = find_fragment(scan, self._emitted, start if start >= 0 else body_end)
        first = frag.start() if frag is not None else start
        if not final and first >= 0 and open_fence(text[:first]):
            self._emit_to(min(first, self._safe_end()), events)  # it may be quoted: wait
            return
        if frag is not None and not final and start < 0 and _opener_prefix(text, frag.start()):
            self._emit_to(min(frag.start(), self._safe_end()), events)
            return
        if frag is not None:
            self._emit_to(frag.start(), events)
            self._state = "broken"
            return
        if start >= 0:
            self._emit_to(len(content_before(text, start, [])), events)
            if self.version != "auto" and version != self.version:
                self._state = "broken"
                return
            self._state = "block"
            self._block_version = version
            self._pos = start + len(OPENERS[version])
            self._need_newline = True
            return
        self._emit_to(body_end if final else min(len(probe), self._safe_end()), events)

    def _block_step(self, events: list[Event], final: bool) -> None:
        text, version = self._text, self._block_version
        closer = f"</{MARK}{BLOCKS[version]}>"
        if self._need_newline:
            if len(text) <= self._pos:
                return
            if text[self._pos] == "\n":  # (without it: non-canonical, still a block)
                self._pos += 1
            self._need_newline = False
        while True:
            pos = skip_indent(text, self._pos, [])
            if text.startswith(closer, pos):
                self._state = "after"
                return
            try:
                call, end = parse_invoke(text, pos, version, [])
            except DsmlError:
                return  # incomplete (or broken: finish() says which)
            if end == len(text) and not text.endswith("\n") and not final:
                return  # its newline may still come
            events.append(CallEvent(call, self._calls))
            self._calls += 1
            self._pos = end


def parse_stream(deltas: list[str], version: str = "auto") -> tuple[list[Event], ParseResult]:
    """Feed every delta, then flush: (all events, final result). A convenience for tests."""
    parser = StreamParser(version)
    events: list[Event] = []
    for delta in deltas:
        events.extend(parser.feed(delta))
    events.extend(parser.flush())
    return events, parser.finish()


# --------------------------------------------------------------------------- the dialects


@dataclass(frozen=True)
class DsmlDialect:
    name: str
    version: str  # "auto" | "v4" | "v32"

    def first_marker(self, text: str) -> int:
        return first_marker(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return parse(text, self.version, server_content=server_content)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        return encode_turn(content, calls, "v32" if self.version == "v32" else "v4")

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return StreamParser(self.version, server_content=server_content)


DIALECTS = (
    Entry(DsmlDialect("dsml-v4", "v4"), rank=10, aliases=("deepseek_v4", "deepseekv4")),
    Entry(DsmlDialect("dsml-v32", "v32"), rank=11, aliases=("deepseek_v32", "deepseekv32")),
    Entry(DsmlDialect("dsml", "auto"), rank=12, auto=True),
)
