"""Pieces of the sim without HTTP: prefix cache, arguments, agent plan, admission queue."""

from __future__ import annotations

import asyncio
import random

import jsonschema
import pytest

from harness.dialects import dsml
from harness.errors import UsageError
from harness.sim.agent import Agent, extract, parse_tools
from harness.sim.args import ArgMaker, Seen
from harness.sim.cache import PrefixCache, estimate_tokens, hash_prompt
from harness.sim.config import SimConfig
from harness.sim.engine import Engine
from tests.sim.common import SCHEMAS, TOOLS, messages


def _msgs(*texts: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": t} for t in texts]


def test_prefix_cache_longest_prefix() -> None:
    cache = PrefixCache(10_000)
    a = hash_prompt(_msgs("a" * 400, "b" * 400), b"")
    cache.insert(a)
    longer = hash_prompt(_msgs("a" * 400, "b" * 400, "c" * 400), b"")
    assert cache.cached_tokens(longer) == a.total
    other = hash_prompt(_msgs("a" * 400, "x" * 400), b"")
    assert cache.cached_tokens(other) == a.cumulative[1]
    assert cache.cached_tokens(hash_prompt(_msgs("z"), b"")) == 0


def test_prefix_cache_evicts_leaves_first_within_capacity() -> None:
    first = hash_prompt(_msgs("a" * 4000, "b" * 4000), b"")
    cache = PrefixCache(first.total + 50)
    cache.insert(first)
    assert cache.tokens == first.total
    second = hash_prompt(_msgs("a" * 4000, "c" * 4000), b"")
    cache.insert(second)
    assert cache.tokens <= cache.capacity
    # the shared parent stays, the old leaf went
    assert cache.cached_tokens(first) == first.cumulative[1]
    assert cache.cached_tokens(second) == second.total
    cache.flush()
    assert cache.tokens == 0
    assert len(cache) == 0


def test_ids_do_not_change_the_hash() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
    one = [{"role": "assistant", "content": None, "tool_calls": [{"id": "x", **call}]}]
    call2 = {"type": "function", "function": {"name": "f", "arguments": '{"a":2,"b":1}'}}
    two = [{"role": "assistant", "content": "", "tool_calls": [{"id": "y", **call2}]}]
    assert hash_prompt(one, b"[]").digest == hash_prompt(two, b"[]").digest


def test_token_estimate() -> None:
    assert estimate_tokens("") == 0
    assert estimate_tokens("abcd" * 100) == 100


@pytest.mark.parametrize("seed", range(30))
def test_arguments_follow_schemas(seed: int) -> None:
    seen = Seen(files=["src/a.py", "src/b.py"], dirs=["src"], identifiers=["evict_entry"])
    maker = ArgMaker(random.Random(seed), seen)
    for name, schema in SCHEMAS.items():
        args = maker.arguments(name, schema)
        jsonschema.validate(args, schema)
    odd = {
        "type": "object",
        "properties": {
            "n": {"type": ["integer", "null"], "exclusiveMinimum": 5, "exclusiveMaximum": 9},
            "x": {"type": "number", "minimum": 0.5, "maximum": 0.75},
            "c": {"const": "fixed"},
            "u": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
            "s": {"type": "string", "minLength": 3, "maxLength": 5},
        },
        "required": ["n", "x", "c", "u", "s"],
    }
    jsonschema.validate(maker.arguments("odd", odd), odd)


def test_paths_come_from_results_and_are_not_reused() -> None:
    seen = Seen(files=["src/a.py", "src/b.py", "src/c.py"])
    maker = ArgMaker(random.Random(0), seen)
    picks = [maker.path(want_dir=False) for _ in range(3)]
    assert sorted(picks) == ["src/a.py", "src/b.py", "src/c.py"]
    assert maker.path(want_dir=True) == "src"


def test_extract_paths_and_identifiers() -> None:
    files, dirs, idents = extract(
        "see src/cache/pool.py:12 and ./tests/unit/ then http://x.org/a.html; EvictionPolicy "
        "calls load_layer_async, not dsml_parser"
    )
    assert "src/cache/pool.py" in files
    assert "tests/unit" in dirs
    assert "EvictionPolicy" in idents
    assert "load_layer_async" in idents
    assert all("dsml" not in i for i in idents)
    assert not any("x.org" in f for f in files)


def test_agent_plan_steps_then_final_answer() -> None:
    agent = Agent()
    tools = parse_tools(TOOLS)
    msgs = messages("Trace it. Work in about 2 steps.")
    kinds = []
    for turn in range(3):
        prompt = hash_prompt(msgs, b"t")
        out = agent.next_turn(msgs, tools, prompt, random.Random(turn))
        kinds.append(out.kind)
        if out.calls:
            msgs.append(
                {
                    "role": "assistant",
                    "content": out.content,
                    "tool_calls": [
                        {"id": str(i), "function": {"name": c.name, "arguments": "{}"}}
                        for i, c in enumerate(out.calls)
                    ],
                }
            )
            msgs.append({"role": "tool", "tool_call_id": "0", "content": "src/x/y.py Foo_bar"})
    assert kinds == ["calls", "calls", "final"]


def test_default_plan_is_twelve_steps() -> None:
    agent = Agent()
    tools = parse_tools(TOOLS)
    msgs = messages("No number here.")
    call = {"id": "1", "function": {"name": "list_dir", "arguments": '{"path": "."}'}}
    for n in (11, 12):
        history = list(msgs)
        for _ in range(n):
            history += [
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "1", "content": "ok"},
            ]
        out = agent.next_turn(history, tools, hash_prompt(history, b""), random.Random(0))
        assert out.kind == ("calls" if n == 11 else "final")


def test_clean_turns_parse_back() -> None:
    engine = Engine(SimConfig(fault_scale=0.0))
    msgs = messages("About 3 steps.")
    gen = engine.generate(msgs, TOOLS, 1)
    parsed = dsml.parse(gen.raw, "v4")
    assert parsed.ok
    assert parsed.eos
    assert parsed.noncanonical == ()
    assert parsed.calls == gen.calls
    assert gen.raw == dsml.encode_turn(parsed.content, parsed.calls)


async def test_admission_queues_beyond_max_running() -> None:
    engine = Engine(SimConfig(max_running=1))
    assert await engine.admit() == 1
    waiter = asyncio.create_task(engine.admit())
    await asyncio.sleep(0)
    assert engine.queued == 1
    assert engine.metrics()["num_queue_reqs"] == 1
    engine.release()
    assert await asyncio.wait_for(waiter, 5) == 1
    assert engine.queued == 0
    engine.release()
    assert engine.running == 0


@pytest.mark.parametrize(
    "bad",
    [
        {"index_k": "fp16"},
        {"hicache": "yes"},
        {"topk": "v3"},
        {"speed": 0},
        {"force_fault": "gibberish"},
        {"max_running": 0},
    ],
)
def test_config_rejects_bad_values(bad: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        SimConfig(**bad)  # type: ignore[arg-type]
