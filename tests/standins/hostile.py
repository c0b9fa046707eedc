"""A hostile chat server for the fault tests (stdlib only, loopback only).

    python hostile.py --port N --mode MODE [--max-life S]

Every answer to ``POST /v1/chat/completions`` follows ``--mode``; a request that carries a
tool result (the session's second turn) gets a healthy "All done." answer in every mode but
the endless ones, so sessions end. Streamed when the request says ``"stream": true``.

Modes:
  deep        a tool call whose arguments nest 10,000 lists deep
  surrogate   a tool call whose arguments hold an escaped lone surrogate (``\\ud800``)
  huge-first  the first request: 1,000,000 x's in one event; the others: a slow healthy
              stream (20 events 50 ms apart)
  endless     events of 1,000 x's, without end
  endless-line  bytes without a newline, without end
  trickle     one event of "x" every 0.2 s, without end
  gzip        gzip-compressed when the request's Accept-Encoding allows it, else plain
  gzip-always gzip-compressed whatever the request asked (a compressing proxy)
  gzip-bomb   100 MB of x's gzip-compressed (about 100 kB on the wire), whatever was asked
  retry-after the first request: 503 with ``Retry-After: 1``; then healthy
  healthy     always "All done."

``--api-key KEY``: chat requests without ``Authorization: Bearer KEY`` get 401.
``GET /health`` answers 200; ``GET /stats`` the number of chat requests and the
Accept-Encoding of the last one. The process exits by itself after ``--max-life`` seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

ENDLESS_S = 30.0  # an endless answer still ends after this long (the test failed otherwise)


def chunk(content: str | None = None, calls: list[dict[str, Any]] | None = None) -> bytes:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if calls is not None:
        delta["tool_calls"] = calls
    event = {"choices": [{"index": 0, "delta": delta}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


FINISH = (
    b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],'
    b' "usage": {"prompt_tokens": 9, "completion_tokens": 2}}\n\ndata: [DONE]\n\n'
)


def completion(content: str, calls: list[dict[str, Any]] | None = None) -> bytes:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    doc = {
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2},
    }
    return json.dumps(doc).encode()


def tool_call(arguments: str) -> list[dict[str, Any]]:
    return [
        {
            "index": 0,
            "id": "call_0",
            "type": "function",
            "function": {"name": "read_file", "arguments": arguments},
        }
    ]


DEEP = '{"path": ' + "[" * 10_000 + "]" * 10_000 + "}"
SURROGATE = '{"path": "\\ud800src"}'


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", required=True)
    p.add_argument("--max-life", type=float, default=60.0)
    p.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    args = p.parse_args()
    killer = threading.Timer(args.max_life, lambda: os._exit(3))
    killer.daemon = True
    killer.start()
    stats: dict[str, Any] = {"chat": 0, "accept_encoding": None}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # every answer ends with the connection

        def log_message(self, fmt: str, *a: object) -> None:
            pass

        def _send(self, code: int, body: bytes, ctype: str, **headers: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._send(200, b"ok", "text/plain")
            elif self.path == "/v1/models":
                self._send(200, b'{"data": [{"id": "m"}]}', "application/json")
            elif self.path == "/stats":
                self._send(200, json.dumps(stats).encode(), "application/json")
            else:
                self._send(404, b"not found", "text/plain")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/v1/chat/completions":
                self._send(404, b"not found", "text/plain")
                return
            if args.api_key and self.headers.get("Authorization") != f"Bearer {args.api_key}":
                self._send(401, b'{"error": {"message": "bad key"}}', "application/json")
                return
            req = json.loads(body)
            with lock:
                stats["chat"] += 1
                n = stats["chat"]
                stats["accept_encoding"] = self.headers.get("Accept-Encoding")
            # the client stops reading: what the endless modes wait for
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._chat(req, n)

        def _chat(self, req: dict[str, Any], n: int) -> None:
            stream = bool(req.get("stream"))
            mode = args.mode
            second = any(m.get("role") == "tool" for m in req.get("messages", []))
            if mode in ("endless", "endless-line", "trickle"):
                self._endless(mode)
                return
            if mode == "retry-after" and n == 1:
                err = b'{"error": {"message": "busy"}}'
                self._send(503, err, "application/json", Retry_After="1")
                return
            calls = None
            content = "All done."
            if not second and mode == "deep":
                calls, content = tool_call(DEEP), ""
            elif not second and mode == "surrogate":
                calls, content = tool_call(SURROGATE), ""
            elif mode == "huge-first" and n == 1:
                content = "x" * 1_000_000
            if mode == "gzip-bomb":
                ctype = "text/event-stream" if stream else "application/json"
                self._gzip(b"x" * (100 << 20), ctype)
                return
            if stream:
                if mode == "huge-first" and n > 1:
                    self._slow_stream()
                    return
                data = chunk(content or None, calls) + FINISH
                ctype = "text/event-stream"
            else:
                data, ctype = completion(content, calls), "application/json"
            accepts = "gzip" in (self.headers.get("Accept-Encoding") or "")
            if mode == "gzip-always" or (mode == "gzip" and accepts):
                self._gzip(data, ctype)
            else:
                self._send(200, data, ctype)

        def _gzip(self, data: bytes, ctype: str) -> None:
            self._send(200, gzip.compress(data, 6), ctype, Content_Encoding="gzip")

        def _head(self, ctype: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.end_headers()

        def _slow_stream(self) -> None:
            self._head("text/event-stream")
            for i in range(20):
                self.wfile.write(chunk("All done." if i == 0 else " "))
                self.wfile.flush()
                time.sleep(0.05)
            self.wfile.write(FINISH)

        def _endless(self, mode: str) -> None:
            self._head("text/event-stream")
            end = time.monotonic() + ENDLESS_S
            piece = chunk("x" * 1000) if mode == "endless" else b"x" * 1000
            while time.monotonic() < end:
                if mode == "trickle":
                    self.wfile.write(chunk("x"))
                    time.sleep(0.2)
                else:
                    self.wfile.write(piece)
                self.wfile.flush()

    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    print(f"hostile: listening on {args.host}:{args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
