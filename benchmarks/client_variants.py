"""Prototypes of ``harness.client.ChatClient`` measured side by side with the shipped one.

``perf_client.py --client NAME`` drives the harness with one of these instead of the shipped
client. Each keeps the shipped interface and ``TurnOutput`` semantics:

- ``rawlines``: httpx kept; the stream read with ``aiter_raw()`` and split into lines here
  (no httpx byte/text/line decoders), times stamped once per received chunk;
- ``aiohttp``: the chat request on aiohttp directly (httpx kept only for ``get``), the stream
  read with ``iter_any()`` (everything buffered at once, not one HTTP chunk per iteration),
  split into lines here; an aiohttp trace feeding ``observers`` (send lag, pool waits).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import httpx
import orjson
from httpx_aiohttp import AiohttpTransport

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


def failure_from(exc: BaseException) -> Failure:
    """aiohttp's own exceptions (no httpx mapping in between) to failure kinds."""
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return Failure("connect", str(exc) or type(exc).__name__)
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return Failure("timeout", f"no response within the deadline ({type(exc).__name__})")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return Failure("cut", str(exc) or type(exc).__name__)
    if isinstance(exc, aiohttp.ClientResponseError):
        return Failure("protocol", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return Failure("connect", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, orjson.JSONDecodeError | ValueError | KeyError | TypeError):
        return Failure("protocol", f"invalid response: {type(exc).__name__}: {exc}")
    return Failure("protocol", f"{type(exc).__name__}: {exc}")


class AiohttpChatClient(ChatClient):
    """The chat request on aiohttp directly; ``observers`` hear sends and pool waits."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        max_connections: int = 256,
        request_timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.observers: list[Any] = []
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=request_timeout,  # waiting for a pooled connection included
            sock_connect=min(10.0, request_timeout),
            sock_read=request_timeout,
        )
        self._session: aiohttp.ClientSession | None = None
        self._url = self.base_url + "/v1/chat/completions"
        self._http = httpx.AsyncClient(  # for get() only, over the same aiohttp session
            base_url=self.base_url,
            transport=AiohttpTransport(client=self._aio),
            headers=self._headers,
            timeout=httpx.Timeout(request_timeout, connect=min(10.0, request_timeout)),
        )

    def _aio(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(self._sent)
            trace.on_connection_queued_start.append(self._queued)
            trace.on_connection_queued_end.append(self._dequeued)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0),
                headers=self._headers,
                timeout=self._timeout,
                trace_configs=[trace],
                auto_decompress=False,
            )
        return self._session

    async def _sent(self, _s: Any, _ctx: Any, _p: Any) -> None:
        if self.observers:
            now = time.perf_counter()
            for obs in self.observers:
                obs.request_sent(now)

    async def _queued(self, _s: Any, ctx: Any, _p: Any) -> None:
        ctx.queued_at = time.perf_counter()

    async def _dequeued(self, _s: Any, ctx: Any, _p: Any) -> None:
        waited = time.perf_counter() - getattr(ctx, "queued_at", time.perf_counter())
        for obs in self.observers:
            obs.pool_waited(waited)

    async def aclose(self) -> None:
        await self._http.aclose()  # closes the shared aiohttp session too
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def chat(self, body: dict[str, Any], *, stream: bool) -> TurnOutput:
        payload = dict(body, model=body.get("model", self.model), stream=stream)
        if stream:
            payload["stream_options"] = {"include_usage": True}
        data = orjson.dumps(payload)
        out = TurnOutput()
        t0 = time.perf_counter()
        try:
            async with asyncio.timeout(self.request_timeout * 4):
                if stream:
                    await self._stream(data, out, t0)
                else:
                    await self._plain(data, out, t0)
        except asyncio.CancelledError:
            out.failure = Failure("cancelled", "the run was stopped")
            out.latency_s = time.perf_counter() - t0
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes data
            out.failure = failure_from(exc)
        if out.latency_s is None:
            out.latency_s = time.perf_counter() - t0
        return out

    async def _plain(self, data: bytes, out: TurnOutput, t0: float) -> None:
        async with self._aio().post(self._url, data=data) as resp:
            raw = await resp.read()
            out.latency_s = out.ttft_s = time.perf_counter() - t0
            out.status = resp.status
            out.sim_injected = resp.headers.get(SIM_HEADER)
        if out.status >= 400:
            out.failure = Failure("http_status", _error_text(raw), out.status)
            return
        doc = orjson.loads(raw)
        choice = doc["choices"][0]
        msg = choice.get("message") or {}
        out.content = msg.get("content") or ""
        out.reasoning = msg.get("reasoning_content") or ""
        out.tool_calls = [
            {
                "id": c.get("id"),
                "name": c["function"]["name"],
                "arguments": c["function"].get("arguments", ""),
            }
            for c in (msg.get("tool_calls") or [])
        ]
        out.finish_reason = choice.get("finish_reason")
        _usage(out, doc.get("usage"))

    async def _stream(self, data: bytes, out: TurnOutput, t0: float) -> None:
        acc = SSEAccumulator(out, t0)
        split = LineSplitter()
        async with self._aio().post(self._url, data=data) as resp:
            out.status = resp.status
            out.sim_injected = resp.headers.get(SIM_HEADER)
            if resp.status >= 400:
                raw = await resp.read()
                out.failure = Failure("http_status", _error_text(raw), resp.status)
                return
            async for chunk in resp.content.iter_any():
                if acc.feed(split.lines(chunk), time.perf_counter()):
                    break
        acc.finish()


VARIANTS: dict[str, Any] = {
    "shipped": ChatClient,
    "rawlines": RawLinesChatClient,
    "aiohttp": AiohttpChatClient,
}
