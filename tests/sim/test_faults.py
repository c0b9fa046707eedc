"""The fault model: calibration, and every corruption kind looks corrupted."""

from __future__ import annotations

import random
import re
import zlib
from collections import Counter
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from harness.analysis.stats import wilson
from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.sim.config import FAULT_KINDS, SimConfig
from harness.sim.engine import Engine, Generation, Sampling
from harness.sim.faults import (
    RATE_KINDS,
    FaultOdds,
    corruption_probability,
    draw,
    draw_at_rate,
    expected_session_rate,
    schedule,
)
from harness.sim.inject import ENVELOPE_MUTATIONS
from tests.sim.common import SCHEMAS, TOOLS, chat, follow, messages, tool_result

SPECIAL = ("</think>", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<|im_start|>", "\ufffd")
SCRIPTS = {
    "cyrillic": r"[\u0400-\u04ff]",
    "cjk": r"[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af]",
    "arabic": r"[\u0600-\u06ff]",
    "greek": r"[\u0370-\u03ff]",
    "hebrew": r"[\u0590-\u05ff]",
    "thai": r"[\u0e00-\u0e7f]",
    "devanagari": r"[\u0900-\u097f]",
}


def n_scripts(text: str) -> int:
    return sum(1 for pattern in SCRIPTS.values() if re.search(pattern, text))


def looks_salad(text: str) -> bool:
    glued = re.search(r"[a-z][\u0400-\u04ff\u4e00-\u9fff\u0600-\u06ff]", text) is not None
    return n_scripts(text) >= 2 or glued or any(t in text for t in SPECIAL) or _ident_soup(text)


def _ident_soup(text: str) -> bool:
    return len(re.findall(r"[a-z][A-Z]{2,}|[a-z]{2,}[A-Z][a-z]+[A-Z]", text)) >= 3


def looks_loop(text: str) -> bool:
    tail = text[len(text) // 3 :].encode()
    return len(tail) > 200 and len(zlib.compress(tail)) / len(tail) < 0.25


# ----------------------------------------------------------------------------- calibration


def test_session_rate_calibrated_for_the_incident() -> None:
    """80 in flight, 28 turns from 2k to 80k tokens: the production setting corrupts 15-20%."""
    bf16 = expected_session_rate(80, 28, 2_000, 80_000, index_k="bf16", hicache="on")
    assert 0.15 <= bf16 <= 0.20
    assert expected_session_rate(80, 28, 2_000, 80_000, index_k="fp8", hicache="on") == 0.0


def test_session_rate_by_factor() -> None:
    off_60 = expected_session_rate(60, hicache="off")
    assert 0.0 < off_60 <= 0.06  # only the long-context loop signature
    assert expected_session_rate(60, end_tokens=40_000, hicache="off") == 0.0
    for topk in ("v1", "v2"):
        assert expected_session_rate(80, topk=topk) == expected_session_rate(80)
    # lower load, lower rate; short sessions, lower rate
    assert expected_session_rate(20) < expected_session_rate(60) < expected_session_rate(80)
    assert expected_session_rate(80, end_tokens=20_000) < 0.05


def test_probability_is_a_manual_sum_of_the_schedule() -> None:
    tokens = schedule(28, 2_000, 80_000)
    assert tokens[0] == 2_000
    assert tokens[-1] == 80_000
    clean = 1.0
    for t in tokens:
        clean *= 1 - corruption_probability(80, t).total
    assert expected_session_rate(80) == pytest.approx(1 - clean)


def test_probability_grows_with_load_and_context() -> None:
    p = [corruption_probability(n, 50_000).race for n in (1, 20, 40, 60, 80)]
    assert p == sorted(p)
    assert p[0] < p[-1] / 100
    q = [corruption_probability(80, t).race for t in (2_000, 20_000, 80_000)]
    assert q == sorted(q)
    odds = corruption_probability(80, 80_000, index_k="fp8")
    assert odds == FaultOdds(0.0, 0.0)
    assert corruption_probability(80, 30_000, hicache="off") == FaultOdds(0.0, 0.0)
    assert corruption_probability(80, 60_000, hicache="off").loop > 0


def test_draw_follows_the_odds() -> None:
    rng = random.Random(1)
    kinds = Counter(draw(FaultOdds(race=0.2, loop=0.1), rng) for _ in range(5000))
    assert 0.17 < (5000 - kinds[None] - kinds["repetition"]) / 5000 < 0.23
    assert kinds["salad"] > kinds["schema"] > 0
    assert 0.08 < kinds["repetition"] / 5000 < 0.15  # loop plus the race's own loops
    assert all(draw(FaultOdds(0.0, 0.0), rng) is None for _ in range(1000))


def test_empirical_session_rate_matches_analytic() -> None:
    """Engine-level sessions at 80 in flight: the measured rate agrees with the formula."""
    engine = Engine(SimConfig(seed=3, fault_scale=4.0))
    expected = expected_session_rate(80, 12, 2_000, 80_000, scale=4.0)
    hit = 0
    sessions = 150
    for s in range(sessions):
        msgs = messages(f"Session {s}: trace the race. About 20 steps.")
        corrupted = False
        for turn, tokens in enumerate(schedule(12, 2_000, 80_000)):
            msgs[0]["content"] = "x" * (tokens * 4)  # grow the prompt as the schedule says
            gen = engine.generate(msgs, TOOLS, 80, Sampling(1024))
            corrupted |= gen.injected != "none"
            if not gen.calls:
                break
            follow(msgs, as_message(gen), turn)
        hit += corrupted
    assert abs(hit / sessions - expected) < 0.12


# ----------------------------------------------------------------------------- the kinds


def as_message(gen: Generation) -> dict[str, Any]:
    """The OpenAI assistant message a client would build from a generation."""
    calls = [
        {"id": i, "function": {"name": c.name, "arguments": orjson.dumps(c.arguments).decode()}}
        for i, c in zip(gen.call_ids, gen.calls, strict=True)
    ]
    return {"content": gen.content, "tool_calls": calls}


def _session(kind: str, seed: int) -> tuple[Generation, Generation]:
    """(clean, forced-fault) generations of the same turn, a few turns into a session."""
    engine = Engine(SimConfig(seed=seed, fault_scale=0.0))
    forced = Engine(SimConfig(seed=seed, force_fault=kind))
    msgs = messages()
    for turn in range(seed % 3):
        gen = engine.generate(msgs, TOOLS, 1, Sampling(1024))
        follow(msgs, as_message(gen), turn)
    short = Sampling(512)
    return engine.generate(msgs, TOOLS, 1, short), forced.generate(msgs, TOOLS, 80, short)


def _session_engine(kind: str, seed: int) -> tuple[str, Generation]:
    """Raw text and generation of a forced fault, a few turns into a session."""
    gen = _session(kind, seed)[1]
    return gen.raw, gen


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("kind", ["salad", "envelope", "json", "repetition"])
def test_raw_output_of_broken_kinds_fails_to_parse(kind: str, seed: int) -> None:
    raw, gen = _session_engine(kind, seed)
    # a turn whose tools take only strings cannot carry broken JSON: an envelope fault instead
    assert gen.injected == kind or (kind, gen.injected) == ("json", "envelope")
    result = dsml.parse(raw, "v4")
    assert not (result.ok and result.calls)
    assert gen.calls == ()
    assert gen.finish_reason in ("stop", "length")
    if kind == "salad":
        assert looks_salad(raw[len(raw) // 2 :])
    if kind == "repetition":
        assert gen.finish_reason == "length"
        assert looks_loop(raw)
    if kind in ("envelope", "json"):
        assert result.found  # DSML-like text is there, just broken
        assert dsml.find_fragment(gen.content) is not None


def _takes_non_strings(name: str) -> bool:
    props = SCHEMAS[name]["properties"]
    return any(p.get("type") not in ("string", None) for p in props.values())


@pytest.mark.parametrize("seed", range(12))
def test_json_kind_breaks_json_when_the_turn_can_carry_it(seed: int) -> None:
    clean, forced = _session("json", seed)
    if any(_takes_non_strings(c.name) for c in clean.calls):
        assert forced.injected == "json"
        assert "not valid JSON" in (dsml.parse(forced.raw, "v4").error or "")
    else:
        assert forced.injected == "envelope"


@pytest.mark.parametrize("seed", range(12))
def test_schema_kind_violates_the_declared_schema(seed: int) -> None:
    raw, gen = _session_engine("schema", seed)
    result = dsml.parse(raw, "v4")
    assert result.ok
    assert gen.calls
    call = gen.calls[0]
    assert gen.finish_reason == "tool_calls"
    if call.name in SCHEMAS:
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(call.arguments, SCHEMAS[call.name])


@pytest.mark.parametrize("seed", range(12))
def test_debris_kind_leaves_special_tokens(seed: int) -> None:
    _, gen = _session_engine("debris", seed)
    assert any(t in (gen.content or "") for t in SPECIAL)
    assert looks_salad(gen.content or "")


def test_envelope_mutations_all_break_the_parse() -> None:
    clean = dsml.encode_turn(
        "Checking.",
        [ToolCall("read_file", {"path": "a.py", "max_lines": 5})],
    )
    rng = random.Random(0)
    for name, mutate in ENVELOPE_MUTATIONS.items():
        text = mutate(clean, rng)
        assert text != clean, name
        assert not dsml.parse(text, "v4").ok, name


def test_salad_is_varied() -> None:
    outs = {_session_engine("salad", seed)[0][-300:] for seed in range(10)}
    assert len(outs) == 10
    mixed = [n_scripts(o) for o in outs]
    assert max(mixed) >= 3


# ----------------------------------------------------------------------------- over HTTP


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_forced_fault_over_http(make_sim: Callable[..., str], kind: str) -> None:
    url = make_sim(force_fault=kind, seed=5)
    msgs = messages()
    with httpx.Client(base_url=url) as client:
        r = chat(client, msgs)
        streamed = chat(client, msgs, stream=True)
    # the first turn only lists the root (string arguments): broken JSON becomes an envelope
    assert r.headers["x-sim-injected"] == (kind if kind != "json" else "envelope")
    assert streamed.headers["x-sim-injected"] in FAULT_KINDS
    choice = r.json()["choices"][0]
    content = choice["message"]["content"] or ""
    if kind in ("salad", "envelope", "json", "repetition"):
        assert choice["message"]["tool_calls"] is None
        assert not dsml.parse(content, "v4").ok or looks_loop(content) or looks_salad(content)
    if kind == "schema":
        call = choice["message"]["tool_calls"][0]["function"]
        args = orjson.loads(call["arguments"])
        bad = call["name"] not in SCHEMAS
        if not bad:
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(args, SCHEMAS[call["name"]])
    if kind == "debris":
        assert any(t in content for t in SPECIAL)


def test_clean_config_never_injects(make_sim: Callable[..., str]) -> None:
    url = make_sim(index_k="fp8", fault_scale=50.0)
    msgs = messages("Long one. About 30 steps.")
    with httpx.Client(base_url=url) as client:
        for turn in range(6):
            msgs[0]["content"] = tool_result(turn) * 2000  # ~40k tokens of context
            r = chat(client, msgs)
            assert r.headers["x-sim-injected"] == "none"
            follow(msgs, r.json()["choices"][0]["message"], turn)


def test_deterministic_mode_alone_equals_under_load_except_where_the_race_hits() -> None:
    """--enable-deterministic-inference: alone never corrupted; under load, a clean answer is
    the lone answer exactly and only an injected one differs."""
    engine = Engine(SimConfig(seed=5, fault_scale=9600.0, deterministic=True))
    injected = 0
    for s in range(60):
        msgs = messages(f"Session {s}: trace the race. About 20 steps.")
        msgs[0]["content"] = "x" * 120_000
        loaded = engine.generate(msgs, TOOLS, 80, Sampling(1024))
        alone = engine.generate(msgs, TOOLS, 1, Sampling(1024))
        assert alone.injected == "none"
        injected += loaded.injected != "none"
        assert (loaded.raw == alone.raw) == (loaded.injected == "none")
    assert injected > 5


# ----------------------------------------------------------------------------- --fault-rate


def _rate_run(config: SimConfig, sessions: int, in_flight: int, context: int) -> list[str]:
    """The injected kind of one first send per conversation (``"none"`` when clean)."""
    engine = Engine(config)
    kinds = []
    for s in range(sessions):
        msgs = messages(f"Session {s}: find the stale cache entry. About 12 steps.")
        msgs[0]["content"] = "x" * context
        kinds.append(engine.generate(msgs, TOOLS, in_flight, Sampling(512)).injected)
    return kinds


@pytest.mark.parametrize(("in_flight", "context"), [(1, 100), (200, 200_000)])
def test_fault_rate_is_the_share_injected_whatever_the_load(in_flight: int, context: int) -> None:
    """--fault-rate P: P of the responses corrupted, alone or beside 200 others, short
    context or long, with the race's odds (fp8: none) out of the picture."""
    rate, n = 0.05, 1200
    kinds = _rate_run(SimConfig(seed=3, index_k="fp8", fault_rate=rate), n, in_flight, context)
    hits = sum(k != "none" for k in kinds)
    lo, hi = wilson(hits, n, 0.999)
    assert lo <= rate <= hi, hits
    assert {k for k in kinds if k != "none"} <= set(RATE_KINDS) | {"recall", "envelope"}


def test_fault_rate_is_deterministic_given_the_seed() -> None:
    config = SimConfig(seed=11, fault_rate=0.1)
    first = _rate_run(config, 300, 40, 100)
    assert _rate_run(config, 300, 40, 100) == first
    assert _rate_run(SimConfig(seed=12, fault_rate=0.1), 300, 40, 100) != first
    # zero is zero, even where the load-dependent odds would fire (80 in flight, 120k tokens)
    assert set(_rate_run(SimConfig(fault_rate=0.0, fault_scale=9600.0), 40, 80, 480_000)) == {
        "none"
    }


def test_fault_rate_in_deterministic_mode_a_resend_gives_the_clean_answer() -> None:
    """The replay oracle's ground truth: a first send draws at the rate, alone or not; its
    re-send gives the clean answer, equal to the first where that was clean."""
    engine = Engine(SimConfig(seed=5, fault_rate=0.3, deterministic=True))
    injected = 0
    for s in range(40):
        msgs = messages(f"Session {s}: trace the race. About 20 steps.")
        first = engine.generate(msgs, TOOLS, 1 + s % 2, Sampling(1024))
        again = engine.generate(msgs, TOOLS, 1, Sampling(1024))
        assert again.injected == "none"
        injected += first.injected != "none"
        assert (first.raw == again.raw) == (first.injected == "none")
    assert injected >= 5


def test_draw_at_rate_draws_every_kind_by_its_weight() -> None:
    rng = random.Random(4)
    kinds = Counter(draw_at_rate(1.0, rng)[1] for _ in range(20_000))
    assert set(kinds) == set(RATE_KINDS)
    for kind, weight in RATE_KINDS.items():
        assert kinds[kind] / 20_000 == pytest.approx(weight, abs=0.015)
    assert draw_at_rate(0.0, rng) == (None, None)


@pytest.mark.parametrize("seed", range(12))
def test_soup_is_short_cross_script_debris_at_the_end(seed: int) -> None:
    clean, soup = _session("soup", seed)
    assert soup.injected == "soup"
    assert soup.calls == ()
    text = soup.content or ""
    body = dsml.encode_turn(clean.content or "", clean.calls).removesuffix(dsml.EOS)
    common = next((i for i, (a, b) in enumerate(zip(text, body, strict=False)) if a != b), 0)
    assert 20 <= len(text) - common <= 160  # the soup itself is short
    assert len(text) < len(body) + 120
