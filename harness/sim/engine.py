"""The simulated server's core, without HTTP: admission, KV pool, model, faults, counters.

``Engine.generate`` turns one validated chat request into a ``Generation``: the raw model
text, what the server's DSML parser made of it (content, tool calls, finish reason), token
counts (cached, loaded back from the host tier) and the injected fault kind (``"none"`` when
clean). With ``pin=True`` the prompt's KV stays pinned in the pool until
``release(gen.pinned)``: callers that stream the answer over time should pin.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import orjson

from harness.dialects.base import ToolCall
from harness.sim import reasoning as sim_reasoning
from harness.sim.agent import Agent, parse_tools
from harness.sim.args import ArgMaker, Seen
from harness.sim.cache import Prompt, estimate_tokens, hash_prompt, message_key
from harness.sim.config import SimConfig
from harness.sim.faults import (
    FaultOdds,
    corruption_probability,
    draw_at_rate,
    draw_cause,
    loadback_probability,
)
from harness.sim.inject import CHARS_PER_TOKEN, inject
from harness.sim.kvpool import KVPool
from harness.sim.latency import Latency
from harness.sim.scoring import AnswerMemory
from harness.sim.speaker import speaker
from harness.sim.transport import TransportFault
from harness.sim.transport import draw as draw_transport

log = logging.getLogger(__name__)

#: speculative decoding as the simulator models it: draft tokens per verify step, and the mean
#: accepted tokens per step (the accept length) of healthy, corrupted and looping answers
SPEC_DRAFT = 3
SPEC_LENGTH_HEALTHY, SPEC_LENGTH_CORRUPT, SPEC_LENGTH_LOOP = 2.8, 1.15, 3.95
#: the causes that overwrite a KV page (what --kv-canary log reports): not the loop
RACES = ("race", "loadback", "rate", "forced")


@dataclass(frozen=True)
class Generation:
    raw: str
    content: str | None
    calls: tuple[ToolCall, ...]
    call_ids: tuple[str, ...]
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    injected: str  # "none" or the fault kind
    loaded_tokens: int = 0  # prefix tokens loaded back from the host tier
    pinned: Prompt | None = None  # the prompt pinned in the pool (pass it to release())
    reasoning: str = ""  # the reasoning the server returns apart (``--reasoning field``)
    spec_length: float = SPEC_LENGTH_HEALTHY  # mean accepted tokens per verify step


@dataclass(frozen=True)
class Sampling:
    """How the request asks for its answer: the token limit (None: the configured default),
    the seed, and whether it may call tools (``call_tools=False``: ``tool_choice: "none"``)."""

    max_tokens: int | None = None
    seed: int | None = None
    call_tools: bool = True


def _seed(*parts: bytes) -> random.Random:
    digest = hashlib.blake2b(b"|".join(parts), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def _answer_message(content: str | None, calls: Sequence[ToolCall]) -> dict[str, Any]:
    """A clean answer as the assistant message a client would send back."""
    return {
        "role": "assistant",
        "content": content or None,
        "tool_calls": [
            {"id": f"call_{i}", "type": "function",
             "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
            for i, c in enumerate(calls)
        ],
    }  # fmt: skip


def _misread(call: ToolCall, rng: random.Random) -> ToolCall:
    """A passkey read from a corrupted KV page: the same shape, some digits wrong."""
    key = call.arguments.get("passkey")
    if not isinstance(key, str):
        return call
    digits = list(key)
    for i in rng.sample(range(3, len(digits)), k=min(3, max(0, len(digits) - 3))):
        digits[i] = rng.choice([d for d in "0123456789abcdef" if d != digits[i]])
    return ToolCall(call.name, {**call.arguments, "passkey": "".join(digits)})


#: The simulated speculative decoding: acceptance of healthy and of corrupted answers, and the
#: weight of each answer in the moving mean.
SPEC_ACCEPT, SPEC_CORRUPT, SPEC_WEIGHT = 0.7, 0.1, 0.05


class Engine:
    """State shared by all requests of one server (single event loop, no locks needed)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.latency = Latency(speed=config.speed)
        host = int(config.kv_capacity * config.hicache_ratio) if config.hicache == "on" else 0
        self.pool = KVPool(config.kv_capacity, host)
        self.agent = Agent()
        self.speaker = speaker(config.dialect)
        self.running = 0
        self.queued = 0
        self.requests = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.generation_tokens_total = 0
        self.last_hit_rate = 0.0  # cached share of the last prefill (SGLang's cache_hit_rate)
        self.accept_rate = SPEC_ACCEPT  # speculative acceptance, moving (see metrics())
        self.running_tokens = 0
        self.injected: Counter[str] = Counter()
        self.answers = AnswerMemory()  # the clean answer of each conversation (sim/scoring.py)
        self.causes: Counter[str] = Counter()  # corrupted responses by mechanism
        self.has_transport_faults = any(rate > 0 for _, rate in config.transport_rates)
        self._attempts: OrderedDict[bytes, int] = OrderedDict()
        self._queue: deque[object] = deque()  # requests waiting for admission, in order
        self._tick = asyncio.Event()  # set (and replaced) when a waiting request may fit

    # ------------------------------------------------------------------ admission

    async def admit(self, prompt: Prompt | None = None) -> int:
        """Wait for a running slot and, for a prompt, room for its KV; return the running
        count including this request.

        First come, first served, as a server's scheduler admits: a request waits while
        ``max_running`` requests run, or while the KV pinned by the running requests and its
        own prompt's would not fit the GPU tier (so the pool never overcommits; a prompt
        larger than the whole tier still runs when it runs alone). Waiting requests hold
        nothing: their prefixes can be evicted, and loaded back when they are admitted.
        """
        if not self._queue and self._fits(prompt):
            self.running += 1
            return self.running
        me = object()
        self._queue.append(me)
        self.queued += 1
        try:
            while not (self._queue[0] is me and self._fits(prompt)):
                await self._tick.wait()
        finally:
            self.queued -= 1
            head = self._queue[0] is me
            self._queue.remove(me)
            if head:
                self._wake()  # the next one may fit now
        self.running += 1
        return self.running

    def _fits(self, prompt: Prompt | None) -> bool:
        if self.running >= self.config.max_running:
            return False
        if prompt is None or self.running == 0:
            return True
        pool = self.pool
        return pool.pinned_tokens + pool.pin_cost(prompt) <= pool.capacity

    def _wake(self) -> None:
        """Let the waiting requests look again (in their order: the head goes first)."""
        tick, self._tick = self._tick, asyncio.Event()
        tick.set()

    def release(self, pinned: Prompt | None = None) -> None:
        """Free the running slot, and the KV pinned by ``generate(pin=True)`` if given."""
        self.running -= 1
        if pinned is not None:
            self.pool.unpin(pinned.chain, pinned.tokens)
        if self._queue:
            self._wake()

    def flush(self) -> None:
        self.pool.flush()

    # ------------------------------------------------------------------ generation

    def prepare(self, messages: Sequence[Mapping[str, Any]], tools_json: Any) -> tuple[Prompt, int]:
        """The request's prompt hash and how many times it was sent before (counts this one)."""
        tools_bytes = orjson.dumps(tools_json) if tools_json else b""
        prompt = hash_prompt(messages, tools_bytes)
        return prompt, self._attempt(prompt.digest)

    def prepare_digest(self, messages: Sequence[Mapping[str, Any]], tools_json: Any) -> bytes:
        """The conversation's prompt digest, as ``prepare`` hashes it (nothing counted)."""
        tools_bytes = orjson.dumps(tools_json) if tools_json else b""
        return hash_prompt(messages, tools_bytes).digest

    def transport_fault(
        self, prepared: tuple[Prompt, int], seed: int | None, stream: bool
    ) -> TransportFault | None:
        """This request's transport fault (seeded by conversation and send count), or None."""
        if not self.has_transport_faults:
            return None
        prompt, attempt = prepared
        seed_bytes = f"{self.config.seed}:{seed}".encode()
        rng = _seed(seed_bytes, prompt.digest, b"transport", str(attempt).encode())
        fault = draw_transport(self.config.transport_rates, rng, stream)
        if fault is not None:
            self.injected[fault.label] += 1
        return fault

    async def answer_time(self, gen: Generation) -> None:
        """Wait as long as the whole answer of ``gen`` takes: the prefill of its uncached
        prompt, then its tokens at the pace of the running batch."""
        uncached = gen.prompt_tokens - gen.cached_tokens
        per_token = self.latency.per_token(self.running)
        await asyncio.sleep(self.latency.ttft(uncached) + per_token * gen.completion_tokens)

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools_json: Any,
        in_flight: int,
        sampling: Sampling = Sampling(),
        *,
        prepared: tuple[Prompt, int] | None = None,
        corrupt: bool = True,
        pin: bool = False,
    ) -> Generation:
        """One chat turn. ``sampling.call_tools=False`` (``tool_choice: "none"``) answers in
        prose.

        ``prepared`` is ``prepare()``'s result when the caller already has it; ``corrupt=False``
        leaves the answer clean (a response that gets a transport fault carries no other).
        ``pin=True`` keeps the prompt's KV pinned until ``release(gen.pinned)``.
        """
        config = self.config
        max_tokens, seed, call_tools = sampling.max_tokens, sampling.seed, sampling.call_tools
        prompt, attempt = prepared or self.prepare(messages, tools_json)
        admission = self.pool.admit(prompt, pin=pin)
        cached = admission.cached_tokens
        seed_bytes = f"{config.seed}:{seed}".encode()
        rng = _seed(seed_bytes, prompt.digest)
        tools = parse_tools(tools_json) if call_tools else []
        turn = self.agent.next_turn(messages, tools, prompt, rng)
        if self.speaker.single_call and len(turn.calls) > 1:
            turn = replace(turn, calls=turn.calls[:1])
        if self.speaker.calls_only and turn.calls:
            turn = replace(turn, content="")
        limit = max_tokens or config.default_max_tokens
        thought = ""
        if config.reasoning != "off":  # a reasoning model: it thinks before it answers
            thought = sim_reasoning.think(turn.calls, _seed(seed_bytes, prompt.digest, b"think"))
            content_with = sim_reasoning.in_content(config.reasoning, thought, turn.content)
            if content_with != turn.content:
                turn, thought = replace(turn, content=content_with), ""

        fault_rng = _seed(seed_bytes, prompt.digest, b"fault", str(attempt).encode())
        kind = None
        cause: str | None = None
        if config.fault_rate is not None and not config.force_fault:
            # load-independent: every first send draws, alone or not; in deterministic mode a
            # re-send (the replay oracle's, --confirm's) gives the clean answer
            corrupt_now = corrupt and not (config.deterministic and attempt > 0)
        elif config.deterministic and in_flight <= 1 and not config.force_fault:
            corrupt_now = False  # alone: nothing races beside it, the answer is the clean one
        else:
            corrupt_now = corrupt
        if corrupt_now:
            odds = corruption_probability(
                in_flight,
                prompt.total,
                config.index_k,
                config.hicache,
                config.topk,
                config.fault_scale,
            )
            if not config.calibrated_race:
                odds = FaultOdds(0.0, odds.loop)
            loaded = admission.loaded_tokens
            if loaded:
                odds = odds.with_loadback(
                    loadback_probability(
                        loaded, in_flight - 1, config.index_k, config.hicache, config.fault_scale
                    )
                )
            if config.force_fault:
                cause, kind = "forced", config.force_fault
            elif config.fault_rate is not None:
                cause, kind = draw_at_rate(config.fault_rate, fault_rng)
            else:
                cause, kind = draw_cause(odds, fault_rng)
            if cause is not None:
                self.causes[cause] += 1
        hit_limit = False
        sp = self.speaker
        self.answers.remember(prompt.digest, _answer_message(turn.content, turn.calls))
        if kind is None:
            raw = sp.encode(turn.content, turn.calls)
        elif any("passkey" in c.arguments for c in turn.calls):
            # the race hits the read of a fact planted far back: a fluent call, a wrong id
            turn = replace(turn, calls=tuple(_misread(c, fault_rng) for c in turn.calls))
            raw, kind = sp.encode(turn.content, turn.calls), "recall"
        else:
            loop_limit = min(limit, config.default_max_tokens)
            maker = ArgMaker(fault_rng, Seen())
            done = inject(kind, turn, tools, fault_rng, maker, loop_limit, sp)
            raw, kind, hit_limit = done.raw, done.kind, done.hit_limit
        eos = sp.eos
        body = raw.removesuffix(eos) if eos else raw
        if estimate_tokens(body) > limit:
            raw = body = body[: limit * CHARS_PER_TOKEN]
            hit_limit = True
        parsed = sp.parse(raw, tools_json if call_tools and tools else None)
        parses = config.tool_parser == "on" and parsed.ok and parsed.calls
        if parses and not hit_limit:
            content: str | None = parsed.content or None
            calls = parsed.calls
            finish = "tool_calls"
        else:
            content, calls = body, ()
            finish = "length" if hit_limit else "stop"
        completion_tokens = max(1, estimate_tokens(body) + (1 if eos and raw.endswith(eos) else 0))
        ids = tuple(
            "call_" + hashlib.blake2b(prompt.digest + bytes([i]), digest_size=12).hexdigest()
            for i in range(len(calls))
        )

        answer_calls = [
            (c.name, orjson.dumps(c.arguments, option=orjson.OPT_SORT_KEYS).decode()) for c in calls
        ]
        data, n = message_key("assistant", content or "", answer_calls)
        self.pool.insert(prompt.extended(data, n))
        self.requests += 1
        self.prompt_tokens_total += prompt.total
        self.cached_tokens_total += cached
        self.last_hit_rate = cached / prompt.total if prompt.total else 0.0
        # a corrupted answer is one the draft model's guesses stop matching: acceptance drops
        seen = SPEC_CORRUPT if kind is not None else SPEC_ACCEPT
        self.accept_rate += SPEC_WEIGHT * (seen - self.accept_rate)
        self.generation_tokens_total += completion_tokens
        if corrupt:  # otherwise transport_fault() counted this response
            self.injected[kind or "none"] += 1
        if config.kv_canary and cause in RACES:  # a KV page overwritten
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
            log.warning("[%s.%03d] kv_canary violation: launch_tag=sim-%s fail_reason=guard "
                        "page overwritten (%d in flight)", stamp, int(time.time() * 1000) % 1000,
                        prompt.digest.hex()[:12], in_flight)  # fmt: skip
        spec = {None: SPEC_LENGTH_HEALTHY, "repetition": SPEC_LENGTH_LOOP}.get(
            kind, SPEC_LENGTH_CORRUPT
        )
        return Generation(
            raw=raw,
            content=content,
            calls=calls,
            call_ids=ids,
            finish_reason=finish,
            prompt_tokens=prompt.total,
            cached_tokens=cached,
            completion_tokens=completion_tokens,
            injected=kind or "none",
            loaded_tokens=admission.loaded_tokens,
            pinned=prompt if pin else None,
            reasoning=thought,
            spec_length=spec,
        )

    @staticmethod
    def meta_info(gen: Generation) -> dict[str, Any]:
        """SGLang's per-request ``meta_info`` with the speculative counters: verify steps,
        draft and accepted tokens (accept length = completion tokens / verify steps)."""
        steps = max(1, math.ceil(gen.completion_tokens / gen.spec_length))
        accepted = max(0, gen.completion_tokens - steps)
        return {
            "prompt_tokens": gen.prompt_tokens,
            "completion_tokens": gen.completion_tokens,
            "cached_tokens": gen.cached_tokens,
            "spec_verify_ct": steps,
            "spec_accept_token_num": accepted,
            "spec_draft_token_num": steps * SPEC_DRAFT,
        }

    def _attempt(self, digest: bytes) -> int:
        """How many times this exact conversation was sent before (re-sends differ)."""
        n = self._attempts.pop(digest, 0)
        self._attempts[digest] = n + 1
        if len(self._attempts) > 200_000:
            self._attempts.popitem(last=False)
        return n

    def metrics(self) -> dict[str, float]:
        """SGLang's names (``sglang:`` added by the app), with its semantics: ``cache_hit_rate``
        is the cached share of the last prefill, not a running total; HiCache's host tier in
        tokens; ``spec_accept_rate`` a moving mean of the speculative acceptance, which drops
        while answers come out corrupted (the collapse reported after HiCache load-backs)."""
        used = self.pool.gpu_tokens / self.config.kv_capacity
        out = {
            "num_running_reqs": self.running,
            "num_queue_reqs": self.queued,
            "token_usage": min(1.0, used),
            "cache_hit_rate": self.last_hit_rate,
            "cached_tokens_total": self.cached_tokens_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "generation_tokens_total": self.generation_tokens_total,
            "num_requests_total": self.requests,
            "spec_accept_rate": round(self.accept_rate, 6),
        }
        if self.config.hicache == "on":
            out["hicache_host_used_tokens"] = self.pool.host_tokens
            out["hicache_host_total_tokens"] = self.pool.host_capacity
        return out

    def pool_metrics(self) -> dict[str, float]:
        """The KV pool and the race's mechanism (exported as ``sim:*``)."""
        pool, c = self.pool, self.pool.counters
        return {
            "kv_capacity_tokens": pool.capacity,
            "kv_gpu_tokens": pool.gpu_tokens,
            "kv_host_tokens": pool.host_tokens,
            "kv_pinned_tokens": pool.pinned_tokens,
            "kv_evicted_tokens_total": c.evicted_tokens,
            "kv_dropped_tokens_total": c.dropped_tokens,
            "kv_recomputed_tokens_total": c.recomputed_tokens,
            "hicache_loadbacks_total": c.loadbacks,
            "hicache_loaded_tokens_total": c.loaded_tokens,
        }
