"""What one request gives back: a ``TurnOutput``, with a ``Failure`` when the endpoint failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness.labels import CANCELLED, server_failure

__all__ = ["CANCELLED", "Failure", "TurnOutput", "server_failure"]


@dataclass(frozen=True)
class Failure:
    """A transport-level failure: ``kind`` is one of connect, timeout, http_status,
    stream_error, protocol, cut, too_large, dropped, cancelled."""

    kind: str
    message: str
    status: int | None = None
    retry_after_s: float | None = None  # the server's Retry-After (429, 503), in seconds

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class BadResponse(ValueError):
    """A response whose shape the API does not allow (a missing field, a number where a
    string goes): the server's fault, a ``protocol`` failure."""


class TooLarge(Exception):
    """A response past one of the client's limits (its size, one line's length): the read
    stops there, a ``too_large`` failure; what arrived is kept."""


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
    #: earlier sends of this request that the server dropped before any byte of an answer
    #: (a reused connection closed or reset under them; kind ``dropped``): each is a row
    dropped: list[Failure] = field(default_factory=list)
    #: SGLang's per-request ``meta_info`` (non-streamed, asked with ``return_meta_info``)
    meta_info: dict[str, Any] | None = None
    #: the generated tokens, where the server returns them (asked with ``return_token_ids``:
    #: vLLM's ``choices[0].token_ids``; llama.cpp's ``logprobs.content[].id``): their ids, or
    #: only their strings where the server gives no ids (``logprobs.content[].token``)
    token_ids: list[int] | None = None
    token_strs: list[str] | None = None
    source: str = "server"  # "raw": ``content`` is the model's raw text, calls not parsed
