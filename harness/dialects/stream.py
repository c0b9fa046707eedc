"""Incremental parsing: feed text deltas, get text pieces and completed calls.

``MarkupStream`` drives any dialect from its one-shot parser (see its doc); DSML has its own
(``dsml.StreamParser``). Both have ``feed``, ``flush`` and ``finish`` (``Stream``);
``registry.get(name).stream()`` gives the right one. Their events (``TextEvent``,
``CallEvent``) are in ``base``.
"""

from __future__ import annotations

from typing import Protocol

from harness.dialects.base import CallEvent, Event, ParseResult, TextEvent, ToolCall
from harness.dialects.markup import Tools, open_fence


class Stream(Protocol):
    """An incremental parser: events as the text comes, then the one-shot parse."""

    def feed(self, delta: str) -> list[Event]: ...

    def flush(self) -> list[Event]: ...

    def finish(self) -> ParseResult: ...


class Streamable(Protocol):
    """What ``MarkupStream`` needs of a dialect."""

    def first_marker(self, text: str) -> int: ...

    def parse(
        self, text: str, *, server_content: bool = False, tools: Tools = None
    ) -> ParseResult: ...

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]: ...


_WS = " \t\n\r"

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


def run_stream(parser: Stream, deltas: list[str]) -> list[Event]:
    """Feed every delta, then flush: all events (a convenience for tests and tools)."""
    events: list[Event] = []
    for delta in deltas:
        events.extend(parser.feed(delta))
    events.extend(parser.flush())
    return events


__all__ = [
    "CallEvent",
    "Event",
    "MarkupStream",
    "Stream",
    "Streamable",
    "TextEvent",
    "run_stream",
]
