"""What one request gives back: a ``TurnOutput``, with a ``Failure`` when the endpoint failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Failure:
    """A transport-level failure: ``kind`` is one of connect, timeout, http_status,
    stream_error, protocol, cut, cancelled."""

    kind: str
    message: str
    status: int | None = None

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class TurnOutput:
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    itl_s: float | None = None
    status: int | None = None
    sim_injected: str | None = None
    events: int = 0
    failure: Failure | None = None
    source: str = "server"  # "raw": ``content`` is the model's raw text, calls not parsed
