"""The simulator's raw-text endpoints: ``/v1/completions`` and SGLang's ``/generate``.

The prompt (DeepSeek V4 text, as ``harness.dialects.prompt_v4.render_v4`` writes it) is
decoded back into chat messages and tools, so the engine answers the same conversation with
the same model output as on ``/v1/chat/completions``; the answer is the raw DSML text (no
server-side parsing), the end-of-turn token trimmed as a server does when it stops on it.
A prompt that is not V4 text is one user message (a deterministic answer, not the chat one).

As upstream, ``skip_special_tokens`` defaults to true: the DeepSeek special tokens
(``SPECIAL``: the sentence and role tokens, the think delimiters, the DSML mark) are stripped
from the text unless the request sends ``skip_special_tokens: false``, so a raw client that
forgets it sees broken tool calls the model never wrote. With ``raw_add_bos`` the prompt is
counted as a tokenizer that adds its own BOS does: one token more when it starts with one.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harness.dialects import dsml
from harness.dialects.prompt_v4 import ASSISTANT, BOS, END_THINK, THINK, USER
from harness.sim import openai
from harness.sim.engine import Generation, Sampling
from harness.sim.inject import CHARS_PER_TOKEN
from harness.sim.scoring import is_scoring
from harness.sim.transport import Stream

SPECIAL = (BOS, dsml.EOS, USER, ASSISTANT, THINK, END_THINK, dsml.MARK)
_TOOLS_START = "\n\n## Tools\n\n"
_SCHEMAS = re.compile(r"### Available Tool Schemas\n\n(.*?)\n\nYou MUST strictly follow", re.DOTALL)
_RESULT = re.compile(r"<tool_result>(.*?)</tool_result>(?:\n\n)?", re.DOTALL)


def _split_tools(text: str) -> tuple[str, list[dict[str, Any]] | None]:
    at = text.find(_TOOLS_START)
    if at < 0:
        return text, None
    m = _SCHEMAS.search(text, at)
    if m is None:
        return text, None
    tools = []
    for line in m.group(1).splitlines():
        try:
            tools.append({"type": "function", "function": orjson.loads(line)})
        except orjson.JSONDecodeError:
            continue
    return text[:at], tools


def _assistant(text: str, messages: list[dict[str, Any]]) -> None:
    """One assistant turn's text (after the generation header) -> a message, when not empty."""
    if text.startswith(THINK):
        text = text[len(THINK) :].partition(END_THINK)[2]
    elif text.startswith(END_THINK):
        text = text[len(END_THINK) :]
    text = text.split(dsml.EOS, 1)[0]
    if not text:
        return
    parsed = dsml.parse(text + dsml.EOS, "v4")
    if not (parsed.ok and parsed.calls):
        messages.append({"role": "assistant", "content": text})
        return
    calls = [
        {"id": f"call_{i}", "type": "function", "function": c.to_dict()}
        for i, c in enumerate(parsed.calls)
    ]
    messages.append({"role": "assistant", "content": parsed.content or None, "tool_calls": calls})


def decode_v4(prompt: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """A V4 prompt -> (messages, tools), the inverse of ``render_v4`` for what hashing sees."""
    if not prompt.startswith(BOS) or USER not in prompt:
        return [{"role": "user", "content": prompt}], None
    head, *turns = prompt[len(BOS) :].split(USER)
    system, tools = _split_tools(head)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": system})
    for turn in turns:
        user, _, answer = turn.partition(ASSISTANT)
        user, user_tools = _split_tools(user)
        tools = tools or user_tools
        pos, results = 0, []
        while (m := _RESULT.match(user, pos)) is not None:
            results.append(m.group(1))
            pos = m.end()
        for i, text in enumerate(results):
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": text})
        rest = user[pos:]
        if rest or not results:
            messages.append({"role": "user", "content": rest})
        _assistant(answer, messages)
    return messages, tools


def _fields(payload: Any, api: str) -> dict[str, Any]:
    if not isinstance(payload, dict):
        raise ValueError("the request body must be a JSON object")
    if api == "completions":
        prompt, params = payload.get("prompt"), payload
        max_tokens, seed = params.get("max_tokens"), params.get("seed")
    else:
        prompt, params = payload.get("text"), payload.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ValueError("'sampling_params' must be an object")
        max_tokens, seed = params.get("max_new_tokens"), params.get("sampling_seed")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        field = "prompt" if api == "completions" else "text"
        raise ValueError(f"'{field}' must be a non-empty string")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
        raise ValueError("the token limit must be a positive integer")
    if seed is not None and not isinstance(seed, int):
        raise ValueError("the seed must be an integer")
    stream = bool(payload.get("stream"))
    skip = params.get("skip_special_tokens", True)
    if not isinstance(skip, bool):
        raise ValueError("'skip_special_tokens' must be true or false")
    return {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "stream": stream,
            "skip_special_tokens": skip}  # fmt: skip


def strip_special(text: str) -> str:
    """The text as a server decodes it with ``skip_special_tokens``: no special tokens."""
    for token in SPECIAL:
        text = text.replace(token, "")
    return text


def _text(gen: Generation, skip_special: bool) -> tuple[str, str]:
    finish = "length" if gen.finish_reason == "length" else "stop"
    text = gen.raw.removesuffix(dsml.EOS)
    return (strip_special(text) if skip_special else text), finish


class RawRoutes:
    """``/v1/completions`` and ``/generate`` around the chat app's engine."""

    def __init__(self, sim: Any) -> None:
        self.sim = sim

    def routes(self) -> list[Route]:
        return [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
        ]

    async def completions(self, request: Request) -> Response:
        return await self._answer(request, "completions")

    async def generate(self, request: Request) -> Response:
        return await self._answer(request, "generate")

    async def _answer(self, request: Request, api: str) -> Response:
        sim = self.sim
        sim.chat_requests += 1
        try:
            payload = orjson.loads(await request.body())
            if is_scoring(payload, api):
                sim.chat_requests -= 1  # counted by the scoring route
                return await sim.scoring.score(payload, api)  # type: ignore[no-any-return]
            fields = _fields(payload, api)
        except (orjson.JSONDecodeError, ValueError) as exc:
            body = orjson.dumps(openai.error(f"invalid request: {exc}"))
            return Response(body, 400, {"x-sim-injected": "none"}, media_type="application/json")
        engine = sim.engine
        prompt = fields["prompt"]
        if sim.config.raw_add_bos:
            prompt = BOS + prompt  # the tokenizer's own BOS, before whatever the prompt holds
        messages, tools = decode_v4(prompt.replace(BOS + BOS, BOS, 1))
        prepared = engine.prepare(messages, tools)
        in_flight = await engine.admit(prepared[0])
        gen: Generation | None = None
        tokens = 0

        def done() -> None:
            engine.running_tokens -= tokens
            engine.release(gen.pinned if gen is not None else None)

        try:
            gen = engine.generate(
                messages,
                tools,
                in_flight,
                Sampling(fields["max_tokens"], fields["seed"]),
                prepared=prepared,
                pin=True,
            )
            tokens = gen.prompt_tokens + gen.completion_tokens
            engine.running_tokens += tokens
        except BaseException:
            done()
            raise
        headers = {"x-sim-injected": gen.injected}
        rid = uuid.uuid4().hex
        skip = fields["skip_special_tokens"]
        if prompt.startswith(BOS + BOS):
            gen = replace(gen, prompt_tokens=gen.prompt_tokens + 1)  # a double BOS
        if fields["stream"]:
            return Stream(self._events(api, rid, gen, skip), headers, done)
        try:
            await engine.answer_time(gen)
        finally:
            done()
        text, finish = _text(gen, skip)
        return Response(
            orjson.dumps(self._body(api, rid, gen, text, finish, True)),
            200,
            headers,
            media_type="application/json",
        )

    def _body(
        self, api: str, rid: str, gen: Generation, text: str, finish: str | None, last: bool
    ) -> dict[str, Any]:
        if api == "completions":
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            body: dict[str, Any] = {
                "id": "cmpl-" + rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.sim.config.model,
                "choices": [choice],
            }
            if last:
                body["usage"] = openai.usage(
                    gen.prompt_tokens, gen.completion_tokens, gen.cached_tokens
                )
            return body
        meta = {
            "id": rid,
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens if last else 0,
            "cached_tokens": gen.cached_tokens,
            "finish_reason": {"type": finish} if finish else None,
        }
        return {"text": text, "meta_info": meta}

    async def _events(
        self, api: str, rid: str, gen: Generation, skip_special: bool
    ) -> AsyncIterator[bytes]:
        """SSE: completions events carry a delta, /generate events the text so far."""
        engine = self.sim.engine
        await asyncio.sleep(engine.latency.ttft(gen.prompt_tokens - gen.cached_tokens))
        text, finish = _text(gen, skip_special)
        size = self.sim.chunk_chars
        pieces = [text[i : i + size] for i in range(0, len(text), size)] or [""]
        sent = ""
        for i, piece in enumerate(pieces):
            tokens = max(1, len(piece) // CHARS_PER_TOKEN)
            await asyncio.sleep(engine.latency.per_token(engine.running) * tokens)
            sent += piece
            last = i == len(pieces) - 1
            shown = piece if api == "completions" else sent
            body = self._body(api, rid, gen, shown, finish if last else None, last)
            yield b"data: " + orjson.dumps(body) + b"\n\n"
        yield b"data: [DONE]\n\n"
