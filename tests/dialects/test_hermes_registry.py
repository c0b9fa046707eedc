"""The Hermes dialect and the registry's auto detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import dsml, hermes, registry
from harness.dialects.base import ToolCall
from harness.dialects.markup import NC_NEWLINES
from harness.errors import UsageError

CALLS = [ToolCall("get_weather", {"city": "Tokyo"}), ToolCall("get_time", {})]
GOOD = hermes.encode_turn("Checking both.", CALLS)


def test_canonical_turn_parses() -> None:
    result = hermes.parse(GOOD)
    assert result.ok
    assert result.found
    assert list(result.calls) == CALLS
    assert result.content == "Checking both."
    assert result.noncanonical == ()
    assert result.dialect == "hermes"


_ARGS = st.dictionaries(
    st.text(max_size=6),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda x: st.lists(x, max_size=3) | st.dictionaries(st.text(max_size=4), x, max_size=3),
        max_leaves=6,
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    content=st.text(max_size=20).filter(lambda s: "<" not in s and not s.endswith("\n")),
    calls=st.lists(st.builds(ToolCall, st.text(min_size=1, max_size=8), _ARGS), max_size=3),
)
def test_round_trip(content: str, calls: list[ToolCall]) -> None:
    result = hermes.parse(hermes.encode_turn(content, calls))
    assert result.ok, result.error
    assert list(result.calls) == calls
    assert result.content == content


NEAR_MISSES = [
    ("unclosed", GOOD.replace("</tool_call>", "", 1), "<tool_call>", "unclosed"),
    ("truncated", GOOD[: GOOD.index('"Tokyo"')], "<tool_call>", "truncated"),
    ("broken-json", GOOD.replace('"Tokyo"}', '"Tokyo"', 1), None, "not valid JSON"),
    ("concatenated", GOOD.replace("}}\n", "}}{}\n", 1), None, "concatenated"),
    (
        "duplicate-key",
        GOOD.replace('"city": "Tokyo"', '"city": "Tokyo", "city": "X"'),
        None,
        "repeated key",
    ),
    ("closer-without-opener", "Done.\n</tool_call><|im_end|>", "</tool_call>", "outside"),
    ("mangled-tag", "Done.\n<toolcall>{}</toolcall>", "<toolcall>", "outside"),
    ("text-after", GOOD.replace("<|im_end|>", "\nAnything else?<|im_end|>"), "Anything", "after"),
    ("arguments-not-object", GOOD.replace('{"city": "Tokyo"}', "[1]"), None, "not a JSON object"),
]


@pytest.mark.parametrize(
    ("text", "at", "reason"), [c[1:] for c in NEAR_MISSES], ids=[c[0] for c in NEAR_MISSES]
)
def test_near_miss(text: str, at: str | None, reason: str) -> None:
    result = hermes.parse(text)
    assert result.found
    assert not result.ok
    assert result.error is not None
    assert reason in result.error, result.error
    assert result.offset is not None
    if at is not None:
        assert result.offset == text.index(at)


def test_noncanonical_shapes() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    result = hermes.parse(text)
    assert result.ok
    assert result.calls == (ToolCall("f", {"a": 1}),)
    assert set(result.noncanonical) == {hermes.NC_STRING_ARGS, hermes.NC_NO_EOS}
    assert hermes.parse(text, server_content=True).noncanonical == (hermes.NC_STRING_ARGS,)
    result = hermes.parse(
        '<tool_call>{"name": "f", "parameters": {}}</tool_call>', server_content=True
    )
    # no newlines inside the tags: both servers accept it, the template never writes it
    assert result.noncanonical == (hermes.NC_PARAMETERS, NC_NEWLINES)


def test_registry_auto_picks_the_dialect_present() -> None:
    v4 = dsml.encode_turn("x", CALLS)
    assert registry.detect(v4) == "dsml"
    assert registry.detect(GOOD) == "hermes"
    assert registry.detect("plain text | with a table") == "none"
    assert registry.parse(v4).dialect == "dsml-v4"
    assert registry.parse(dsml.encode_turn("x", CALLS, "v32")).dialect == "dsml-v32"
    assert registry.parse(GOOD).dialect == "hermes"
    assert registry.parse("hello").found is False


def test_registry_named_dialects() -> None:
    v32 = dsml.encode_turn("x", CALLS, "v32")
    assert registry.parse(v32, "dsml-v32").ok
    assert not registry.parse(v32, "dsml-v4").ok
    assert registry.parse(v32, "none").found is False
    assert not registry.parse(GOOD, "dsml").found
    with pytest.raises(UsageError, match="hermes"):
        registry.parse("x", "qwen-xml")
    assert set(registry.names()) >= {"auto", "dsml", "dsml-v32", "dsml-v4", "hermes", "none"}


def test_registry_refuses_mixed_dialects() -> None:
    mixed = dsml.encode_turn('Use <tool_call>{"name": "f"}</tool_call>', CALLS)
    result = registry.parse(mixed)
    assert result.found
    assert not result.ok
    assert result.error is not None
    assert "mixed dialects" in result.error
    assert result.offset == mixed.index("<\uff5cDSML\uff5c")
