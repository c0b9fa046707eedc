"""Teacher-forced scoring against the simulator's SGLang and vLLM shapes (a real server on a
loopback port), and the simulator's scoring model: its own answers are likely, a corrupted
answer is not, the race perturbs the scores of requests under load and says so."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from harness.client.scoring import (
    Scorer,
    ScoringFailed,
    _ids,
    common_prefix,
    detect_api,
    gbnf_tokens,
)
from harness.errors import UsageError
from harness.sim import scoring as sim_scoring

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
MESSAGES = [
    {"role": "system", "content": "You are a helpful agent."},
    {"role": "user", "content": "List the files in the current folder, please."},
]


def _chat(url: str) -> dict[str, Any]:
    body = {"model": "sim", "messages": MESSAGES, "tools": TOOLS, "stream": False, "seed": 3}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    resp.raise_for_status()
    message: dict[str, Any] = resp.json()["choices"][0]["message"]
    return {k: message.get(k) for k in ("role", "content", "tool_calls")}


async def _score_reply(
    url: str, api: Any, reply: dict[str, Any]
) -> tuple[list[float], list[int], int, list[float]]:
    """(logprobs, ids, where the reply starts, each token's gap below the model's first
    choice in nats)."""
    async with Scorer(url, api) as scorer:
        ids, start = await scorer.chat_ids(MESSAGES, TOOLS, reply)
        got = await scorer.score(ids[:start], ids[start:], "", top_k=3)
    assert got.ids == tuple(ids[start:])
    assert got.top is not None
    assert all(len(t) >= 3 for t in got.top)
    if api == "vllm":  # vLLM's entry holds the token given beside the top-k
        assert all(tid in t for tid, t in zip(got.ids, got.top, strict=True))
    gaps = [max(t.values()) - lp for t, lp in zip(got.top, got.logprobs, strict=True)]
    return list(got.logprobs), ids, start, gaps


def test_tokenizer_round_trips_text_and_special_tokens() -> None:
    text = "<｜begin▁of▁sentence｜>héllo  wörld, `rm -rf /tmp/x` 🙂<｜Assistant｜></think>"
    ids = sim_scoring.tokenize(text)
    assert sim_scoring.detokenize(ids) == text
    assert sim_scoring.SPECIAL_IDS["<｜Assistant｜>"] in ids


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_own_answer_is_likely_and_a_changed_argument_is_not(
    make_sim: Callable[..., str], api: str
) -> None:
    url = make_sim(index_k="fp8")
    reply = _chat(url)
    assert reply["tool_calls"], reply
    own, ids, start, own_gaps = asyncio.run(_score_reply(url, api, reply))
    assert len(own) == len(ids) - start > 5
    assert sum(own) / len(own) > -0.5  # the model's own answer: likely
    assert max(own_gaps) == 0.0  # every token its first choice
    changed = {**reply, "tool_calls": [dict(reply["tool_calls"][0])]}
    fn = dict(changed["tool_calls"][0]["function"])
    fn["arguments"] = '{"command": "echo \\"repro\\""}'
    changed["tool_calls"][0]["function"] = fn
    other, _, _, other_gaps = asyncio.run(_score_reply(url, api, changed))
    assert min(other) < -4.0  # tokens it would not write: unlikely
    assert max(other_gaps) > 3.0  # and far below its first choice there
    # the same text scored twice alone: the same values but for the alone noise
    again, _, _, _ = asyncio.run(_score_reply(url, api, reply))
    assert max(abs(a - b) for a, b in zip(own, again, strict=True)) < 1e-2


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_detokenize_gives_the_text_back(make_sim: Callable[..., str], api: str) -> None:
    text = "héllo  wörld, `rm -rf /tmp/x` 🙂"

    async def go() -> str:
        async with Scorer(make_sim(index_k="fp8"), api) as scorer:  # type: ignore[arg-type]
            return await scorer.detokenize(await scorer.tokenize(text))

    assert asyncio.run(go()) == text
    bad = httpx.post(make_sim(index_k="fp8") + "/detokenize", json={"tokens": "x"}, timeout=10)
    assert bad.status_code == 400
    assert "tokens" in bad.json()["error"]["message"]


def test_sglang_and_vllm_shapes_agree(make_sim: Callable[..., str]) -> None:
    url = make_sim(index_k="fp8")

    async def both() -> tuple[list[float], list[float]]:
        out = []
        for api in ("sglang", "vllm"):
            async with Scorer(url, api) as scorer:  # type: ignore[arg-type]
                ids = await scorer.tokenize("The quick brown fox jumps over the lazy dog.")
                got = await scorer.score(ids[:3], ids[3:], "")
                out.append(list(got.logprobs))
        return out[0], out[1]

    a, b = asyncio.run(both())
    assert len(a) == len(b) > 3
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-2


def test_race_perturbs_scores_under_load_with_ground_truth(make_sim: Callable[..., str]) -> None:
    url = make_sim(index_k="bf16", hicache="on", fault_scale=2.0, max_running=256, speed=2.0)
    text = "word " * 4000  # a long context: more exposed

    async def under_load() -> list[tuple[str | None, float]]:
        async with Scorer(url, "sglang") as scorer:
            ids = await scorer.tokenize(text)
            alone = await scorer.score(ids[:10], ids[10:], "")
            assert alone.injected == "none"

            async def one() -> tuple[str | None, float]:
                got = await scorer.score(ids[:10], ids[10:], "")
                dev = max(abs(x - y) for x, y in zip(got.logprobs, alone.logprobs, strict=True))
                return got.injected, dev

            # 4 connections: the rest wait in the client; hold the server busy meanwhile
            busy = [asyncio.create_task(_hold(url)) for _ in range(90)]
            await asyncio.sleep(0.2)
            rows = [await one() for _ in range(30)]
            for task in busy:
                task.cancel()
            return rows

    rows = asyncio.run(under_load())
    raced = [dev for inj, dev in rows if inj == "logprob_race"]
    clean = [dev for inj, dev in rows if inj == "none"]
    assert raced
    assert clean
    assert min(raced) > 0.3
    assert max(clean) < 0.05


async def _hold(url: str) -> None:
    """Chat requests one after the other: a running slot on the simulator until cancelled."""
    body = {"model": "sim", "messages": MESSAGES, "stream": False}
    async with httpx.AsyncClient(timeout=60) as http:
        while True:
            await http.post(url + "/v1/chat/completions", json=body)


def test_errors_are_clear(make_sim: Callable[..., str]) -> None:
    url = make_sim()

    async def go() -> None:
        async with Scorer(url, "sglang") as scorer:
            with pytest.raises(UsageError, match="at least one token"):
                await scorer.score([], [1], "")
            with pytest.raises(ScoringFailed, match="HTTP 400"):
                await scorer.score([0], [1], "")

    asyncio.run(go())
    with pytest.raises(UsageError, match="unknown scoring API"):
        Scorer(url, "tgi")  # type: ignore[arg-type]
    assert asyncio.run(detect_api(url)) == "sglang"


def test_gbnf_tokens() -> None:
    assert gbnf_tokens([1550, 260]) == "root ::= <[1550]> <[260]>"


def test_a_deleted_token_makes_the_next_one_unlikely() -> None:
    ref = [11, 12, 13, 14, 15, 16]
    assert sim_scoring.expected_mask(ref, ref) == [True] * 6
    assert sim_scoring.expected_mask([11, 12, 14, 15, 16], ref) == [True, True, False, True, True]
    assert sim_scoring.expected_mask([11, 99, 13], ref) == [True, False, False]
    assert sim_scoring.expected_mask([1, 2], None) == [None, None]


def test_common_prefix_against_the_item_by_item_count() -> None:
    def slow(a: list[int], b: list[int]) -> int:
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        return n

    base = list(range(100, 1100))
    cases = [([], base), (base, base), (base, [*base, 7]), ([*base, 7], base), ([1], [2])]
    cases += [(base, [*base[:k], -1, *base[k + 1 :]]) for k in (0, 1, 499, 998, 999)]
    for a, b in cases:
        assert common_prefix(a, b) == slow(a, b)


def test_token_ids_are_checked() -> None:
    """A tokenizer answer that is not a list of integers is a clear failure; big integers
    (past 64 bits) are still integers."""
    assert _ids([1, 2**70]) == [1, 2**70]
    for bad in ([1, 2.0], [1, "2"], [None], {"a": 1}, None):
        with pytest.raises(ScoringFailed, match="no list of token ids"):
            _ids(bad)
