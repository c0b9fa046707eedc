"""An OpenAI-compatible HTTP front for engine builds that serve chat completions through
their Python API only (xllamacpp before it shipped llama.cpp's HTTP server: 0.1.x).

``Server.handle_chat_completions(body, on_error, on_ok)`` runs one request to its end and
calls ``on_ok`` with the response JSON (``bytes``), once, or once per chunk when the request
streams; it releases the GIL, so each HTTP connection gets a thread of its own and requests
run concurrently on the engine's slots exactly as they would behind llama.cpp's own server.

Routes: ``POST /v1/chat/completions`` (streamed as server-sent events or not), ``GET
/health``, ``GET /v1/models``, ``GET /props`` (``total_slots``, the build) and ``GET
/metrics`` when the build has ``handle_metrics``. An answer the engine cannot encode (its JSON
encoder raises on invalid UTF-8 in the generated text) comes back as the engine's error, with
HTTP 500 and the engine's message, never as a dropped connection.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

log = logging.getLogger("harness.llamacpp")

_MAX_BODY = 64 * 1024 * 1024


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


def _engine_error(exc: RuntimeError) -> bytes:
    """An exception the engine raised for a request, as llama.cpp's server answers one:
    ``{"error": {"code": 500, "message": ...}}`` (its JSON encoder raises
    ``[json.exception.type_error.316] invalid UTF-8 byte ...`` when the generated text is
    not UTF-8)."""
    log.warning("engine raised: %s", exc)
    error = {"code": 500, "message": str(exc), "type": "server_error"}
    return json.dumps({"error": error}).encode()


def _status_of(error: bytes) -> int:
    """The HTTP status of an engine error (its ``error.code`` when it has one)."""
    try:
        code = json.loads(error).get("error", {}).get("code")
    except (ValueError, AttributeError):
        return 500
    return code if isinstance(code, int) and 400 <= code <= 599 else 500


class _Handler(BaseHTTPRequestHandler):
    server: HttpFront
    protocol_version = "HTTP/1.1"

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the client went away: its business
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, value: Any) -> None:
        self._send(status, json.dumps(value).encode())

    def do_GET(self) -> None:
        front = self.server
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            model = {"id": front.alias, "object": "model", "owned_by": "llamacpp"}
            self._json(200, {"object": "list", "data": [model]})
        elif path == "/props":
            self._json(200, front.props)
        elif path == "/metrics" and hasattr(front.engine, "handle_metrics"):
            out: list[bytes] = []
            err: list[bytes] = []
            front.engine.handle_metrics(
                lambda e: err.append(_as_bytes(e)), lambda r: out.append(_as_bytes(r))
            )
            if err:
                self._send(_status_of(err[0]), err[0])
            else:
                self._send(200, b"".join(out), "text/plain; version=0.0.4")
        else:
            self._json(404, {"error": {"code": 404, "message": f"no route {path}"}})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/chat/completions", "/chat/completions"):
            self._json(404, {"error": {"code": 404, "message": f"no route {path}"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= _MAX_BODY:
            self._json(400, {"error": {"code": 400, "message": "a JSON body is required"}})
            return
        raw = self.rfile.read(length)
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._json(400, {"error": {"code": 400, "message": f"invalid JSON: {exc}"}})
            return
        if not isinstance(body, dict):
            self._json(400, {"error": {"code": 400, "message": "the body must be an object"}})
            return
        if self.server.request_defaults:
            raw = json.dumps({**self.server.request_defaults, **body}).encode()
        if body.get("stream"):
            self._stream(raw)
        else:
            self._whole(raw)

    def _whole(self, raw: bytes) -> None:
        out: list[bytes] = []
        err: list[bytes] = []
        try:
            self.server.engine.handle_chat_completions(
                raw.decode("utf-8", "surrogateescape"),
                lambda e: err.append(_as_bytes(e)),
                lambda r: out.append(_as_bytes(r)),
            )
        except RuntimeError as exc:  # the engine's own failure (its JSON encoder's, mostly)
            err.append(_engine_error(exc))
        if err:
            log.warning("engine error: %s", err[0][:300].decode("utf-8", "replace"))
            self._send(_status_of(err[0]), err[0])
        elif out:
            self._send(200, out[-1])
        else:
            self._json(500, {"error": {"code": 500, "message": "the engine gave no answer"}})

    def _stream(self, raw: bytes) -> None:
        started = False
        failed: list[bytes] = []

        def chunk(value: Any) -> None:
            nonlocal started
            if not started:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                started = True
            self.wfile.write(b"data: " + _as_bytes(value) + b"\n\n")
            self.wfile.flush()

        def error(value: Any) -> None:
            failed.append(_as_bytes(value))

        try:
            self.server.engine.handle_chat_completions(
                raw.decode("utf-8", "surrogateescape"), error, chunk
            )
        except RuntimeError as exc:
            failed.append(_engine_error(exc))
        if failed:
            log.warning("engine error: %s", failed[0][:300].decode("utf-8", "replace"))
        if not started:
            body = failed[0] if failed else b'{"error":{"code":500,"message":"no answer"}}'
            self._send(_status_of(body), body)
            return
        if failed:  # mid-stream: the error as the last event, as llama.cpp's server does
            self.wfile.write(b"data: " + failed[0] + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True


class HttpFront(ThreadingHTTPServer):
    """``HttpFront((host, port), engine, alias=..., props=...)``; ``serve_forever()`` in a
    thread, ``shutdown()`` to stop."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        engine: Any,
        *,
        alias: str,
        props: dict[str, Any],
        request_defaults: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.engine = engine
        self.alias = alias
        self.props = props
        #: request fields the server takes per request in these builds (``cache_prompt``)
        self.request_defaults = request_defaults or {}

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.serve_forever, name="http-front", daemon=True)
        thread.start()
        return thread
