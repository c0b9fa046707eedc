"""A stand-in OpenAI chat server in a thread of the test (stdlib only, loopback, port 0).

It answers every chat request with a plain "Done." (streamed or not), except as scripted:
``refuse=(status, message)`` answers every chat request with that status and an OpenAI error
body; ``busy=(n, retry_after)`` answers the first ``n`` chat requests 503 with that
``Retry-After``; ``not_openai`` answers 404 everywhere (a web server on the wrong port);
``html`` answers 200 with an HTML page on every path (a proxy's login page, a web
UI); ``key`` answers 401 on every path but ``open_paths`` to a request without
``Authorization: Bearer KEY`` (an auth gateway; vLLM's ``--api-key`` leaves ``/health``
open); ``broken=(status, message)`` answers every request, GET or POST, with that status and
body (a failing server).
``model``: the id ``/v1/models`` lists; ``port``: where it listens (0: any free port).
``arrivals`` keeps when each chat request arrived
(``time.monotonic()``); ``answer`` replaces the "Done." of every answer.
It cannot score a given text (no /tokenize, no /generate).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # the tests open more connections at once than the default 5
    daemon_threads = True


class OpenAIStandin:
    def __init__(
        self,
        *,
        refuse: tuple[int, str] | None = None,
        busy: tuple[int, str] | None = None,
        not_openai: bool = False,
        html: bool = False,
        key: str | None = None,
        broken: tuple[int, str] | None = None,
        open_paths: tuple[str, ...] = (),
        model: str = "m",
        answer: str = "Done.",
        port: int = 0,
    ) -> None:
        self.answer = answer
        self.model = model
        self.open_paths = open_paths
        self.html = html
        self.key = key
        self.broken = broken
        self.refuse = refuse
        self.busy = busy
        self.not_openai = not_openai
        self.arrivals: list[float] = []
        self._lock = threading.Lock()
        self.server = _Server(("127.0.0.1", port), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OpenAIStandin:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt: str, *a: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str, **headers: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def _error(self, code: int, message: str, **headers: str) -> None:
                doc = {"error": {"message": message, "type": "invalid_request_error"}}
                self._send(code, json.dumps(doc).encode(), "application/json", **headers)

            def _hostile(self) -> bool:
                """Answered as ``html``, ``key`` or ``broken`` say; False: not one of those."""
                if standin.html:
                    page = b"<!DOCTYPE html><html><head><title>Sign in</title></head></html>"
                    self._send(200, page, "text/html; charset=utf-8")
                elif (
                    standin.key
                    and self.path not in standin.open_paths
                    and self.headers.get("Authorization") != f"Bearer {standin.key}"
                ):
                    self._error(401, "Unauthorized")
                elif standin.broken is not None:
                    self._error(*standin.broken)
                else:
                    return False
                return True

            def do_GET(self) -> None:
                if self._hostile():
                    return
                if standin.not_openai:
                    self._send(404, b"<html>Not Found</html>", "text/html")
                elif self.path in ("/health", "/v1/models"):
                    doc = {"data": [{"id": standin.model}]}
                    self._send(200, json.dumps(doc).encode(), "application/json")
                else:
                    self._send(404, b"not found", "text/plain")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self._hostile():
                    return
                if standin.not_openai or self.path != "/v1/chat/completions":
                    self._send(404, b"not found", "text/plain")
                    return
                with standin._lock:
                    standin.arrivals.append(time.monotonic())
                    n = len(standin.arrivals)
                if standin.refuse is not None:
                    self._error(*standin.refuse)
                    return
                if standin.busy is not None and n <= standin.busy[0]:
                    self._error(
                        503, "overloaded, come back later", **{"Retry-After": standin.busy[1]}
                    )
                    return
                self._answer(json.loads(body or b"{}"))

            def _answer(self, req: dict[str, Any]) -> None:
                usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
                if not req.get("stream"):
                    doc = {
                        "id": "x",
                        "object": "chat.completion",
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": standin.answer},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": usage,
                    }
                    self._send(200, json.dumps(doc).encode(), "application/json")
                    return
                events = [
                    {
                        "choices": [
                            {"index": 0, "delta": {"role": "assistant", "content": standin.answer}}
                        ]
                    },
                    {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                    {"choices": [], "usage": usage},
                ]
                text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
                self._send(200, text.encode(), "text/event-stream")

        return Handler
