"""Types shared by all dialects: a call, the parse of an output, the events of a stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arguments": self.arguments}


@dataclass(frozen=True)
class ParseResult:
    """What a dialect found in one raw output.

    ``found`` is True when any markup of the dialect (whole or a fragment) is present.
    ``ok`` is True when that markup parsed; then ``calls`` holds the calls. When markup was
    found but did not parse, ``error`` says why and ``offset`` where (character index).
    ``noncanonical`` lists harmless deviations that were accepted. ``eos`` says whether
    the text ended with the model's end-of-turn token (it is not part of ``content``).
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    found: bool = False
    ok: bool = True
    error: str | None = None
    offset: int | None = None
    noncanonical: tuple[str, ...] = field(default=())
    eos: bool = False
    #: which markup produced the result: a registry name ("dsml-v4", "hermes", "qwen3-coder",
    #: "gpt-oss", ...), "json", or "" (none found)
    dialect: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "calls": [c.to_dict() for c in self.calls],
            "found": self.found,
            "ok": self.ok,
            "error": self.error,
            "offset": self.offset,
            "noncanonical": list(self.noncanonical),
            "eos": self.eos,
            "dialect": self.dialect,
        }


@dataclass(frozen=True)
class TextEvent:
    """A piece of visible content, emitted by a stream parser once it is certain."""

    text: str


@dataclass(frozen=True)
class CallEvent:
    """A complete call (the ``index``-th of the turn), emitted by a stream parser."""

    call: ToolCall
    index: int


Event = TextEvent | CallEvent
