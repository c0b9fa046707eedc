"""The KV pool: eviction to the host tier, load-backs, pinning; the load-back race odds."""

from __future__ import annotations

import asyncio
from typing import Any

from harness.sim.cache import hash_prompt
from harness.sim.config import SimConfig
from harness.sim.engine import Engine, Sampling
from harness.sim.faults import loadback_probability, overlap
from harness.sim.kvpool import KVPool
from tests.sim.common import TOOLS, follow, messages


def _prompt(tag: str, n_messages: int = 3, size: int = 400) -> Any:
    msgs = [{"role": "user", "content": f"{tag} {i} " + "x" * size} for i in range(n_messages)]
    return hash_prompt(msgs, b"")


def test_fits_never_evicts() -> None:
    pool = KVPool(capacity=10_000, host_capacity=20_000)
    a, b = _prompt("a"), _prompt("b")
    assert pool.admit(a).computed_tokens == a.total
    pool.admit(b)
    again = pool.admit(a)
    assert again.gpu_tokens == a.total
    assert again.loaded_tokens == 0
    assert pool.counters.evicted_tokens == 0


def test_evicted_prefix_is_loaded_back_from_host_with_hicache() -> None:
    a, b = _prompt("a"), _prompt("b")
    pool = KVPool(capacity=a.total + 10, host_capacity=10 * a.total)
    pool.admit(a)
    pool.admit(b)  # a is evicted to the host tier, leaf first
    assert pool.counters.evicted_tokens >= a.total
    back = pool.admit(a)
    assert back.loaded_tokens == a.total
    assert back.gpu_tokens == 0
    assert back.cached_tokens == a.total
    assert pool.counters.loadbacks == 1
    assert pool.counters.loaded_tokens == a.total


def test_without_host_tier_evicted_prefix_is_recomputed() -> None:
    a, b = _prompt("a"), _prompt("b")
    pool = KVPool(capacity=a.total + 10, host_capacity=0)
    pool.admit(a)
    pool.admit(b)
    back = pool.admit(a)
    assert back.loaded_tokens == 0
    assert back.cached_tokens == 0
    assert back.computed_tokens == a.total
    assert pool.counters.recomputed_tokens == a.total
    assert pool.counters.dropped_tokens >= a.total


def test_partial_eviction_eats_the_tail_first() -> None:
    a = _prompt("a", n_messages=4)
    b = _prompt("b", n_messages=1)
    pool = KVPool(capacity=a.total + b.total - a.tokens[-1] // 2, host_capacity=10 * a.total)
    pool.admit(a)
    pool.admit(b)
    found = pool.match(a)
    assert found.gpu_tokens == a.cumulative[-2]  # the root part stayed on the GPU
    assert found.loaded_tokens == a.tokens[-1]


def test_pinned_entries_are_not_evicted_and_finishing_makes_them_recent() -> None:
    a, b, c = _prompt("a"), _prompt("b"), _prompt("c")
    pool = KVPool(capacity=a.total + b.total + 10, host_capacity=10 * a.total)
    pool.admit(a, pin=True)
    pool.admit(b)
    pool.admit(c)  # a is the oldest but pinned: b goes
    assert pool.match(a).gpu_tokens == a.total
    assert pool.match(b).loaded_tokens == b.total
    pool.unpin(a.chain, a.tokens)
    assert pool.pinned_tokens == 0
    pool.admit(b)  # now c is the least recent (a was touched when it finished)
    assert pool.match(a).gpu_tokens == a.total
    assert pool.match(c).gpu_tokens == 0


def test_host_tier_is_bounded() -> None:
    prompts = [_prompt(str(i)) for i in range(6)]
    size = prompts[0].total
    pool = KVPool(capacity=size + 10, host_capacity=2 * size + 10)
    for p in prompts:
        pool.admit(p)
    assert pool.host_tokens <= 2 * size + 10
    assert pool.match(prompts[0]).cached_tokens == 0  # fell off the host tier too
    assert pool.match(prompts[-2]).loaded_tokens == size


def test_loadback_odds() -> None:
    assert loadback_probability(40_000, 60, index_k="fp8") == 0.0
    assert loadback_probability(40_000, 60, hicache="off") == 0.0
    assert loadback_probability(0, 60) == 0.0
    small, big = loadback_probability(5_000, 60), loadback_probability(60_000, 60)
    assert 0.0 < small < big
    assert loadback_probability(60_000, 2) < loadback_probability(60_000, 60)
    assert overlap(0) == 0.0
    assert 0.9 < overlap(80) < 1.0


def _turns(engine: Engine, sessions: int, turns: int, pad: int) -> int:
    """Round-robin sessions through one engine (pinned while running, like the HTTP app)."""
    convs = [messages(f"Session {s}: trace the race. About 30 steps.") for s in range(sessions)]
    injected = 0
    for turn in range(turns):
        for s, msgs in enumerate(convs):
            engine.running += 1
            gen = engine.generate(msgs, TOOLS, sessions, Sampling(1024, 7), pin=True)
            engine.release(gen.pinned)
            injected += gen.injected != "none"
            calls = _calls(gen) or [
                {"id": "x", "function": {"name": "list_dir", "arguments": "{}"}}
            ]
            follow(msgs, {"content": gen.content, "tool_calls": calls}, turn)
            msgs[-1]["content"] += f"session {s} turn {turn} " + "y" * pad * 4  # grow
    return injected


def _calls(gen: Any) -> list[dict[str, Any]]:
    import orjson

    return [
        {"id": i, "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
        for i, c in zip(gen.call_ids, gen.calls, strict=True)
    ]


def test_engine_races_only_on_load_backs() -> None:
    """Engine level: a small pool under pressure loads back and races with bf16 only."""
    kw = {"calibrated_race": False, "fault_scale": 400.0, "seed": 1}
    fits = Engine(SimConfig(kv_capacity=10_000_000, **kw))
    assert _turns(fits, 8, 6, 2_000) == 0
    assert fits.pool.counters.loadbacks == 0
    tight = Engine(SimConfig(kv_capacity=40_000, **kw))
    hits = _turns(tight, 8, 6, 2_000)
    assert tight.pool.counters.loadbacks > 10
    assert hits >= 3
    assert tight.causes["loadback"] == hits
    fp8 = Engine(SimConfig(kv_capacity=40_000, index_k="fp8", **kw))
    assert _turns(fp8, 8, 6, 2_000) == 0
    assert fp8.pool.counters.loadbacks > 10
    off = Engine(SimConfig(kv_capacity=40_000, hicache="off", **kw))
    assert _turns(off, 8, 6, 2_000) == 0
    assert off.pool.counters.loadbacks == 0
    assert off.pool.counters.recomputed_tokens > 0


async def test_admission_waits_for_room_to_pin() -> None:
    """A request waits while the running requests' pinned KV and its own would not fit the
    GPU tier, first come first served; a shared prefix already pinned counts once; a prompt
    larger than the whole tier runs when it is alone."""
    a, b, c = _prompt("a", size=2400), _prompt("b", size=2400), _prompt("c", size=400)
    engine = Engine(SimConfig(kv_capacity=a.total + a.total // 2, calibrated_race=False))
    pool = engine.pool
    assert await engine.admit(a) == 1
    pool.admit(a, pin=True)
    assert pool.pin_cost(a) == 0  # a's KV is pinned already: a second a costs nothing more
    assert await engine.admit(a) == 2
    pool.admit(a, pin=True)
    big = asyncio.create_task(engine.admit(b))  # a and b together overflow the tier
    small = asyncio.create_task(engine.admit(c))  # c would fit, but b came first
    await asyncio.sleep(0.01)
    assert (engine.queued, big.done(), small.done()) == (2, False, False)
    assert engine.metrics()["num_queue_reqs"] == 2
    engine.release(a)
    await asyncio.sleep(0.01)
    assert not big.done()  # one request still holds a
    engine.release(a)
    assert await asyncio.wait_for(big, 5) == 1
    pool.admit(b, pin=True)
    assert await asyncio.wait_for(small, 5) == 2  # b and c fit together
    pool.admit(c, pin=True)
    assert pool.pinned_tokens <= pool.capacity
    engine.release(b)
    engine.release(c)
    huge = _prompt("huge", size=40_000)
    assert huge.total > pool.capacity
    assert await asyncio.wait_for(engine.admit(huge), 5) == 1  # alone: it runs
    engine.release()
    assert (engine.running, engine.queued, pool.pinned_tokens) == (0, 0, 0)


async def test_a_waiting_request_that_gives_up_leaves_the_queue() -> None:
    a, b, c = _prompt("a", size=2400), _prompt("b", size=2400), _prompt("c", size=400)
    engine = Engine(SimConfig(kv_capacity=a.total + a.total // 2, calibrated_race=False))
    await engine.admit(a)
    engine.pool.admit(a, pin=True)
    head = asyncio.create_task(engine.admit(b))
    behind = asyncio.create_task(engine.admit(c))
    await asyncio.sleep(0.01)
    head.cancel()  # the client went away while its request waited
    assert await asyncio.wait_for(behind, 5) == 2  # c fits beside a: it goes next
    assert engine.queued == 0
