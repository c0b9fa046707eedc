"""The embedded endpoint as a Starlette app: OpenAI chat API plus SGLang's native extras."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from harness.sim import openai
from harness.sim.config import SimConfig
from harness.sim.engine import Engine, Generation
from harness.sim.inject import CHARS_PER_TOKEN

log = logging.getLogger(__name__)

INJECTED_HEADER = "x-sim-injected"
_ROLES = {"system", "developer", "user", "assistant", "tool"}


class BadRequest(Exception):
    pass


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status, headers, media_type="application/json")


def _bad(message: str) -> Response:
    return _json(openai.error(message), 400, {INJECTED_HEADER: "none"})


class _Stream(StreamingResponse):
    """A streaming response that frees its running slot however it ends."""

    def __init__(
        self, body: AsyncIterator[bytes], headers: dict[str, str], done: Callable[[], None]
    ) -> None:
        super().__init__(body, media_type="text/event-stream", headers=headers)
        self._done = done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._done()


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
    }


class SimApp:
    """Route handlers around one Engine."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.engine = Engine(config)
        self.chunk_chars = config.chunk_tokens * CHARS_PER_TOKEN

    async def chat(self, request: Request) -> Response:
        try:
            fields = validate(orjson.loads(await request.body()))
        except orjson.JSONDecodeError as exc:
            return _bad(f"invalid JSON body: {exc}")
        except BadRequest as exc:
            return _bad(str(exc))
        engine = self.engine
        in_flight = await engine.admit()
        tokens = 0

        def done() -> None:
            engine.running_tokens -= tokens
            engine.release()

        try:
            gen = engine.generate(
                fields["messages"],
                fields["tools"],
                in_flight,
                fields["max_tokens"],
                fields["seed"],
                fields["call_tools"],
            )
            tokens = gen.prompt_tokens + gen.completion_tokens
            engine.running_tokens += tokens
        except BaseException:
            done()
            raise
        if gen.injected != "none":
            log.debug("injected %s (%d in flight)", gen.injected, in_flight)
        headers = {INJECTED_HEADER: gen.injected}
        rid = "chatcmpl-" + uuid.uuid4().hex
        if fields["stream"]:
            events = self._events(rid, gen, fields["include_usage"])
            return _Stream(events, headers, done)
        try:
            uncached = gen.prompt_tokens - gen.cached_tokens
            per_token = engine.latency.per_token(engine.running)
            await asyncio.sleep(engine.latency.ttft(uncached) + per_token * gen.completion_tokens)
        finally:
            done()
        use = openai.usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens)
        body = openai.completion(
            rid,
            int(time.time()),
            self.config.model,
            gen.content,
            gen.calls,
            gen.call_ids,
            gen.finish_reason,
            use,
        )
        return _json(body, headers=headers)

    async def _events(self, rid: str, gen: Generation, include_usage: bool) -> AsyncIterator[bytes]:
        engine, model, created = self.engine, self.config.model, int(time.time())
        latency = engine.latency
        await asyncio.sleep(latency.ttft(gen.prompt_tokens - gen.cached_tokens))
        yield openai.chunk(rid, created, model, {"role": "assistant", "content": ""})
        for delta, chars in openai.deltas(gen.content, gen.calls, gen.call_ids, self.chunk_chars):
            tokens = max(1, chars // CHARS_PER_TOKEN)
            await asyncio.sleep(latency.per_token(engine.running) * tokens)
            yield openai.chunk(rid, created, model, delta)
        yield openai.chunk(rid, created, model, {}, gen.finish_reason)
        if include_usage:
            use = openai.usage(gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens)
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

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def health_generate(self, request: Request) -> Response:
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
        lines.append("# TYPE sim:injected_total counter")
        for kind, n in sorted(self.engine.injected.items()):
            lines.append(f'sim:injected_total{{kind="{kind}"}} {n}')
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def server_info(self, request: Request) -> Response:
        c = self.config
        return _json(
            {
                "model_path": c.model,
                "served_model_name": c.model,
                "max_total_num_tokens": c.kv_capacity,
                "max_running_requests": c.max_running,
                "tool_call_parser": "deepseekv4",
                "enable_hierarchical_cache": c.hicache == "on",
                "index_k_dtype": c.index_k,
                "topk": c.topk,
                "version": "sim",
            }
        )

    async def flush_cache(self, request: Request) -> Response:
        self.engine.flush()
        return PlainTextResponse("Cache flushed.\n")


def create_app(config: SimConfig) -> Starlette:
    sim = SimApp(config)
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
    app = Starlette(routes=routes)
    app.state.sim = sim
    return app
