"""Incremental parsing: feed text deltas, get text pieces and completed calls.

``StreamParser`` is DSML's; ``MarkupStream`` drives any other dialect from its one-shot
parser (see its doc). Both have ``feed``, ``flush`` and ``finish``;
``registry.get(name).stream()`` gives the right one.

``StreamParser(version).feed(delta)`` returns events as soon as they are certain:

- ``TextEvent(text)``: visible content. A possible marker prefix (a ``<``, a bar, ``DSML``
  within the last ``FRAGMENT_MAX`` characters), trailing whitespace (it may be the blank
  line before a block) and the end-of-turn token are held back until the parser can
  decide, so no piece of markup is ever emitted as text.
- ``CallEvent(call, index)``: one invoke, emitted when it is complete and parses.

``flush()`` ends the input and returns the last events; ``finish()`` ends it and returns
the ``ParseResult``, identical to ``dsml.parse`` of the whole text whatever the chunking.
The events depend only on the whole text too: the joined text events are the parsed
content (or, for a broken turn, the text before the first broken piece) and the call
events are the calls (or, for a broken block, the invokes that parsed before the break:
like a server's streaming parser, they cannot be taken back, so trust ``finish()``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from harness.dialects import dsml
from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.dsml_grammar import (
    BLOCKS,
    EOS,
    FRAGMENT_MAX,
    MARK,
    OPENERS,
    DsmlError,
    content_before,
    find_fragment,
    find_opener,
    parse_invoke,
    skip_indent,
    split_eos,
)
from harness.dialects.markup import Tools, mask_fences, open_fence


@dataclass(frozen=True)
class TextEvent:
    text: str


@dataclass(frozen=True)
class CallEvent:
    call: ToolCall
    index: int


Event = TextEvent | CallEvent

_TRIGGERS = frozenset("<|\uff5c\u2016\u2223\u2502\u00a6")
_WS = " \t\n\r"


def _opener_prefix(text: str, pos: int) -> bool:
    """True when ``text[pos:]`` is a proper prefix of a block opener."""
    tail = text[pos:]
    return any(op.startswith(tail) and op != tail for op in OPENERS.values())


class StreamParser:
    def __init__(self, version: str = "auto", *, server_content: bool = False) -> None:
        if version not in dsml.VERSIONS:
            dsml.parse("", version)  # raises the UsageError
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
            self._result = dsml.parse(self._text, self.version, server_content=self.server_content)
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
        scan = mask_fences(probe, dsml.OPENER)  # markup in fenced code is content
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


class Streamable(Protocol):
    """What ``MarkupStream`` needs of a dialect."""

    def first_marker(self, text: str) -> int: ...

    def parse(
        self, text: str, *, server_content: bool = False, tools: Tools = None
    ) -> ParseResult: ...

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]: ...


#: Characters a piece of markup (exact or mangled) may start with: from one of them in the
#: last ``MarkupStream.WINDOW`` characters on, text is held back.
TRIGGERS = frozenset("<[{|`~\uff5c")


class MarkupStream:
    """The stream parser of a dialect that has a one-shot parser.

    Text is emitted up to the dialect's first markup (``first_marker``), holding back a
    possible piece of markup (from a trigger character in the last ``WINDOW`` characters,
    or a proper prefix of one of ``holds``), trailing whitespace, and a last line that may
    be a code fence. A call is emitted once ``complete_calls`` reports it (its closing
    marker seen). ``flush`` emits the rest of the parsed content (the text before the
    first markup for a broken turn) and of the calls; ``finish`` is the one-shot parse.
    So the joined text events are the content and the call events the calls of the
    one-shot parse, for every chunking of the same text.
    """

    WINDOW = 96

    def __init__(
        self,
        dialect: Streamable,
        *,
        server_content: bool = False,
        tools: Tools = None,
        holds: tuple[str, ...] = (),
    ) -> None:
        self.dialect = dialect
        self.server_content = server_content
        self.tools = tools
        self.holds = holds
        self._text = ""
        self._out = ""  # the text emitted so far
        self._emitted = 0  # while streaming: text[:emitted] == out
        self._calls = 0
        self._closed = False
        self._result: ParseResult | None = None

    @property
    def text(self) -> str:
        return self._text

    def feed(self, delta: str) -> list[Event]:
        if self._closed:
            raise ValueError("feed() after the end of the stream")
        self._text += delta
        events: list[Event] = []
        text = self._text
        probe = text
        line = text.rfind("\n") + 1
        if text[line:].lstrip(" ")[:1] in ("`", "~"):  # maybe a fence closer, maybe an opener
            probe = text[:line]
        marker = self.dialect.first_marker(probe)
        limit = min(len(probe) if marker < 0 else marker, self._held(text))
        while limit > self._emitted and text[limit - 1] in _WS:
            limit -= 1
        self._emit(text[self._emitted : limit], events)
        self._emitted = max(self._emitted, limit)
        if marker >= 0 and not open_fence(text[:marker]):  # (a fence may make it content)
            self._emit_calls(self.dialect.complete_calls(text, self.tools), events)
        return events

    def flush(self) -> list[Event]:
        if self._closed:
            return []
        self._closed = True
        events: list[Event] = []
        result = self.finish()
        text = self._text
        if result.ok:
            if result.content.startswith(self._out):
                self._emit(result.content[len(self._out) :], events)
            self._emit_calls(result.calls, events)
        else:
            marker = self.dialect.first_marker(text)
            end = marker if marker >= 0 else result.offset if result.offset is not None else 0
            if end > self._emitted:
                self._emit(text[self._emitted : end], events)
            self._emit_calls(self.dialect.complete_calls(text, self.tools), events)
        return events

    def finish(self) -> ParseResult:
        if self._result is None:
            self._closed = True
            self._result = self.dialect.parse(
                self._text, server_content=self.server_content, tools=self.tools
            )
        return self._result

    def _held(self, text: str) -> int:
        n = len(text)
        for i in range(max(self._emitted, n - self.WINDOW), n):
            if text[i] in TRIGGERS:
                return i
            tail = text[i:]
            if any(h.startswith(tail) for h in self.holds):
                return i
        return n

    def _emit(self, piece: str, events: list[Event]) -> None:
        if piece:
            events.append(TextEvent(piece))
            self._out += piece

    def _emit_calls(self, calls: tuple[ToolCall, ...], events: list[Event]) -> None:
        for call in calls[self._calls :]:
            events.append(CallEvent(call, self._calls))
            self._calls += 1


def run_stream(parser: StreamParser | MarkupStream, deltas: list[str]) -> list[Event]:
    """Feed every delta, then flush: all events (a convenience for tests and tools)."""
    events: list[Event] = []
    for delta in deltas:
        events.extend(parser.feed(delta))
    events.extend(parser.flush())
    return events


__all__ = [
    "EOS",
    "CallEvent",
    "Event",
    "MarkupStream",
    "StreamParser",
    "Streamable",
    "TextEvent",
    "parse_stream",
    "run_stream",
]
