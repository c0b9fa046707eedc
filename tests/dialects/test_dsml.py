"""DSML parsing: DeepSeek's golden files, round trips, near misses, harmless deviations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.dialects.dsml import EOS, MARK

GOLDEN = Path(__file__).parent.parent / "data" / "dsv4_encoding"
ASSISTANT = "<\uff5cAssistant\uff5c>"
TASK_TOKENS = ("<\uff5caction\uff5c>",)


def _golden(n: int) -> tuple[list[dict[str, Any]], str]:
    inp = json.loads((GOLDEN / f"test_input_{n}.json").read_text(encoding="utf-8"))
    messages = inp["messages"] if isinstance(inp, dict) else inp
    return messages, (GOLDEN / f"test_output_{n}.txt").read_text(encoding="utf-8")


def _assistant_parts(prompt: str) -> list[str]:
    """Each assistant output in a prompt: after the header and the think part, up to EOS."""
    parts = []
    for piece in prompt.split(ASSISTANT)[1:]:
        out = piece[: piece.index(EOS) + len(EOS)]
        out = out.split("</think>", 1)[1]
        for tok in TASK_TOKENS:
            out = out.removeprefix(tok)
        parts.append(out)
    return parts


def _openai_calls(msg: dict[str, Any]) -> list[ToolCall]:
    return [
        ToolCall(c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in msg.get("tool_calls") or []
    ]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_golden_encoding_of_assistant_calls(n: int) -> None:
    messages, prompt = _golden(n)
    for msg in messages:
        calls = _openai_calls(msg)
        if calls:
            assert dsml.encode_turn(msg.get("content") or "", calls) in prompt


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_golden_parse_gives_back_the_messages(n: int) -> None:
    messages, prompt = _golden(n)
    assistants = [m for m in messages if m["role"] == "assistant"]
    parts = _assistant_parts(prompt)
    assert len(parts) == len(assistants)
    for msg, part in zip(assistants, parts, strict=True):
        result = dsml.parse(part, "v4")
        assert result.ok, result.error
        assert result.eos
        assert result.noncanonical == ()
        assert result.content == (msg.get("content") or "")
        assert list(result.calls) == _openai_calls(msg)
        assert result.found == bool(_openai_calls(msg))


# --------------------------------------------------------------------------- round trips

_TRICKY = st.sampled_from(
    ["<", ">", "&", '"', "'", "\n", " ", "\t", "\\", "{", "}", "|", "\uff5c", "é", "中", "🙂"]
)
_VALUE_TEXT = st.lists(st.one_of(_TRICKY, st.characters(codec="utf-8")), max_size=20).map("".join)
_KEY = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters='"\n<>\r'), min_size=0, max_size=12
)
_NAME = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters='"\n<>\r'), min_size=1, max_size=12
)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _VALUE_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_KEY, inner, max_size=3),
    max_leaves=8,
)
_ARGS = st.dictionaries(_KEY, st.one_of(_VALUE_TEXT, _JSON), max_size=5)
_CALLS = st.lists(st.builds(ToolCall, _NAME, _ARGS), min_size=1, max_size=3)


@settings(max_examples=300, deadline=None)
@given(content=_VALUE_TEXT, calls=_CALLS, version=st.sampled_from(["v4", "v32"]))
def test_round_trip(content: str, calls: list[ToolCall], version: str) -> None:
    text = dsml.encode_turn(content, calls, version)
    assume(MARK not in content + json.dumps([c.arguments for c in calls], ensure_ascii=False))
    assume(dsml.find_fragment(content) is None)
    result = dsml.parse(text, "auto")
    assert result.ok, (result.error, result.offset)
    assert result.noncanonical == ()
    assert result.content == content
    assert list(result.calls) == calls
    assert result.dialect == f"dsml-{version}"


def test_values_are_kept_byte_for_byte() -> None:
    args = {"a": "  lead and trail  ", "b": 'x < y && z > "q"\n', "c": "", "d": {"k": [1, "v"]}}
    result = dsml.parse(dsml.encode_turn("", [ToolCall("f", args)]))
    assert result.ok
    assert result.calls[0].arguments == args
    assert list(result.calls[0].arguments) == ["a", "b", "c", "d"]


def test_server_content_without_eos_is_canonical() -> None:
    text = dsml.encode_turn("hi", [ToolCall("f", {"a": 1})], eos=False)
    assert dsml.parse(text).noncanonical == ("no end-of-turn token",)
    assert dsml.parse(text, server_content=True).noncanonical == ()


def test_plain_text_is_not_found() -> None:
    result = dsml.parse("Just an answer." + EOS)
    assert (result.found, result.ok, result.content, result.eos) == (
        False,
        True,
        "Just an answer.",
        True,
    )


def test_unknown_version_is_a_usage_error() -> None:
    from harness.errors import UsageError

    with pytest.raises(UsageError, match="v4"):
        dsml.parse("x", "v5")
