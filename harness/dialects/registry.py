"""The dialect registry: one small interface, one module per dialect, "auto" detection.

A dialect is anything with a ``name``, ``first_marker(text) -> int`` (offset of its first
markup, exact or near-miss, or -1) and ``parse(text, *, server_content=False) ->
ParseResult``. ``register`` adds one; ``parse(text, "auto")`` picks the dialect whose
markup appears first, and refuses a turn that mixes the markup of two dialects.

Names: "dsml" (V3.2 or V4, whichever appears), "dsml-v32", "dsml-v4", "hermes", "json"
(near misses of a bare JSON tool call only: ``{...}{...}``, an unbalanced call object),
"none".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from harness.dialects import dsml, hermes, jsoncall
from harness.dialects.base import ParseResult
from harness.errors import UsageError


class Dialect(Protocol):
    @property
    def name(self) -> str: ...

    def first_marker(self, text: str) -> int: ...

    def parse(self, text: str, *, server_content: bool = False) -> ParseResult: ...


@dataclass(frozen=True)
class DsmlDialect:
    name: str
    version: str  # "auto" | "v4" | "v32"

    def first_marker(self, text: str) -> int:
        return dsml.first_marker(text)

    def parse(self, text: str, *, server_content: bool = False) -> ParseResult:
        return dsml.parse(text, self.version, server_content=server_content)


@dataclass(frozen=True)
class HermesDialect:
    name: str = "hermes"

    def first_marker(self, text: str) -> int:
        return hermes.first_marker(text)

    def parse(self, text: str, *, server_content: bool = False) -> ParseResult:
        return hermes.parse(text, server_content=server_content)


@dataclass(frozen=True)
class JsonCallDialect:
    """Bare JSON tool calls: only their near misses are markup (valid JSON is content)."""

    name: str = "json"

    def first_marker(self, text: str) -> int:
        return jsoncall.first_marker(text)

    def parse(self, text: str, *, server_content: bool = False) -> ParseResult:
        return jsoncall.parse(text, server_content=server_content)


@dataclass(frozen=True)
class NoDialect:
    """No tool-call markup expected: the whole text is content."""

    name: str = "none"

    def first_marker(self, text: str) -> int:
        return -1

    def parse(self, text: str, *, server_content: bool = False) -> ParseResult:
        return ParseResult(content=text)


_DIALECTS: dict[str, Dialect] = {}
#: Dialects tried by "auto", in order of preference on a tie.
_AUTO: list[str] = []
#: Dialects tried by "auto" only when no other one finds markup (bare JSON is what every
#: envelope holds, so it never makes a turn "mixed").
_FALLBACK: list[str] = []


def register(dialect: Dialect, *, auto: bool = False, fallback: bool = False) -> None:
    _DIALECTS[dialect.name] = dialect
    group = _FALLBACK if fallback else _AUTO
    if (auto or fallback) and dialect.name not in group:
        group.append(dialect.name)


register(DsmlDialect("dsml", "auto"), auto=True)
register(DsmlDialect("dsml-v4", "v4"))
register(DsmlDialect("dsml-v32", "v32"))
register(HermesDialect(), auto=True)
register(JsonCallDialect(), fallback=True)
register(NoDialect())


def names() -> list[str]:
    return ["auto", *_DIALECTS]


def get(name: str) -> Dialect:
    try:
        return _DIALECTS[name]
    except KeyError:
        raise UsageError(f"unknown dialect {name!r}: use one of {', '.join(names())}") from None


def detect(text: str) -> str:
    """The name of the auto dialect whose markup appears first in ``text``, or "none"."""
    marks = _marks(text)
    return marks[0][1] if marks else "none"


def _marks(text: str) -> list[tuple[int, str]]:
    """(offset of the first markup, name) of the auto dialects present, earliest first."""
    for group in (_AUTO, _FALLBACK):
        marks = sorted(
            (off, name) for name in group if (off := _DIALECTS[name].first_marker(text)) >= 0
        )
        if marks:
            return marks
    return []


def parse(text: str, dialect: str = "auto", *, server_content: bool = False) -> ParseResult:
    """Parse ``text`` with the named dialect ("auto": the one whose markup appears).

    With "auto", markup of two dialects in one turn is a near miss ("mixed dialects") at
    the first markup of the later one.
    """
    if dialect != "auto":
        return get(dialect).parse(text, server_content=server_content)
    marks = _marks(text)
    if not marks:
        return _DIALECTS["none"].parse(text, server_content=server_content)
    result = _DIALECTS[marks[0][1]].parse(text, server_content=server_content)
    if len(marks) > 1:
        (_, first), (off, second) = marks[0], marks[1]
        return replace(
            result,
            content=text,
            calls=(),
            found=True,
            ok=False,
            error=f"mixed dialects: {second} markup after {first} markup",
            offset=off,
        )
    return result
