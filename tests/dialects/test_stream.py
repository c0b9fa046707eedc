"""The stream parser equals the one-shot parser for every chunking, down to one character."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.dialects.dsml import EOS, MARK, StreamParser
from harness.dialects.stream import CallEvent, TextEvent
from tests.dialects.golden import mutate, run_stream, split, summary

_VALUE = st.text(alphabet=st.sampled_from(list("ab <>&\"'\n|\uff5cDSML{}[]:,中🙂")), max_size=12)
_ARGS = st.dictionaries(
    st.sampled_from(["q", "path", "n", "opts"]),
    st.one_of(_VALUE, st.integers(), st.lists(st.integers(), max_size=2)),
    max_size=3,
)
_CALLS = st.lists(st.builds(ToolCall, st.sampled_from(["f", "read_file"]), _ARGS), max_size=3)

MUTATIONS = [
    ("", ""),
    ("tool_calls>", "toolcalls>"),
    (MARK, "|DSML|"),
    (MARK, "\uff5c\uff5cDSML\uff5c\uff5c"),
    (f"<{MARK}tool_calls>", "< calls>"),
    ("string=", "strng="),
    ('name="', "name=\u201c"),
    (EOS, "\nmore text" + EOS),
    (f"</{MARK}tool_calls>", f"</{MARK}function_calls>"),
    ("\n\n<", "\n<"),
    (f"\n<{MARK}invoke", f"\n   <{MARK}invoke"),
    (EOS, ""),
]


@st.composite
def turns(draw: st.DrawFn) -> str:
    content = draw(_VALUE)
    calls = draw(_CALLS)
    text = dsml.encode_turn(content, calls, draw(st.sampled_from(["v4", "v32"])))
    return mutate(draw, text, MUTATIONS)


def _check(text: str, chunks: list[str]) -> None:
    assert "".join(chunks) == text
    one_events, _, _ = run_stream("dsml", [text])
    events, cumulative, result = run_stream("dsml", chunks)
    assert result == dsml.parse(text)
    assert summary(events) == summary(one_events)
    joined, calls = summary(events)
    assert text.startswith(joined)
    assert dsml.find_fragment(joined) is None
    for partial in cumulative:  # never a piece of text that is later taken back
        assert joined.startswith(partial)
    if result.ok:
        assert joined == result.content
        assert calls == list(result.calls)
    assert [e.index for e in events if isinstance(e, CallEvent)] == list(range(len(calls)))


@settings(max_examples=300, deadline=None)
@given(text=turns(), cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_stream_equals_one_shot_for_random_chunkings(text: str, cuts: list[int]) -> None:
    _check(text, split(text, cuts))


@settings(max_examples=60, deadline=None)
@given(text=turns())
def test_stream_one_character_at_a_time(text: str) -> None:
    _check(text, list(text))


def test_partial_marker_is_held_back() -> None:
    parser = StreamParser()
    assert parser.feed("Checking.\n\n<\uff5cDS") == [TextEvent("Checking.")]
    assert parser.feed("ML\uff5ctool_calls>\n") == []
    events = parser.feed(f'<{MARK}invoke name="f">\n\n</{MARK}invoke>\n')
    assert events == [CallEvent(ToolCall("f", {}), 0)]
    assert parser.feed(f"</{MARK}tool_calls>{EOS}") == []
    assert parser.flush() == []
    result = parser.finish()
    assert result.ok
    assert result.calls == (ToolCall("f", {}),)


def test_plain_text_streams_through() -> None:
    parser = StreamParser()
    assert parser.feed("Hello ") == [TextEvent("Hello")]
    assert parser.feed("world") == [TextEvent(" world")]
    assert parser.flush() == []
    assert parser.finish().content == "Hello world"


def test_broken_marker_is_never_emitted() -> None:
    parser = StreamParser()
    events = parser.feed("Done. <|DSML|tool_calls>\n") + parser.flush()
    assert summary(events) == ("Done. ", [])
    result = parser.finish()
    assert result.found
    assert not result.ok
