"""Types shared by all dialects."""

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
    ``noncanonical`` lists harmless deviations that were accepted.
    """

    content: str
    calls: tuple[ToolCall, ...] = ()
    found: bool = False
    ok: bool = True
    error: str | None = None
    offset: int | None = None
    noncanonical: tuple[str, ...] = field(default=())
    eos: bool = False
