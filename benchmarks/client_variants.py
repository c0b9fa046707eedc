"""Prototypes of ``harness.client.ChatClient`` measured side by side with the shipped one.

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

from harness.client import SIM_HEADER, ChatClient, Failure, TurnOutput, _error_text, _usage

_loads = orjson.loads


class SSEAccumulator:
    """Turns SSE lines into a ``TurnOutput``; ``line()`` returns True at ``[DONE]``/errors."""

    __slots__ = ("out", "t0", "content", "reasoning", "calls", "last", "gaps", "done")

    def __init__(self, out: TurnOutput, t0: float) -> None:
        self.out = out
        self.t0 = t0
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.last: float | None = None
        self.gaps = 0.0
        self.done = False

    def feed(self, lines: list[bytes], now: float) -> bool:
        out = self.out
        for line in lines:
            if not line.startswith(b"data:"):
                if line.startswith(b"event:") and b"error" in line:
                    out.failure = Failure("stream_error", "error event in the stream")
                    return True
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return True
            doc = _loads(payload)
            if "error" in doc:
                out.failure = Failure("stream_error", _error_text(orjson.dumps(doc["error"])))
                return True
            usage = doc.get("usage")
            if usage:
                _usage(out, usage)
            for choice in doc.get("choices") or ():
                delta = choice.get("delta")
                got = False
                if delta:
                    text = delta.get("content")
                    if text:
                        self.content.append(text)
                        got = True
                    text = delta.get("reasoning_content")
                    if text:
                        self.reasoning.append(text)
                        got = True
                    for tc in delta.get("tool_calls") or ():
                        slot = self.calls.get(tc.get("index", 0))
                        if slot is None:
                            slot = self.calls[tc.get("index", 0)] = {
                                "id": None,
                                "name": "",
                                "arguments": "",
                            }
                        if tc.get("id"):
                            slot["id"] = tc["id"]
                        fn = tc.get("function") or {}
                        if fn.get("name"):
                            slot["name"] += fn["name"]
                        if fn.get("arguments"):
                            slot["arguments"] += fn["arguments"]
                        got = True
                if got:
                    out.events += 1
                    if self.last is None:
                        out.ttft_s = now - self.t0
                    else:
                        self.gaps += now - self.last
                    self.last = now
                if choice.get("finish_reason"):
                    out.finish_reason = choice["finish_reason"]
        return False

    def finish(self) -> None:
        out = self.out
        out.latency_s = time.perf_counter() - self.t0
        out.content = "".join(self.content)
        out.reasoning = "".join(self.reasoning)
        out.tool_calls = [self.calls[i] for i in sorted(self.calls)]
        if out.events > 1 and self.last is not None:
            # the mean gap between content events; events that arrived in one read share
            # its time stamp (a gap of 0), so this is the mean over the events, as before
            out.itl_s = self.gaps / (out.events - 1)
        if not self.done and out.failure is None:
            out.failure = Failure("cut", "stream ended before [DONE]")


class LineSplitter:
    """Whole lines out of arbitrary byte chunks (a partial last line is kept)."""

    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: list[bytes] = []

    def lines(self, chunk: bytes) -> list[bytes]:
        cut = chunk.rfind(b"\n")
        if cut < 0:
            self.pending.append(chunk)
            return []
        head = chunk[:cut]
        if self.pending:
            head = b"".join(self.pending) + head
            self.pending.clear()
        if cut + 1 < len(chunk):
            self.pending.append(chunk[cut + 1 :])
        return head.split(b"\n")


class RawLinesChatClient(ChatClient):
    """httpx kept; the stream read raw and split here."""

    async def _stream(self, data: bytes, out: TurnOutput, t0: float) -> None:
        acc = SSEAccumulator(out, t0)
        split = LineSplitter()
        async with self._http.stream("POST", "/v1/chat/completions", content=data) as resp:
            out.status = resp.status_code
            out.sim_injected = resp.headers.get(SIM_HEADER)
            if resp.status_code >= 400:
                raw = await resp.aread()
                out.failure = Failure("http_status", _error_text(raw), resp.status_code)
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
