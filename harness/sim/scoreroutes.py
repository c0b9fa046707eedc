"""The simulator's scoring routes: tokenize, and teacher-forced logprobs in SGLang's and
vLLM's shapes (the model in sim/scoring.py).

* ``POST /v1/tokenize`` (SGLang) and ``/tokenize`` (vLLM): ``prompt`` (text) or ``messages``
  (+ ``tools``, ``add_generation_prompt``, ``continue_final_message``) -> ``{"tokens", "count"}``;
* ``POST /generate`` with ``input_ids`` and ``max_new_tokens: 0``: ``meta_info`` has
  ``input_token_logprobs`` from ``logprob_start_len`` on (the first entry null), and
  ``input_top_logprobs`` with ``top_logprobs_num``;
* ``POST /v1/completions`` with token ids as ``prompt`` and ``prompt_logprobs: k``:
  ``choices[0].prompt_logprobs`` (entry 0 null), one generated token.

With ``--scoring off`` both answer 404, as a server with no scoring API.

A scoring request takes a running slot like any request (so it counts in the load), and its
``x-sim-injected`` header is ``logprob_race`` when the race perturbed it, else ``none``.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from harness.dialects.prompt_v4 import render_v4
from harness.sim import openai
from harness.sim.faults import logprob_race_probability
from harness.sim.inject import CHARS_PER_TOKEN
from harness.sim.raw import decode_v4
from harness.sim.scoring import (
    answer_start,
    chat_tokens,
    detokenize,
    rank_of,
    score_ids,
    tokenize,
    top_alternatives,
    valid_ids,
)

HEADER = "x-sim-injected"


def _bad(message: str) -> Response:
    body = orjson.dumps(openai.error(f"invalid request: {message}"))
    return Response(body, 400, media_type="application/json")


def _not_found() -> Response:
    body = orjson.dumps(
        openai.error("this server does not score a given text", 404, "NotFoundError")
    )
    return Response(body, 404, media_type="application/json")


def _json(body: Any, injected: str | None = None) -> Response:
    headers = {HEADER: injected} if injected is not None else None
    return Response(orjson.dumps(body), 200, headers, media_type="application/json")


class ScoringRoutes:
    def __init__(self, sim: Any) -> None:
        self.sim = sim
        self.requests = 0

    def routes(self) -> list[Route]:
        return [
            Route("/v1/tokenize", self.tokenize, methods=["POST"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/v1/detokenize", self.detokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
        ]

    async def _payload(self, request: Request) -> dict[str, Any] | Response:
        """The request's JSON object, or the response that refuses it (404 when the server
        cannot score, 400 for a body that is no JSON object)."""
        if not self.sim.config.scoring:
            return _not_found()
        try:
            payload = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return _bad(str(exc))
        if not isinstance(payload, dict):
            return _bad("the request body must be a JSON object")
        return payload

    async def tokenize(self, request: Request) -> Response:
        payload = await self._payload(request)
        if isinstance(payload, Response):
            return payload
        messages = payload.get("messages")
        if isinstance(messages, list) and messages:
            try:
                ids = chat_tokens(
                    messages,
                    payload.get("tools"),
                    bool(payload.get("add_generation_prompt", True)),
                    bool(payload.get("continue_final_message", False)),
                )
            except Exception as exc:  # noqa: BLE001 - a bad conversation is the client's
                return _bad(f"the messages cannot be rendered: {exc}")
        elif isinstance(payload.get("prompt"), str):
            ids = tokenize(payload["prompt"])
        else:
            return _bad("send 'prompt' (a string) or 'messages' (a list)")
        return _json({"tokens": ids, "count": len(ids), "max_model_len": 1 << 20})

    async def detokenize(self, request: Request) -> Response:
        """Ids back to text: ``{"tokens": [...]}`` -> ``{"prompt": text}`` (vLLM's name) and
        ``"text"`` (SGLang's)."""
        payload = await self._payload(request)
        if isinstance(payload, Response):
            return payload
        ids = payload.get("tokens")
        if not valid_ids(ids):
            return _bad("send 'tokens': a list of token ids from /tokenize")
        assert isinstance(ids, list)
        text = detokenize(ids)
        return _json({"prompt": text, "text": text})

    def _reference(self, ids: list[int]) -> list[int] | None:
        """The ids of the answer the model gave the conversation ``ids`` ends with an
        assistant header of (None: no such answer known)."""
        at = answer_start(ids)
        if at is None:
            return None
        prompt = detokenize(ids[:at])
        messages, tools = decode_v4(prompt)
        engine = self.sim.engine
        digest = engine.prepare_digest(messages, tools)
        answer = engine.answers.get(digest)
        if answer is None:
            return None
        head = render_v4(messages, tools)
        whole = render_v4([*messages, answer], tools)
        if not whole.startswith(head):
            return None
        return tokenize(whole[len(head) :])  # the header ends on a special token

    async def score(self, payload: dict[str, Any], api: str) -> Response:
        """``/generate`` (input_ids) or ``/v1/completions`` (prompt ids) scoring."""
        sim = self.sim
        engine, config = sim.engine, sim.config
        if not config.scoring:
            return _not_found()
        if api == "generate":
            ids = payload.get("input_ids")
            params = payload.get("sampling_params") or {}
            if not isinstance(params, dict) or params.get("max_new_tokens", 0) != 0:
                return _bad("with input_ids the simulator only scores: max_new_tokens must be 0")
            start = payload.get("logprob_start_len", -1)
            k = payload.get("top_logprobs_num", 0) or 0
            if not payload.get("return_logprob"):
                start = -1
        else:
            ids = payload.get("prompt")
            start, k = 0, payload.get("prompt_logprobs")
            k = 0 if k is None else k
        if not valid_ids(ids):
            return _bad("the prompt must be a non-empty list of token ids from /tokenize")
        assert isinstance(ids, list)
        if not isinstance(start, int) or start >= len(ids) or start < -1:
            return _bad("'logprob_start_len' must be -1 or an index into input_ids")
        if not isinstance(k, int) or k < 0:
            return _bad("the top-k must be a non-negative integer")
        sim.chat_requests += 1
        self.requests += 1
        rng = random.Random(f"{config.seed}:score:{self.requests}")
        in_flight = await engine.admit(None)
        try:
            tokens = len(ids) * 3 // CHARS_PER_TOKEN  # (about three bytes an id)
            await asyncio.sleep(engine.latency.ttft(tokens))
            p = logprob_race_probability(
                in_flight, tokens, config.index_k, config.hicache, config.fault_scale
            )
            race_from = None
            if rng.random() < p:
                race_from = rng.randrange(max(start, 1), len(ids))
                engine.injected["logprob_race"] += 1
            noise = 1e-4 + 2e-5 * max(in_flight - 1, 0)
            first = max(start, 0) + 1
            lps = score_ids(ids, first, self._reference(ids), noise, race_from, rng)
        finally:
            engine.release(None)
        injected = "none" if race_from is None else "logprob_race"
        if api == "generate":
            return _json(self._generate_body(ids, start, first, lps, k), injected)
        return _json(self._completions_body(ids, lps, k), injected)

    def _generate_body(
        self, ids: list[int], start: int, first: int, lps: list[float], k: int
    ) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": uuid.uuid4().hex,
            "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": len(ids),
            "completion_tokens": 0,
            "cached_tokens": 0,
            "output_token_logprobs": [],
        }
        if start >= 0:
            meta["input_token_logprobs"] = [[None, ids[start], None]] + [
                [lp, ids[first + j], None] for j, lp in enumerate(lps)
            ]
            if k:
                meta["input_top_logprobs"] = [None] + [
                    [[a_lp, a, None] for a, a_lp in top_alternatives(ids[first + j], first + j,
                                                                     lp, k)]
                    for j, lp in enumerate(lps)
                ]  # fmt: skip
        return {"text": "", "output_ids": [], "meta_info": meta}

    def _completions_body(self, ids: list[int], lps: list[float], k: int) -> dict[str, Any]:
        entries: list[dict[str, Any] | None] = [None]
        for j, lp in enumerate(lps):
            pos = 1 + j
            rank = rank_of(lp)
            entry = {str(ids[pos]): {"logprob": lp, "rank": rank, "decoded_token": None}}
            for rank, (alt, alt_lp) in enumerate(top_alternatives(ids[pos], pos, lp, k), 1):
                entry.setdefault(str(alt), {"logprob": alt_lp, "rank": rank,
                                            "decoded_token": None})  # fmt: skip
            entries.append(entry)
        choice = {"index": 0, "text": " ", "logprobs": None, "finish_reason": "length",
                  "prompt_logprobs": entries}  # fmt: skip
        return {
            "id": "cmpl-" + uuid.uuid4().hex,
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.sim.config.model,
            "choices": [choice],
            "usage": openai.usage(len(ids), 1, 0),
        }
