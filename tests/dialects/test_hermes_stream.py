"""The Hermes stream parser: the same calls and content as the one-shot parse, any chunking."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import hermes, registry
from harness.dialects.base import ToolCall
from harness.dialects.stream import CallEvent, TextEvent
from tests.dialects.golden import (
    CALLS,
    CONTENT,
    CUTS,
    check_stream_cuts,
    mutate,
)

D = "hermes"
W = ToolCall("get_weather", {"city": "Tokyo"})

MUTATIONS = [
    ("", ""),
    ("</tool_call>", ""),
    ("<tool_call>", "<tool_call"),
    ('"}', '"'),
    ("\n", ""),
    ("<|im_end|>", "\nmore<|im_end|>"),
    ("<|im_end|>", ""),
    ("Sure", "```\n<tool_call>\n```\nSure"),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    text = hermes.encode("Sure " + draw(CONTENT), draw(CALLS))
    text = mutate(draw, text, MUTATIONS)
    return text


@settings(max_examples=200, deadline=None)
@given(text=texts(), cuts=CUTS)
def test_stream_equals_one_shot(text: str, cuts: list[int]) -> None:
    check_stream_cuts(D, text, cuts)


def test_calls_come_as_their_blocks_close() -> None:
    parser = registry.get(D).stream()
    assert parser.feed("Checking.\n<tool_") == [TextEvent("Checking.")]
    assert parser.feed('call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n') == []
    assert parser.feed("</tool_call>\n") == [CallEvent(W, 0)]
    assert (
        parser.feed("<tool_call>\n" + '{"name": "get_weather", "arguments": {"city": "Tokyo"}}')
        == []
    )
    assert parser.feed("\n</tool_call><|im_end|>") == [CallEvent(W, 1)]
    assert parser.flush() == []
    assert parser.finish() == hermes.parse(hermes.encode("Checking.", [W, W]))


def test_fenced_markup_streams_as_content() -> None:
    text = "Like this:\n```\n<tool_call>\n{}\n</tool_call>\n```\nDone."
    parser = registry.get(D).stream()
    events = [e for ch in text for e in parser.feed(ch)] + parser.flush()
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == text
    assert not parser.finish().found
