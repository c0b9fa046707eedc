"""The only HTTP client: one OpenAI chat request, streamed or not -> ``TurnOutput``.

Chat and raw requests go straight to one aiohttp session (httpx's own pool serves a few hundred
requests per second at high concurrency; httpx over the aiohttp transport costs 0.6 ms more
CPU per streamed turn than aiohttp alone, and leaves every request in reference cycles that
only the garbage collector frees, request body included: see docs/performance.md). ``get``
keeps httpx's API over the same aiohttp session. Every failure of the endpoint becomes a
``Failure`` value on the output, what arrived before it kept; only an exception that is no
failure of the server's (a bug of the harness) raises out of ``chat``, for the session to
record as ``harness_error``. Every read is bounded (``client.limits``); the client asks for
no compression and decompresses, within the same bound, a body compressed anyway. Times come
from ``time.perf_counter()`` taken once per read from the socket, before parsing
(``client.sse``):
events that arrived in one read share its time.

``observers``: objects with ``request_sent(now)``, ``pool_waited(seconds)`` and
``resent_stale()``, called when a request's headers leave, when one waited for a pooled
connection, and when a request was sent again because its pooled connection was dead (the run's
self-report).

A request written into a kept-alive connection that the server had already closed (llama.cpp
closes the connection after a streamed response without saying so) fails before any byte of a
response: the server never saw it. Such a request is sent once more on a new connection, as
RFC 9112 section 9.3.1 allows for a request known not to have been applied; only a failure
before the response headers on a *reused* connection qualifies, so a server that breaks a
fresh connection, or cuts a response it started, is still recorded as a transport failure.
When the new connection is refused (the server died, perhaps of that very request), the first
send's failure is the one recorded. Either way the first send is not hidden: the server may
have read it before it closed the connection, so it is noted in ``TurnOutput.dropped`` (kind
``dropped``) and the session records it as a row of its own, the re-send as the next attempt.

Deadlines: ``request_timeout`` is the longest wait for the next byte (connecting, the response
headers, every read of the body or stream: the socket read timeout), so a slow stream that
keeps sending lives while a stalled one fails as ``timeout``; ``total_timeout`` caps the whole
request however it trickles.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import aiohttp
import httpx
import msgspec
import orjson
from httpx_aiohttp import AiohttpTransport

from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.client.door import auth_headers, verify_context
from harness.client.output import BadResponse, Failure, TooLarge, TurnOutput
from harness.client.response_limits import Limits
from harness.client.sse import (
    ChatEvents,
    LineSplitter,
    error_text,
    note_tokens,
    note_usage,
    raw_piece,
)
from harness.record.payload import HistoryEncoder
from harness.record.transcripts import chat_payload

log = logging.getLogger(__name__)

SIM_HEADER = "x-sim-injected"


def _failure_from(exc: BaseException, read_s: float | None = None) -> Failure | None:
    """Map library exceptions to failure kinds (the one place that knows them); None for
    an exception that says nothing about the server (a bug of the harness's own: the caller
    lets it go on, to be recorded as ``harness_error``).

    The aiohttp transport maps some aiohttp errors to the wrong httpx class (a refused
    connection, and a connection reset by the server, arrive as ``ConnectTimeout``), so the
    aiohttp cause is looked at first. Chat requests raise aiohttp's errors themselves.
    """
    if isinstance(exc, TooLarge):
        return Failure("too_large", str(exc))
    if isinstance(exc, BadResponse | orjson.JSONDecodeError | msgspec.DecodeError):
        return Failure("protocol", f"invalid response: {exc}")
    if isinstance(exc, UnicodeDecodeError):
        return Failure("protocol", f"invalid response: not UTF-8: {exc}")
    cause = exc if isinstance(exc, aiohttp.ClientError) else exc.__cause__ or exc.__context__
    if isinstance(cause, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return Failure("connect", str(cause) or type(cause).__name__)
    if isinstance(cause, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return Failure("cut", str(cause) or type(cause).__name__)
    if isinstance(exc, httpx.ReadTimeout) or isinstance(cause, aiohttp.SocketTimeoutError):
        wait = f" for {read_s:g}s" if read_s is not None else ""
        return Failure("timeout", f"no byte from the server{wait} (--request-timeout)")
    if isinstance(cause, TimeoutError):  # aiohttp's other timeouts (connect) are TimeoutErrors
        return Failure("timeout", f"{type(cause).__name__}: {cause}")
    if isinstance(cause, aiohttp.ClientConnectionError | ConnectionResetError | BrokenPipeError):
        # reset by peer, or closed while the request was written: a connection that broke
        return Failure("cut", f"{type(cause).__name__}: {cause}")
    if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError | TimeoutError):
        return Failure("timeout", f"no response within the deadline ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError | ConnectionRefusedError):
        return Failure("connect", str(exc) or type(exc).__name__)
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError | httpx.WriteError):
        return Failure("cut", str(exc) or type(exc).__name__)
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return Failure("cut", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, aiohttp.ClientResponseError):  # not HTTP, a bad status line, ...
        return Failure("protocol", f"{type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.DecodingError):
        return Failure("protocol", f"invalid response: {type(exc).__name__}: {exc}")
    if isinstance(exc, httpx.HTTPError | aiohttp.ClientError | OSError):
        return Failure("connect", f"{type(exc).__name__}: {exc}")
    return None


class ChatClient:
    """One pooled client for one endpoint, sized for the run's concurrency."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        max_connections: int = 256,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        total_timeout: float | None = None,
        limits: Limits | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.limits = limits or Limits()
        self.request_timeout = request_timeout  # the longest wait for the next byte
        cap = total_timeout or self.limits.total_timeout_s
        self.total_timeout = cap or max(4 * request_timeout, 600.0)
        self.max_connections = max_connections
        self.key_sent = bool(api_key)  # what a 401 means (client.door.key_advice)
        self.observers: list[Any] = []
        self._url = self.base_url + "/v1/chat/completions"
        # no compression: a compressed answer is one more thing to bound (``_Body``)
        self._headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            **auth_headers(api_key),
        }
        self._timeout = aiohttp.ClientTimeout(
            total=None,
            connect=request_timeout,  # a free pooled connection, then connecting
            sock_connect=min(10.0, request_timeout),
            sock_read=request_timeout,
        )
        self._session: aiohttp.ClientSession | None = None
        self._http = httpx.AsyncClient(  # get() only, over the same aiohttp session
            base_url=self.base_url,
            transport=AiohttpTransport(client=self._aio, verify=verify_context()),
            headers=self._headers,
            timeout=httpx.Timeout(request_timeout, connect=min(10.0, request_timeout)),
        )

    @property
    def request_url(self) -> str:
        """Where chat requests go."""
        return self._url

    def _aio(self) -> aiohttp.ClientSession:
        """The pooled session, made on first use (it needs the running loop)."""
        if self._session is None or self._session.closed:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(self._on_sent)
            trace.on_connection_queued_start.append(self._on_queued)
            trace.on_connection_queued_end.append(self._on_dequeued)
            trace.on_connection_reuseconn.append(self._on_reused)
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0),
                headers=self._headers,
                timeout=self._timeout,
                trace_configs=[trace],
                auto_decompress=False,
                trust_env=False,
            )
        return self._session

    async def _on_sent(self, _session: Any, _ctx: Any, _params: Any) -> None:
        if self.observers:
            now = time.perf_counter()
            for observer in self.observers:
                observer.request_sent(now)

    async def _on_queued(self, _session: Any, ctx: Any, _params: Any) -> None:
        ctx.queued_at = time.perf_counter()

    async def _on_dequeued(self, _session: Any, ctx: Any, _params: Any) -> None:
        waited = time.perf_counter() - getattr(ctx, "queued_at", time.perf_counter())
        for observer in self.observers:
            observer.pool_waited(waited)

    async def _on_reused(self, _session: Any, ctx: Any, _params: Any) -> None:
        if isinstance(ctx.trace_request_ctx, _Attempt):
            ctx.trace_request_ctx.reused = True

    async def _post(
        self, data: bytes, out: TurnOutput, url: str | None = None
    ) -> aiohttp.ClientResponse:
        """POST a request; once more if a reused connection proved dead before any reply
        (that first send is noted in ``out.dropped``: the server may have seen it)."""
        url = url or self._url
        attempt = _Attempt()
        try:
            return await self._aio().post(url, data=data, trace_request_ctx=attempt)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if not attempt.reused:
                raise
            first = exc
        log.debug("pooled connection was closed by the server; sending the request again")
        for observer in self.observers:
            observer.resent_stale()
        try:
            resp = await self._aio().post(url, data=data)
        except aiohttp.ClientConnectorError:
            # nobody listens any more: the server died, maybe of this very request, and
            # what happened to the first send is the failure to record
            raise first from None
        why = str(first) or type(first).__name__
        out.dropped.append(
            Failure(
                "dropped",
                f"{why}: the server closed a reused connection before any byte of the answer; "
                "the request was sent again",
            )
        )
        return resp

    async def aclose(self) -> None:
        await self._http.aclose()  # closes the shared aiohttp session when get() made it
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def get(self, path: str, wait_s: float = 10.0) -> httpx.Response | Failure:
        try:
            return await self._http.get(path, timeout=wait_s)
        except Exception as exc:
            failure = _failure_from(exc)
            if failure is None:
                raise
            return failure

    async def chat(
        self, body: dict[str, Any], *, stream: bool, history: HistoryEncoder | None = None
    ) -> TurnOutput:
        """One chat request; ``history``: the session's encoded messages (``record.payload``)."""
        data = chat_payload(body, self.model, stream, history)
        out = TurnOutput()
        t0 = time.perf_counter()
        if stream:
            return await _own_task(self._guarded(partial(self._stream, data, out, t0), out, t0))
        return await self._guarded(partial(self._plain, data, out, t0), out, t0)

    async def raw(self, path: str, payload: dict[str, Any], *, stream: bool) -> TurnOutput:
        """One raw-text request: ``/v1/completions`` or SGLang's ``/generate``.

        The model's text lands in ``content`` unparsed (``source="raw"``); SGLang's streamed
        ``/generate`` events carry the text so far, OpenAI's ``/v1/completions`` events a delta.
        """
        payload = dict(payload, stream=stream)
        if path.endswith("/completions"):
            payload.setdefault("model", self.model)
            if stream:
                payload["stream_options"] = {"include_usage": True}
        out = TurnOutput(source="raw")
        t0 = time.perf_counter()
        read = partial(self._raw, path, orjson.dumps(payload), out, t0, stream)
        work = self._guarded(read, out, t0)
        return await (_own_task(work) if stream else work)

    async def _guarded(
        self, work: Callable[[], Awaitable[None]], out: TurnOutput, t0: float
    ) -> TurnOutput:
        """Run one request's work; every failure of the server's becomes ``out.failure``,
        with what arrived before it kept on ``out``; any other exception is the harness's
        and goes on. (The work is made here: a task cancelled before it started leaves no
        coroutine never awaited.)"""
        cap = asyncio.timeout(self.total_timeout)
        try:
            async with cap:
                await work()
        except asyncio.CancelledError:
            out.failure = Failure("cancelled", "the run was stopped")
            out.latency_s = time.perf_counter() - t0
            raise
        except Exception as exc:
            if cap.expired():
                cap_s = self.total_timeout
                out.failure = Failure(
                    "timeout", f"the request took longer than {cap_s:g}s (--total-timeout)"
                )
            else:
                failure = _failure_from(exc, self.request_timeout)
                if failure is None:
                    raise  # not the server's doing: the turn records it as a harness error
                out.failure = failure
        if out.latency_s is None:
            out.latency_s = time.perf_counter() - t0
        return out

    async def _plain(self, data: bytes, out: TurnOutput, t0: float) -> None:
        async with await self._post(data, out) as resp:
            if not await _opened(resp, out):
                return
            raw = await self._read_all(resp)
        out.latency_s = out.ttft_s = time.perf_counter() - t0
        doc = orjson.loads(raw)
        if isinstance(doc, dict) and "error" in doc:
            out.failure = Failure("protocol", "an error body with status 200: " + error_text(raw))
            return
        try:
            choice = doc["choices"][0]
            msg = choice.get("message") or {}
            out.content = _text(msg.get("content"))
            out.reasoning = _text(
                msg.get("reasoning_content") or msg.get("reasoning")
            )  # vLLM's name
            out.tool_calls = [
                {
                    "id": c.get("id"),
                    "name": _text(c["function"]["name"]),
                    "arguments": c["function"].get("arguments", ""),
                }
                for c in (msg.get("tool_calls") or [])
            ]
            out.finish_reason = choice.get("finish_reason")
            meta = choice.get("meta_info")
            out.meta_info = meta if isinstance(meta, dict) else None
            note_tokens(out, choice)
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise BadResponse(f"not a chat completion ({type(exc).__name__}: {exc})") from None
        note_usage(out, doc.get("usage"))

    async def _read_all(self, resp: aiohttp.ClientResponse) -> bytes:
        """A whole body, at most ``max_answer_bytes`` (decompressed)."""
        body = _Body(resp, self.limits.max_answer_bytes)
        parts = []
        async for chunk in resp.content.iter_any():
            parts.append(body.take(chunk))
            body.check()
        parts.append(body.flush())
        body.check()
        return b"".join(parts)

    async def _stream(self, data: bytes, out: TurnOutput, t0: float) -> None:
        events = ChatEvents(out, t0)
        async with await self._post(data, out) as resp:
            if not await _opened(resp, out):
                return
            if resp.headers.get("content-type", "").startswith("application/json"):
                out.failure = Failure("protocol", "a JSON body where an event stream was asked")
                raw = await resp.read()
                if b'"error"' in raw:
                    out.failure = Failure("stream_error", error_text(raw))
                return
            body = _Body(resp, self.limits.max_answer_bytes)
            longest = self.limits.max_line_bytes
            try:
                with _ReadWatch(resp, self.request_timeout) as watch:
                    # everything buffered at once (not one HTTP chunk per iteration), stamped
                    # on read
                    async for chunk in resp.content.iter_any():
                        watch.last = now = time.perf_counter()
                        if events.read(body.take(chunk), now):
                            break
                        body.check()
                        if events.split.size > longest:
                            raise TooLarge(f"a line longer than {longest} bytes (--max-line-bytes)")
            finally:
                events.finish()  # what arrived is kept, whatever ended the reading

    async def _raw(self, path: str, data: bytes, out: TurnOutput, t0: float, stream: bool) -> None:
        text = ""
        last = None
        gaps = 0.0
        async with await self._post(data, out, self.base_url + path) as resp:
            if not await _opened(resp, out):
                return
            if not stream:
                doc = orjson.loads(await self._read_all(resp))
                out.latency_s = out.ttft_s = time.perf_counter() - t0
                out.content = raw_piece(doc, out)
                return
            done = False
            split = LineSplitter()  # a /generate event holds the whole text so far
            body = _Body(resp, self.limits.max_answer_bytes)
            longest = self.limits.max_line_bytes
            try:
                with _ReadWatch(resp, self.request_timeout) as watch:
                    async for chunk in resp.content.iter_any():
                        watch.last = now = time.perf_counter()
                        lines = split.lines(body.take(chunk))
                        if split.size > longest:
                            raise TooLarge(f"a line longer than {longest} bytes (--max-line-bytes)")
                        for raw_line in lines:
                            if not raw_line.startswith(b"data:"):
                                continue
                            payload = raw_line[5:].strip()
                            if payload == b"[DONE]":
                                done = True
                                break
                            piece = raw_piece(orjson.loads(payload), out)
                            if out.failure is not None:
                                return
                            if piece.startswith(text) and b"meta_info" in payload:
                                piece = piece[len(text) :]  # /generate: the text so far
                            if piece:
                                text += piece
                                out.events += 1
                                if last is None:
                                    out.ttft_s = now - t0
                                else:
                                    gaps += now - last
                                last = now
                        if done:
                            break
                        body.check()  # (after the lines that fit)
            finally:
                out.content = text  # what arrived is kept, whatever ended the reading
        out.latency_s = time.perf_counter() - t0
        out.content = text
        if out.events > 1:
            out.itl_s = gaps / (out.events - 1)
        if not done:
            out.failure = Failure("cut", "stream ended before [DONE]")


class _Body:
    """A response body as read, at most ``limit`` bytes: ``take`` hands on the part of a
    chunk that fits, ``check`` raises ``TooLarge`` once a chunk did not fit. The harness asks
    for no compression; a body compressed anyway (gzip, deflate: a proxy) is decompressed
    here, to at most the same limit."""

    __slots__ = ("left", "limit", "full", "_z")

    def __init__(self, resp: aiohttp.ClientResponse, limit: int) -> None:
        self.limit = self.left = limit
        self.full = False
        encoding = resp.headers.get("content-encoding", "").strip().lower()
        self._z: Any = None
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._z = zlib.decompressobj(47)  # a gzip or zlib header, told apart by zlib
        elif encoding not in ("", "identity"):
            raise BadResponse(f"a body in content-encoding {encoding!r}, not asked for")

    def take(self, chunk: bytes) -> bytes:
        if self._z is not None:
            try:
                chunk = self._z.decompress(chunk, self.left + 1)
            except zlib.error as exc:
                raise BadResponse(f"a compressed body that does not decompress: {exc}") from None
        if len(chunk) > self.left:
            self.full = True
            chunk = chunk[: self.left]
        self.left -= len(chunk)
        return chunk

    def check(self) -> None:
        if self.full:
            raise TooLarge(f"an answer larger than {self.limit} bytes (--max-answer-bytes)")

    def flush(self) -> bytes:
        if self._z is None or self._z.eof or self.full:
            return b""
        try:
            return self.take(self._z.flush())
        except zlib.error as exc:
            raise BadResponse(f"a compressed body that does not decompress: {exc}") from None


def _text(value: Any) -> str:
    """A text field of a response: a string, or nothing; any other value is no chat API's."""
    if value is None or isinstance(value, str):
        return value or ""
    raise BadResponse(f"a {type(value).__name__} where the API has a string")


class _ReadWatch:
    """The read timeout of a stream's body: no byte for ``limit`` seconds fails the request
    as aiohttp's ``sock_read`` does (``SocketTimeoutError``), but watched by one timer that
    re-arms itself for the time left, where aiohttp cancels and re-arms a timer at every
    read of the socket (3 us a read: at a hundred reads a turn, a fifth of what the harness
    adds to a bare client against a server streaming token by token). ``sock_read`` still
    covers the wait for the headers; this takes over from the response's headers on."""

    __slots__ = ("limit", "last", "fired", "_task", "_handle", "_loop")

    def __init__(self, resp: aiohttp.ClientResponse, limit: float) -> None:
        protocol = resp.connection.protocol if resp.connection is not None else None
        if protocol is not None:
            protocol.read_timeout = None  # (each request on the connection sets its own again)
        self.limit = limit
        self.last = time.perf_counter()  # when the last byte came: the reader sets it
        self.fired = False
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(limit, self._check)

    def _check(self) -> None:
        left = self.last + self.limit - time.perf_counter()
        if left > 0:
            self._handle = self._loop.call_later(left, self._check)
        elif self._task is not None:
            self.fired = True
            self._task.cancel()

    def __enter__(self) -> _ReadWatch:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        """The reading ended: the timer goes; a cancel of the watch's own (and no one else's)
        becomes the read timeout."""
        self._handle.cancel()
        cancelled = kind is not None and issubclass(kind, asyncio.CancelledError)
        if cancelled and self.fired and self._task is not None and self._task.uncancel() == 0:
            raise aiohttp.SocketTimeoutError("Timeout on reading data from socket")


def _own_task(work: Coroutine[Any, Any, TurnOutput]) -> asyncio.Task[TurnOutput]:
    """A streamed answer is read in a task of its own. Each read of the socket resumes the
    task that waits for it through every coroutine between the two: in the caller's task
    that is the whole session (driver, session, turn, attempt, client: ten frames, for each
    of the hundred reads of a turn); in its own task, three. Cancelling the caller cancels
    it too (an awaited task is cancelled with its awaiter)."""
    return asyncio.ensure_future(work)


class _Attempt:
    """One send of a request, marked when aiohttp gave it a connection from the pool."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


async def _opened(resp: aiohttp.ClientResponse, out: TurnOutput) -> bool:
    """Note the answer's status (and the simulator's ground truth, when it says it); an
    error status is the turn's failure: False, nothing more to read."""
    out.status = resp.status
    out.sim_injected = resp.headers.get(SIM_HEADER)
    if resp.status >= 400:
        out.failure = await _status_failure(resp)
        return False
    return True


async def _status_failure(resp: aiohttp.ClientResponse) -> Failure:
    """An HTTP error status, with the server's message when its body can be read."""
    try:
        text = error_text(await resp.content.read(65536))
    except Exception as exc:  # noqa: BLE001 - the status is the failure; the body is a bonus
        text = f"(body unreadable: {type(exc).__name__})"
    return Failure("http_status", text, resp.status, retry_after(resp.headers.get("retry-after")))


def retry_after(value: str | None) -> float | None:
    """A Retry-After header in seconds: a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    value = value.strip()
    with contextlib.suppress(ValueError):
        return max(0.0, float(value))
    from email.utils import parsedate_to_datetime

    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())
