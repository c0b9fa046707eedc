"""Prototypes of ``harness.client.chat.ChatClient`` measured side by side with the shipped one.

``perf_client.py --client NAME`` drives the harness with one of these instead of the shipped
client. Each keeps the shipped interface and ``TurnOutput`` semantics:

- ``rawlines``: httpx kept; the stream read with ``aiter_raw()`` and split into lines here
  (no httpx byte/text/line decoders), times stamped once per received chunk;
- ``aiohttp``: the chat request on aiohttp directly, the stream read with ``iter_any()``.
  This prototype is now the shipped ``ChatClient``, so the name maps to it (kept so the
  tables in docs/performance.md can be rerun with the same command).
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from harness.client.chat import SIM_HEADER, ChatClient
from harness.client.output import Failure, TurnOutput
from harness.client.sse import ChatEvents, LineSplitter, error_text

_loads = orjson.loads


class RawLinesChatClient(ChatClient):
    """httpx kept; the stream read raw and split here."""

    async def _stream(self, data: bytes, out: TurnOutput, t0: float) -> None:
        acc = ChatEvents(out, t0)
        split = LineSplitter()
        async with self._http.stream("POST", "/v1/chat/completions", content=data) as resp:
            out.status = resp.status_code
            out.sim_injected = resp.headers.get(SIM_HEADER)
            if resp.status_code >= 400:
                raw = await resp.aread()
                out.failure = Failure("http_status", error_text(raw), resp.status_code)
                return
            async for chunk in resp.aiter_raw():
                if acc.feed(split.lines(chunk), time.perf_counter()):
                    break
        acc.finish()


VARIANTS: dict[str, Any] = {
    "shipped": ChatClient,
    "rawlines": RawLinesChatClient,
    "aiohttp": ChatClient,  # the prototype measured here became the shipped client
}
