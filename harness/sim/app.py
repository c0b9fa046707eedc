"""The embedded endpoint as a Starlette app: OpenAI chat API plus SGLang's native extras."""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import itertools
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from harness.sim import openai, transport
from harness.sim.config import SimConfig
from harness.sim.engine import Engine, Generation, Sampling
from harness.sim.inject import CHARS_PER_TOKEN
from harness.sim.raw import RawRoutes
from harness.sim.scoreroutes import ScoringRoutes
from harness.sim.scoring import tokenize
from harness.sim.transport import Stream, TransportFault

log = logging.getLogger(__name__)

INJECTED_HEADER = "x-sim-injected"
_ROLES = {"system", "developer", "user", "assistant", "tool"}


class BadRequest(Exception):
    pass


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def _bad(message: str) -> Response:
    return _json(openai.error(message), 400, {INJECTED_HEADER: "none"})


class _QuietCut(logging.Filter):
    """Drop uvicorn's error line for a response left unfinished on purpose (a disconnect)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("ASGI callable returned without completing")


_QUIET_CUT = _QuietCut()


class RequireKey:
    """ASGI middleware: 401 without ``Authorization: Bearer <key>`` (health and metrics open,
    as SGLang's ``--api-key`` does)."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = b"Bearer " + key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(("/health", "/metrics")):
            got = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
            if not hmac.compare_digest(got, self.expected):
                body = openai.error(
                    "missing or wrong API key: send it as 'Authorization: Bearer <key>'",
                    401,
                    "AuthenticationError",
                )
                await _json(body, 401, {INJECTED_HEADER: "none"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def validate(payload: Any) -> dict[str, Any]:
    """The request fields the server uses; BadRequest says what is wrong."""
    if not isinstance(payload, dict):
        raise BadRequest("the request body must be a JSON object")
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in _ROLES:
            raise BadRequest(f"messages[{i}] must be an object with a role in {sorted(_ROLES)}")
    tools = payload.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise BadRequest("'tools' must be a list")
    max_tokens = payload.get("max_tokens", payload.get("max_completion_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise BadRequest("'max_tokens' must be a positive integer")
    seed = payload.get("seed")
    if seed is not None and not isinstance(seed, int):
        raise BadRequest("'seed' must be an integer")
    options = payload.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return {
        "messages": messages,
        "tools": tools,
        "call_tools": payload.get("tool_choice") != "none",
        "max_tokens": max_tokens,
        "seed": seed,
        "stream": bool(payload.get("stream")),
        "include_usage": include_usage,
        "meta_info": payload.get("return_meta_info") is True,
        "token_ids": payload.get("return_token_ids") is True,
    }


def output_ids(gen: Generation) -> list[int]:
    """The generated tokens' ids: the reasoning and the raw output (tool-call markup
    included) by the simulator's tokenizer, as a server returns the ids it sampled."""
    return tokenize(gen.reasoning + gen.raw)


class SimApp:
    """Route handlers around one Engine."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self.chunk_chars = config.chunk_tokens * CHARS_PER_TOKEN
        self.chat_requests = 0  # every POST that reached the chat handler
        self.scoring: ScoringRoutes | None = None  # set by create_app
        self.ready_at = time.monotonic() + config.slow_start
        self.exit: Callable[[int], Any] = os._exit  # how --crash-after ends the process

    def _crash_due(self) -> None:
        limit = self.config.crash_after
        if limit is not None and self.chat_requests > limit:
            log.error("crash: exiting abruptly after %d chat requests (--crash-after)", limit)
            logging.shutdown()
            self.exit(70)

    async def chat(self, request: Request) -> Response:
        self.chat_requests += 1
        self._crash_due()
        try:
            fields = validate(orjson.loads(await request.body()))
        except orjson.JSONDecodeError as exc:
            return _bad(f"invalid JSON body: {exc}")
        except BadRequest as exc:
            return _bad(str(exc))
        engine = self.engine
        prepared = engine.prepare(fields["messages"], fields["tools"])
        fault = engine.transport_fault(prepared, fields["seed"], fields["stream"])
        if fault is not None and fault.kind == "error":
            log.debug("injected %s", fault.label)
            return Response(
                transport.error_body(fault.status),
                fault.status,
                {INJECTED_HEADER: fault.label},
                media_type="application/json",
            )
        if fault is not None and fault.kind == transport.UNENCODABLE and not fields["stream"]:
            log.debug("injected %s", fault.label)
            return Response(
                transport.unencodable_body(int(fault.at * 400)),
                500,
                {INJECTED_HEADER: fault.label},
                media_type="application/json",
            )
        in_flight = await engine.admit(prepared[0])  # waits for a slot and room for its KV
        tokens = 0
        gen: Generation | None = None

        def done() -> None:
            engine.running_tokens -= tokens
            engine.release(gen.pinned if gen is not None else None)

        try:
            gen = engine.generate(
                fields["messages"],
                fields["tools"],
                in_flight,
                Sampling(fields["max_tokens"], fields["seed"], fields["call_tools"]),
                prepared=prepared,
                corrupt=fault is None,
                pin=True,  # the prompt's KV stays in the pool while the answer is sent
            )
            tokens = gen.prompt_tokens + gen.completion_tokens
            engine.running_tokens += tokens
        except BaseException:
            done()
            raise
        injected = gen.injected if fault is None else fault.label
        if injected != "none":
            log.debug("injected %s (%d in flight)", injected, in_flight)
        headers = {INJECTED_HEADER: injected}
        rid = "chatcmpl-" + uuid.uuid4().hex
        if fields["stream"]:
            if fault is None:
                events = self._events(rid, gen, fields["include_usage"], ids=fields["token_ids"])
                return Stream(events, headers, done)
            parts = len(
                list(
                    openai.deltas(
                        gen.content, gen.calls, gen.call_ids, self.chunk_chars, gen.reasoning
                    )
                )
            )
            at = fault.index(parts)  # output events before the fault (role event not counted)
            events = self._events(rid, gen, fields["include_usage"], fault, at, fields["token_ids"])
            cut = (fault.kind, at + 1) if fault.kind in ("disconnect", "stall") else None
            return Stream(events, headers, done, fault=cut, stall_s=self.config.stall_seconds)
        try:
            await engine.answer_time(gen)
        finally:
            done()
        use = openai.usage(gen.prompt_tokens, gen.completion_tokens, self._cached(gen))
        answer = openai.Answer(
            gen.content, gen.calls, gen.call_ids, gen.finish_reason, gen.reasoning
        )
        body = openai.completion(rid, int(time.time()), self.config.model, answer, use)
        if fields["meta_info"]:  # SGLang's per-request meta_info (non-streamed requests)
            body["choices"][0]["meta_info"] = engine.meta_info(gen)
        if fields["token_ids"]:  # vLLM's return_token_ids: the generated tokens' ids
            body["choices"][0]["token_ids"] = output_ids(gen)
        if fault is None:
            return _json(body, headers=headers)
        return self._faulty_body(orjson.dumps(body), headers, fault)

    def _cached(self, gen: Generation) -> int | None:
        return gen.cached_tokens if self.config.cache_report else None

    def _faulty_body(self, data: bytes, headers: dict[str, str], fault: TransportFault) -> Response:
        """A non-streamed body that is invalid JSON, or cut or stalled part-way."""
        if fault.kind == "bad_json":
            return Response(transport.broken(data), 200, headers, media_type="application/json")
        split = min(len(data) - 1, max(1, int(fault.at * len(data))))
        headers = {**headers, "content-length": str(len(data))}
        return Stream(
            transport.pieces(data[:split], data[split:]),
            headers,
            lambda: None,  # the running slot is already free
            media_type="application/json",
            fault=(fault.kind, 1),
            stall_s=self.config.stall_seconds,
        )

    async def _events(
        self,
        rid: str,
        gen: Generation,
        include_usage: bool,
        fault: TransportFault | None = None,
        at: int = -1,
        ids: bool = False,
    ) -> AsyncIterator[bytes]:
        """The SSE events; an ``error_event``, ``unencodable`` or ``bad_json`` fault replaces
        output event ``at`` (the finish event when ``at`` is past the last delta). With ``ids``
        the finish event carries the generated tokens' ids (``token_ids``, as vLLM's events
        carry theirs)."""
        engine, model, created = self.engine, self.config.model, int(time.time())
        latency = engine.latency
        spoil = fault.kind if fault is not None else ""
        if spoil not in ("error_event", "bad_json", transport.UNENCODABLE):
            spoil = ""
        await asyncio.sleep(latency.ttft(gen.prompt_tokens - gen.cached_tokens))
        yield openai.chunk(rid, created, model, {"role": "assistant", "content": ""})
        outputs = openai.deltas(
            gen.content, gen.calls, gen.call_ids, self.chunk_chars, gen.reasoning
        )
        for i, (delta, chars) in enumerate(itertools.chain(outputs, ((None, 0),))):
            if delta is None:  # the finish event
                more = {"token_ids": output_ids(gen)} if ids else None
                event = openai.chunk(rid, created, model, {}, gen.finish_reason, extra=more)
            else:
                tokens = max(1, chars // CHARS_PER_TOKEN)
                await asyncio.sleep(latency.per_token(engine.running) * tokens)
                event = openai.chunk(rid, created, model, delta)
            if i == at and spoil:
                if spoil in ("error_event", transport.UNENCODABLE):
                    yield (
                        transport.error_event()
                        if spoil == "error_event"
                        else transport.unencodable_event(i * self.chunk_chars)
                    )
                    yield openai.DONE
                    return
                event = transport.broken(event)
            yield event
        if include_usage:
            use = openai.usage(gen.prompt_tokens, gen.completion_tokens, self._cached(gen))
            yield openai.chunk(rid, created, model, None, use=use)
        yield openai.DONE

    async def models(self, request: Request) -> Response:
        card = {
            "id": self.config.model,
            "object": "model",
            "created": 0,
            "owned_by": "sglang",
            "root": self.config.model,
            "max_model_len": 1_048_576,
        }
        return _json({"object": "list", "data": [card]})

    def _starting(self) -> bool:
        return self.config.slow_start > 0 and time.monotonic() < self.ready_at

    async def health(self, request: Request) -> Response:
        return Response(status_code=503 if self._starting() else 200)

    async def health_generate(self, request: Request) -> Response:
        if self._starting():
            return Response(status_code=503)
        engine = self.engine
        await engine.admit()
        try:
            await asyncio.sleep(engine.latency.ttft(1) + engine.latency.per_token(engine.running))
        finally:
            engine.release()
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        labels = f'{{model_name="{self.config.model}"}}'
        lines = []
        for name, value in self.engine.metrics().items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE sglang:{name} {kind}", f"sglang:{name}{labels} {value}"]
        lines += [
            "# TYPE sim:chat_requests_total counter",
            f"sim:chat_requests_total {self.chat_requests}",
        ]
        lines.append("# TYPE sim:injected_total counter")
        for kind, n in sorted(self.engine.injected.items()):
            lines.append(f'sim:injected_total{{kind="{kind}"}} {n}')
        # the KV pool and the race's mechanism: evictions, load-backs, corruption by cause
        for name, value in self.engine.pool_metrics().items():
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE sim:{name} {kind}", f"sim:{name} {value}"]
        lines.append("# TYPE sim:corrupted_total counter")
        for cause in ("race", "loadback", "loop", "rate", "forced"):
            lines.append(f'sim:corrupted_total{{cause="{cause}"}} {self.engine.causes[cause]}')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def server_info(self, request: Request) -> Response:
        """As SGLang's: every flag the server runs with (the API key aside), under SGLang's
        names where it has one, so a level that reaches the server shows here."""
        c = self.config
        flags = {k: v for k, v in dataclasses.asdict(c).items() if k != "api_key"}
        for ours in ("index_k", "hicache", "kv_capacity", "max_running", "seed", "model",
                     "deterministic", "kv_canary"):  # fmt: skip
            flags.pop(ours)
        return _json(
            {
                "model_path": c.model,
                "served_model_name": c.model,
                "max_total_num_tokens": c.kv_capacity,
                "max_running_requests": c.max_running,
                "tool_call_parser": c.dialect if c.tool_parser == "on" else None,
                "enable_hierarchical_cache": c.hicache == "on",
                "index_k_dtype": c.index_k,
                "enable_cache_report": c.cache_report,
                "random_seed": c.seed,
                "enable_deterministic_inference": c.deterministic,
                "kv_canary": "log" if c.kv_canary else None,
                "api_key_required": c.api_key is not None,
                **flags,
                "version": "sim",
            }
        )

    async def flush_cache(self, request: Request) -> Response:
        """As SGLang: refused (400) while any request runs or waits."""
        engine = self.engine
        if engine.running or engine.queued:
            return PlainTextResponse(
                "Cache not flushed because there are pending requests. "
                f"#queue-req: {engine.queued}, #running-req: {engine.running}\n",
                status_code=400,
            )
        engine.flush()
        return PlainTextResponse("Cache flushed.\n")


def create_app(config: SimConfig) -> Starlette:
    sim = SimApp(config)
    # one line per route; other modules add theirs to this list
    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/models", sim.models, methods=["GET"]),
        Route("/health", sim.health, methods=["GET"]),
        Route("/health_generate", sim.health_generate, methods=["GET"]),
        Route("/metrics", sim.metrics, methods=["GET"]),
        Route("/server_info", sim.server_info, methods=["GET"]),
        Route("/get_server_info", sim.server_info, methods=["GET"]),
        Route("/flush_cache", sim.flush_cache, methods=["POST", "GET"]),
    ]
    sim.scoring = ScoringRoutes(sim)  # teacher-forced scores on /generate, /v1/completions
    routes += RawRoutes(sim).routes()  # /v1/completions, /generate
    routes += sim.scoring.routes()  # /v1/tokenize, /tokenize
    middleware = [] if config.api_key is None else [Middleware(RequireKey, key=config.api_key)]
    if config.disconnect_rate > 0:
        logging.getLogger("uvicorn.error").addFilter(_QUIET_CUT)
    app = Starlette(routes=routes, middleware=middleware)
    app.state.sim = sim
    return app
