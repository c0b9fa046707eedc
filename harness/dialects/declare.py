"""What a dialect module declares to the registry, and the shapes of a dialect.

A module of this package that defines dialects lists them in its ``DIALECTS``: one ``Entry``
per name, saying whether "auto" tries it (``auto``; ``fallback``: only when no other
dialect finds markup), the servers' parser names that stand for it (``aliases``), where
"auto" sees its markup when that is less than where the dialect named finds it
(``auto_marker``), what tells its versions apart (``layout``), and its ``rank``: the order
of ``registry.names()`` and, for "auto", the preference between dialects whose markup
starts at the same offset (Hermes before Qwen3-Coder before GLM: one ``<tool_call>``). The
registry finds the modules by itself.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.markup import BlockGrammar, Tools, known_version
from harness.dialects.stream import MarkupStream, Stream
from harness.errors import UsageError


class Dialect(Protocol):
    @property
    def name(self) -> str: ...

    def first_marker(self, text: str) -> int: ...

    def parse(
        self, text: str, *, server_content: bool = False, tools: Tools = None
    ) -> ParseResult: ...

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str: ...

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream: ...


@dataclass(frozen=True)
class MarkupDialect:
    """A dialect made of a one-shot parser's functions (its stream is a ``MarkupStream``)."""

    name: str
    marker_fn: Callable[[str], int]
    parse_fn: Callable[..., ParseResult]
    encode_fn: Callable[[str, Sequence[ToolCall]], str]
    calls_fn: Callable[[str, Tools], tuple[ToolCall, ...]]
    holds: tuple[str, ...] = ()
    #: any piece of the markup, exact or mangled (``markup_spans`` masks them)
    tokens: re.Pattern[str] | None = None

    @classmethod
    def of(cls, grammar: BlockGrammar, *, holds: tuple[str, ...] = ()) -> MarkupDialect:
        """The dialect of a block grammar (named by it, its fragments the tokens)."""
        return cls(
            grammar.dialect,
            grammar.first_marker,
            grammar.parse,
            grammar.encode,
            grammar.complete_calls,
            holds,
            grammar.fragment,
        )

    def first_marker(self, text: str) -> int:
        return self.marker_fn(text)

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return self.parse_fn(text, server_content=server_content, tools=tools)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        return self.encode_fn(content, calls)

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return self.calls_fn(text, tools)

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content, tools=tools, holds=self.holds)


@dataclass(frozen=True)
class NoDialect:
    """No tool-call markup expected: the whole text is content."""

    name: str = "none"

    def first_marker(self, text: str) -> int:
        return -1

    def parse(self, text: str, *, server_content: bool = False, tools: Tools = None) -> ParseResult:
        return ParseResult(content=text)

    def encode(self, content: str, calls: Sequence[ToolCall]) -> str:
        if calls:
            raise UsageError("the none dialect cannot write tool calls")
        return content

    def complete_calls(self, text: str, tools: Tools = None) -> tuple[ToolCall, ...]:
        return ()

    def stream(self, *, server_content: bool = False, tools: Tools = None) -> Stream:
        return MarkupStream(self, server_content=server_content)


@dataclass(frozen=True)
class Entry:
    """One dialect as its module declares it to the registry (see the module doc)."""

    dialect: Dialect
    rank: int
    auto: bool = False
    fallback: bool = False
    aliases: tuple[str, ...] = ()
    auto_marker: Callable[[str], int] | None = None
    layout: Callable[[str], str | None] | None = None


@dataclass(frozen=True)
class Versions:
    """Two versions of one markup (DeepSeek V3 and V3.1, GLM-4.5 and 4.7, Mistral v3 and v11):
    their grammars, and the marks of each one's layout, which decide between them when both
    parse or both fail (``layout``, for "auto")."""

    what: str  #: how an unknown version is named ("GLM version")
    grammars: Mapping[str, BlockGrammar]  #: version -> its grammar, the default first
    marks: tuple[re.Pattern[str], re.Pattern[str]]  #: the marks of each version's layout

    def layout(self, text: str) -> str | None:
        """The dialect whose layout the markup in ``text`` has, whole or broken: the version
        whose marks outnumber the other's; None on a tie (none of either, or as many)."""
        ones, twos = (len(marks.findall(text)) for marks in self.marks)
        if ones == twos:
            return None
        first, second = (grammar.dialect for grammar in self.grammars.values())
        return first if ones > twos else second

    def encode(self, content: str, calls: Sequence[ToolCall], version: str | None = None) -> str:
        """The canonical raw turn of ``version`` (the first one when not given)."""
        version = next(iter(self.grammars)) if version is None else version
        grammar = self.grammars[known_version(version, self.grammars, self.what)]
        return grammar.encode(content, calls)

    def entries(
        self, rank: int, aliases: Mapping[str, tuple[str, ...]], *, holds: tuple[str, ...] = ()
    ) -> tuple[Entry, ...]:
        """The versions as dialects that "auto" tries, ranked from ``rank`` on."""
        return tuple(
            Entry(MarkupDialect.of(grammar, holds=holds), rank=rank + i, auto=True,
                  aliases=aliases.get(version, ()), layout=self.layout)
            for i, (version, grammar) in enumerate(self.grammars.items())
        )  # fmt: skip


DIALECTS = (Entry(NoDialect(), rank=1000),)
