"""The simulator speaks every dialect with an encoder: clean turns parse back, damaged
envelopes do not read as the clean calls, and a server whose parser is off leaks the markup."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from harness.dialects import registry
from harness.dialects.base import ToolCall
from harness.errors import UsageError
from harness.sim import envelopes
from harness.sim.config import SimConfig
from harness.sim.speaker import DEFAULT_MODELS, speaker, spoken

CALLS = (
    ToolCall("read_file", {"path": "src/app.py", "limit": 40, "flags": ["a", "b"]}),
    ToolCall("search", {"query": "load_config"}),
)
TOOLS = [
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "required": ["path"], "properties": {
            "path": {"type": "string"}, "limit": {"type": "integer"},
            "flags": {"type": "array", "items": {"type": "string"}}}}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}}}},
]  # fmt: skip


def test_the_dialects_with_an_encoder_are_spoken() -> None:
    names = spoken()
    assert {"dsml-v4", "dsml-v32", "hermes"} <= set(names)
    assert not {"auto", "none", "json", "dsml"} & set(names)
    assert set(names) <= set(DEFAULT_MODELS)


@pytest.mark.parametrize("dialect", spoken())
def _calls(dialect: str) -> tuple[ToolCall, ...]:
    return CALLS[:1] if speaker(dialect).single_call else CALLS


def _text(dialect: str, text: str) -> str:
    """The content before the calls (none where the dialect writes the calls alone)."""
    return "" if speaker(dialect).calls_only else text


@pytest.mark.parametrize("dialect", spoken())
def test_the_sims_model_tells_its_dialect(dialect: str) -> None:
    # a run's --dialect auto finds the simulator's dialect from the model it serves
    assert registry.dialect_for_model(DEFAULT_MODELS[dialect]) == dialect


def test_single_call_dialects_are_known() -> None:
    assert speaker("hermes").single_call is False
    if "gpt-oss" in spoken():
        assert speaker("gpt-oss").single_call is True


@pytest.mark.parametrize("dialect", spoken())
def test_a_clean_turn_parses_back_to_its_calls(dialect: str) -> None:
    sp = speaker(dialect)
    raw = sp.encode(_text(dialect, "Reading the file."), _calls(dialect))
    parsed = sp.parse(raw, TOOLS)
    assert parsed.ok
    assert parsed.found
    assert list(parsed.calls) == list(_calls(dialect))
    assert sp.encode("An answer.", []).endswith(sp.eos)


@pytest.mark.parametrize("dialect", spoken())
def test_damaged_envelopes_never_read_as_the_clean_calls(dialect: str) -> None:
    sp = speaker(dialect)
    calls = _calls(dialect)
    content = _text(dialect, "Reading the file.")
    clean = sp.encode(content, calls)
    seen: Counter[str] = Counter()
    for seed in range(60):
        rng = random.Random(seed)
        for damage in (envelopes.broken_envelope, envelopes.broken_values):
            text = damage(envelopes.Written(sp, clean, content, calls, TOOLS), rng)
            if text is None:
                continue
            seen[damage.__name__] += 1
            parsed = sp.parse(text, TOOLS)
            assert not (parsed.ok and list(parsed.calls) == list(calls)), text
            # and the harness sees markup there, whichever dialect it expected
            seen_as_markup = registry.parse(text, dialect, tools=TOOLS).found
            assert seen_as_markup or any(c.name * 2 in text for c in calls), text
    assert seen["broken_envelope"] == 60
    assert seen["broken_values"] > 0


def test_every_envelope_mutation_applies_somewhere() -> None:
    used: Counter[str] = Counter()
    for dialect in spoken():
        sp = speaker(dialect)
        clean = sp.encode(_text(dialect, "Reading."), _calls(dialect))
        start = envelopes.markup_start(sp, clean, _text(dialect, "Reading."))
        for name, mutate in envelopes.mutations(sp.eos).items():
            if mutate(clean, start, _calls(dialect), random.Random(1)) not in (None, clean):
                used[name] += 1
    assert set(used) >= set(envelopes.mutations("")) - {"bars swapped"}


def test_an_unknown_dialect_is_a_usage_error_naming_the_choices() -> None:
    with pytest.raises(UsageError, match="hermes"):
        SimConfig(dialect="klingon")
    with pytest.raises(UsageError, match="tool_parser"):
        SimConfig(tool_parser="maybe")


BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "Investigate. Work in about 3 steps."}],
    "tools": TOOLS,
}


@pytest.mark.parametrize("parser", ["on", "off"])
def test_the_server_parses_or_leaks(parser: str, make_sim: Callable[..., str]) -> None:
    url = make_sim(dialect="hermes", tool_parser=parser, fault_scale=0.0)
    with httpx.Client(base_url=url, trust_env=False) as http:
        msg = http.post("/v1/chat/completions", json=BODY).json()["choices"][0]["message"]
        info = http.get("/server_info").json()
    if parser == "on":
        assert msg["tool_calls"]
        assert "<tool_call>" not in (msg["content"] or "")
        assert info["tool_call_parser"] == "hermes"
    else:
        assert msg["tool_calls"] is None
        assert "<tool_call>\n{" in msg["content"]
        assert info["tool_call_parser"] is None
