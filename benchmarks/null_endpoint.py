"""A loopback chat endpoint that does no work: canned DSML tool-call answers, as fast as it can.

Raw asyncio HTTP/1.1 (keep-alive, Content-Length request bodies), run as its own process so
it never shares the measured client's event loop. Every POST to /v1/chat/completions gets one
of a few canned assistant turns (reasoning, a short preamble and a DSML v4 tool-call block in
the content, as a server without a tool parser returns it), streamed as SSE chunks (one
chunked-encoding chunk per event, written at once, or with ``--token-ms`` one event at a time,
as a server decoding writes each token) or as one JSON body. ``usage`` carries
``prompt_tokens = request bytes / 4`` so the harness's context schedule works unchanged.

    python benchmarks/null_endpoint.py --port 0   # prints "PORT <n>" on stdout once listening

GET /stats answers {"requests": n, "bytes_in": n, "bytes_out": n, "events": n, "arrivals": [s]}
(``arrivals``: each chat request's arrival, seconds on the endpoint's monotonic clock, for
steady-state rates). ``--record FILE`` appends every chat request body to FILE (a 4-byte
big-endian length, then the body), for a client that replays exactly what another one sent.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from pathlib import Path
from typing import BinaryIO

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.dialects import dsml  # noqa: E402

REASONING = (
    "The user wants the eviction path explained. I have not looked at the cache module yet, "
    "so the first thing to do is to see how the package is laid out and where entries are "
    "written back after a miss. The reload happens in a different function than the eviction, "
    "which suggests the two can interleave when many requests arrive together. I will read "
    "the relevant file before saying anything about the race, and keep the range small."
)
PREAMBLE = "Let me look at the code that handles this before answering."
CALLS = [
    {
        "name": "read_file",
        "arguments": {"path": "src/cache/evict.py", "start_line": 1, "max_lines": 120},
    },
    {
        "name": "search",
        "arguments": {"query": "def reload", "path": "src/cache", "max_results": 20},
    },
    {"name": "list_dir", "arguments": {"path": "src/cache"}},
]


def _chunk(
    delta: dict[str, object] | None,
    finish: str | None = None,
    usage: dict[str, object] | None = None,
) -> bytes:
    body = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        "usage": usage,
    }
    return b"data: " + orjson.dumps(body) + b"\n\n"


def _framed(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _usage(prompt: int, completion: int) -> dict[str, object]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


class Canned:
    """Pre-encoded answers; per request only the usage tail is encoded."""

    def __init__(self, chunk_chars: int, shape: str) -> None:
        self.streams: list[tuple[bytes, int, int]] = []  # (framed events, events, tokens)
        self.pieces: list[list[bytes]] = []  # each stream's framed events, one by one
        self.plains: list[tuple[dict[str, object], int]] = []
        for n, call in enumerate(CALLS):
            markup = dsml.encode_turn(PREAMBLE, [call], version="v4", eos=False)
            tokens = (len(REASONING) + len(markup)) // 4
            args = orjson.dumps(call["arguments"]).decode()
            call_id = f"call_{n}"
            events = [_chunk({"role": "assistant", "content": ""})]
            events += [
                _chunk({"reasoning_content": piece}) for piece in _pieces(REASONING, chunk_chars)
            ]
            if shape == "raw":  # the markup in the content, as a server without a tool parser
                content, calls, finish = markup, None, "stop"
                events += [_chunk({"content": piece}) for piece in _pieces(markup, chunk_chars)]
            else:  # the server parsed the DSML block into OpenAI tool_calls
                content, finish = PREAMBLE, "tool_calls"
                calls = [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": call["name"], "arguments": args},
                    }
                ]
                events += [_chunk({"content": piece}) for piece in _pieces(PREAMBLE, chunk_chars)]
                events.append(
                    _chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": call_id,
                                    "type": "function",
                                    "function": {"name": call["name"], "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                events += [
                    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]})
                    for p in _pieces(args, chunk_chars)
                ]
            events.append(_chunk({}, finish=finish))
            self.streams.append((b"".join(_framed(e) for e in events), len(events), tokens))
            self.pieces.append([_framed(e) for e in events])
            doc = {
                "id": "chatcmpl-bench",
                "object": "chat.completion",
                "created": 1700000000,
                "model": "bench",
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": finish,
                        "logprobs": None,
                        "message": {
                            "role": "assistant",
                            "content": content,
                            "reasoning_content": REASONING,
                            "tool_calls": calls,
                        },
                    }
                ],
            }
            self.plains.append((doc, tokens))


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
)
DONE = _framed(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Stats:
    requests = 0
    bytes_in = 0
    bytes_out = 0
    events = 0
    arrivals: list[float] = []  # one endpoint per process
    record: BinaryIO | None = None


class Conn(asyncio.Protocol):
    def __init__(self, canned: Canned, delay_s: float, token_s: float = 0.0) -> None:
        self.canned = canned
        self.delay_s = delay_s
        self.token_s = token_s
        self.buf = bytearray()
        self.need: int | None = None
        self.method = b""
        self.path = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            if self.need is None:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                head = bytes(self.buf[:end])
                del self.buf[: end + 4]
                line, _, rest = head.partition(b"\r\n")
                parts = line.split(b" ")
                self.method, self.path = parts[0], parts[1] if len(parts) > 1 else b"/"
                self.need = 0
                low = rest.lower()
                at = low.find(b"content-length:")
                if at >= 0:
                    stop = low.find(b"\r\n", at)
                    self.need = int(low[at + 15 : stop if stop >= 0 else None])
            if len(self.buf) < self.need:
                return
            body = bytes(self.buf[: self.need])
            del self.buf[: self.need]
            self.need = None
            self.respond(body)

    def respond(self, body: bytes) -> None:
        assert self.transport is not None
        if self.method == b"GET":
            doc: dict[str, object] = {
                "requests": Stats.requests,
                "bytes_in": Stats.bytes_in,
                "bytes_out": Stats.bytes_out,
                "events": Stats.events,
                "arrivals": Stats.arrivals,
            }
            if self.path.startswith(b"/v1/models"):  # what a client checks first
                doc = {"object": "list", "data": [{"id": "null", "object": "model"}]}
            payload = orjson.dumps(doc)
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
            )
            return
        Stats.requests += 1
        Stats.bytes_in += len(body)
        Stats.arrivals.append(time.monotonic())
        if Stats.record is not None:
            Stats.record.write(len(body).to_bytes(4, "big") + body)
        pick = Stats.requests % len(CALLS)
        prompt = len(body) // 4
        if b'"stream":true' in body:
            framed, events, tokens = self.canned.streams[pick]
            Stats.events += events + 1  # and the usage chunk
            tail = _framed(_chunk(None, usage=_usage(prompt, tokens)))
            if self.token_s > 0:  # one event per write, token_s apart
                parts = [STREAM_HEAD, *self.canned.pieces[pick], tail + DONE]
                Stats.bytes_out += sum(map(len, parts))
                delay = max(self.delay_s, self.token_s)
                asyncio.get_running_loop().call_later(delay, self._drip, parts, 0)
                return
            out = b"".join((STREAM_HEAD, framed, tail, DONE))
        else:
            doc, tokens = self.canned.plains[pick]
            payload = orjson.dumps(dict(doc, usage=_usage(prompt, tokens)))
            out = (
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
            )
        Stats.bytes_out += len(out)
        if self.delay_s > 0:  # a paced server: the whole answer after a fixed time
            asyncio.get_running_loop().call_later(self.delay_s, self._write, out)
        else:
            self.transport.write(out)

    def _drip(self, parts: list[bytes], i: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        # the head goes with the first event, the usage chunk with the last
        n = 2 if i == 0 else 1
        self.transport.write(b"".join(parts[i : i + n]))
        if i + n < len(parts):
            asyncio.get_running_loop().call_later(self.token_s, self._drip, parts, i + n)

    def _write(self, out: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)


async def serve(
    host: str, port: int, chunk_chars: int, shape: str, delay_s: float, token_s: float = 0.0
) -> None:
    canned = Canned(chunk_chars, shape)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: Conn(canned, delay_s, token_s), host, port, backlog=4096
    )
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument(
        "--chunk-chars",
        type=int,
        default=6,
        help="characters per streamed event (about one or two tokens)",
    )
    ap.add_argument(
        "--shape",
        choices=("parsed", "raw"),
        default="parsed",
        help="parsed: OpenAI tool_calls (a server with the DSML parser); "
        "raw: the DSML markup in the content",
    )
    ap.add_argument(
        "--delay-ms",
        type=float,
        default=0.0,
        help="answer each request after this long (a paced server); 0: at once",
    )
    ap.add_argument("--record", type=Path, help="append every chat request body to this file")
    ap.add_argument(
        "--token-ms",
        type=float,
        default=0.0,
        help="stream one event per write, this long apart (a server decoding token by "
        "token); 0: each answer in one write",
    )
    args = ap.parse_args()
    if args.record:
        Stats.record = open(args.record, "ab")  # noqa: SIM115 - open while serving
    asyncio.run(
        serve(
            args.host,
            args.port,
            args.chunk_chars,
            args.shape,
            args.delay_ms / 1000,
            args.token_ms / 1000,
        )
    )
    if Stats.record is not None:
        Stats.record.close()


if __name__ == "__main__":
    main()
