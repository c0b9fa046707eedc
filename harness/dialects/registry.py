"""The dialect registry: one small interface, one module per dialect, "auto" detection.

A dialect is anything with a ``name``, ``first_marker(text) -> int`` (offset of its first
markup, exact or near-miss, or -1) and ``parse(text, *, server_content=False) ->
ParseResult``. ``register`` adds one; ``parse(text, "auto")`` picks the dialect whose
markup appears first, and refuses a turn that mixes the markup of two dialects.

Names: "dsml" (V3.2 or V4, whichever appears), "dsml-v32", "dsml-v4", "hermes", "none".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from harness.dialects import dsml, hermes
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


def register(dialect: Dialect, *, auto: bool = False) -> None:
    _DIALECTS[dialect.name] = dialect
    if auto and dialect.name not in _AUTO:
        _AUTO.append(dialect.name)


register(DsmlDialect("dsml", "auto"), auto=True)
register(DsmlDialect("dsml-v4", "v4"))
register(DsmlDialect("dsml-v32", "v32"))
register(HermesDialect(), auto=True)
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
    best, best_off = "none", -1
    for name in _AUTO:
        off = _DIALECTS[name].first_marker(text)
        if off >= 0 and (best_off < 0 or off < best_off):
            best, best_off = name, off
    return best


def parse(text: str, dialect: str = "auto", *, server_content: bool = False) -> ParseResult:
    """Parse ``text`` with the named dialect ("auto": the one whose markup appears).

    With "auto", markup of two dialects in one turn is a near miss ("mixed dialects") at
    the first markup of the later one.
    """
    if dialect != "auto":
        return get(dialect).parse(text, server_content=server_content)
    marks = sorted(
        (off, name) for name in _AUTO if (off := _DIALECTS[name].first_marker(text)) >= 0
    )
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
