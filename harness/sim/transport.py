"""Transport faults: the server failing below the model, as real servers do under stress.

One draw per chat request (seeded by the conversation and its send count, like the corruption
faults), at most one fault per response, and a response with a transport fault carries no
corruption fault, so the ``x-sim-injected`` header (``transport:<kind>``) names the only fault:

* ``error``       -- HTTP 500 or 503 with an OpenAI error body, before any generation.
* ``disconnect``  -- headers and part of the response, then the connection is closed.
* ``stall``       -- headers and part of the response, then no byte for ``stall_seconds``
                     (the rest follows if the client is still there).
* ``error_event`` -- streamed requests only: ``data: {"error": ...}`` mid-stream, then
                     ``data: [DONE]`` (SGLang's shape).
* ``bad_json``    -- a body, or one SSE event mid-stream, that is not valid JSON.

``at`` (0..1) places the fault in the response: the fraction of output events (or bytes of a
non-streamed body) sent before it fires.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from harness.sim import openai

PREFIX = "transport:"
_STATUS = {500: "InternalServerError", 503: "ServiceUnavailableError"}


@dataclass(frozen=True)
class TransportFault:
    kind: str
    at: float  # 0..1: how much of the response goes out before the fault
    status: int = 500  # HTTP status of an ``error`` fault

    @property
    def label(self) -> str:
        return PREFIX + self.kind

    def index(self, parts: int) -> int:
        """The part (0..parts) before which the fault fires; ``parts`` the response's parts."""
        return min(parts, int(self.at * (parts + 1)))


def draw(
    rates: tuple[tuple[str, float], ...], rng: random.Random, stream: bool
) -> TransportFault | None:
    """This request's transport fault, or None. ``error_event`` needs a streamed request."""
    u, at = rng.random(), rng.random()
    acc = 0.0
    for kind, rate in rates:
        if kind == "error_event" and not stream:
            continue
        acc += rate
        if u < acc:
            return TransportFault(kind, at, 503 if rng.random() < 0.5 else 500)
    return None


def error_body(status: int) -> bytes:
    message = "server overloaded, retry later" if status == 503 else "internal server error"
    return orjson.dumps(openai.error(message, status, _STATUS.get(status, "InternalServerError")))


def error_event() -> bytes:
    body = openai.error("engine error while decoding this request", 500, "InternalServerError")
    return b"data: " + orjson.dumps(body) + b"\n\n"


def broken(event_or_body: bytes) -> bytes:
    """The same bytes cut in the middle of the JSON (an SSE event keeps its framing)."""
    if event_or_body.startswith(b"data: "):
        payload = event_or_body[6:].rstrip(b"\n")
        return b"data: " + payload[: max(1, len(payload) // 2)] + b"\n\n"
    return event_or_body[: max(1, len(event_or_body) // 2)]


class Stream(StreamingResponse):
    """A streamed body that frees its running slot however it ends, and can misbehave.

    With ``fault`` = ("disconnect" | "stall", i) the fault fires before body part ``i``: a
    disconnect returns without finishing the response (the server closes the connection), a
    stall waits ``stall_s`` first (cut short when the client goes away).
    """

    def __init__(
        self,
        body: AsyncIterator[bytes],
        headers: dict[str, str],
        done: Callable[[], None],
        *,
        media_type: str = "text/event-stream",
        fault: tuple[str, int] | None = None,
        stall_s: float = 0.0,
    ) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._done = done
        self._fault = fault
        self._stall_s = stall_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()

    async def stream_response(self, send: Send) -> None:
        if self._fault is None:
            await super().stream_response(send)
            return
        kind, before = self._fault
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        i = 0
        async for part in self.body_iterator:
            if i == before and not await self._misbehave(kind):
                return
            await send({"type": "http.response.body", "body": part, "more_body": True})
            i += 1
        if i <= before and not await self._misbehave(kind):
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _misbehave(self, kind: str) -> bool:
        """Fire the fault; False when the response must stop here."""
        if kind == "disconnect":
            return False  # left unfinished: the server closes the connection
        await asyncio.sleep(self._stall_s)  # cancelled if the client disconnects
        return True


async def pieces(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
