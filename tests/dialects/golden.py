"""Golden cases of the dialects, and the checks every case goes through.

A case is a raw text and what the dialect must make of it: the calls and content of a
valid turn, or a near miss (an error mentioning some words, found at an offset). Every case
is also streamed in several chunkings, down to one character at a time: the stream parser
must end with the same result, emit the content and the calls of the one-shot parse, and
never emit a piece of text that it takes back or that holds markup.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from harness.dialects import registry
from harness.dialects.base import ParseResult, ToolCall
from harness.dialects.stream import CallEvent, Event, TextEvent


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    ok: bool
    calls: tuple[ToolCall, ...] = ()
    content: str | None = None
    error: str = ""  # words the error must contain
    at: int | None = None  # where the near miss is
    noncanonical: tuple[str, ...] = ()  # substrings of the noncanonical notes expected
    canonical: bool = False  # no noncanonical note at all
    found: bool = True
    tools: list[dict[str, Any]] | None = None
    dialect: str = ""  # expected result.dialect ("" = the dialect under test)
    extra: dict[str, Any] = field(default_factory=dict)


def good(
    id: str,
    text: str,
    calls: list[ToolCall],
    content: str = "",
    *,
    nc: tuple[str, ...] = (),
    canonical: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> Case:
    return Case(
        id, text, True, tuple(calls), content, noncanonical=nc, canonical=canonical, tools=tools
    )


def miss(id: str, text: str, error: str = "", at: int | None = None) -> Case:
    return Case(id, text, False, error=error, at=at)


def plain(id: str, text: str, content: str | None = None) -> Case:
    """Text with none of the dialect's markup: all content."""
    return Case(id, text, True, content=text if content is None else content, found=False)


def tool(name: str, **props: Any) -> dict[str, Any]:
    """An OpenAI tool definition with the given property schemas."""
    return {
        "type": "function",
        "function": {"name": name, "parameters": {"type": "object", "properties": props}},
    }


def check_case(dialect: str, case: Case) -> ParseResult:
    d = registry.get(dialect)
    result = d.parse(case.text, tools=case.tools)
    assert result.found == case.found, result
    assert result.ok == case.ok, result
    if case.ok:
        assert list(result.calls) == list(case.calls)
        if case.content is not None:
            assert result.content == case.content
        for note in case.noncanonical:
            assert any(note in n for n in result.noncanonical), result.noncanonical
        if case.canonical:
            assert result.noncanonical == ()
        if case.found:
            assert result.dialect == (case.dialect or dialect)
            assert d.first_marker(case.text) >= 0
    else:
        assert result.error is not None
        assert case.error.lower() in result.error.lower(), result.error
        assert result.offset is not None
        if case.at is not None:
            assert result.offset == case.at, (result.offset, result.error)
        assert d.first_marker(case.text) >= 0
    for chunks in chunkings(case.text):
        check_stream(dialect, case.text, chunks, case.tools)
    return result


def check_enough(*case_lists: list[Case], least: int = 30) -> None:
    """Each list of golden cases has at least ``least`` cases, their ids unique."""
    for cases in case_lists:
        assert len(cases) >= least
        assert len({c.id for c in cases}) == len(cases)


def check_round_trip(
    dialect: str, content: str, calls: list[ToolCall], tools: list[dict[str, Any]] | None = None
) -> None:
    """What the dialect encodes parses back to the same content and calls, canonical."""
    d = registry.get(dialect)
    result = d.parse(d.encode(content, calls), tools=tools)
    assert result.ok, result.error
    assert list(result.calls) == calls
    assert result.content == content
    assert result.noncanonical == ()


def check_stream_cuts(dialect: str, text: str, cuts: list[int]) -> None:
    """``check_stream`` with ``text`` cut at ``cuts``, then one character at a time."""
    check_stream(dialect, text, split(text, cuts))
    check_stream(dialect, text, list(text))


def chunkings(text: str, seed: int = 0) -> list[list[str]]:
    rnd = random.Random(f"{seed}:{text}")
    out = [[text], list(text)]
    for size in (2, 3, 5, 11):
        out.append([text[i : i + size] for i in range(0, len(text), size)] or [""])
    for _ in range(3):
        cuts = sorted(rnd.sample(range(len(text) + 1), min(len(text) + 1, 6)))
        out.append(split(text, cuts))
    return out


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    bounds = [0, *points, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def run_stream(
    dialect: str, chunks: list[str], tools: Any = None
) -> tuple[list[Event], list[str], ParseResult]:
    """The events of the stream parser fed ``chunks``, the text emitted after each, its result."""
    parser = registry.get(dialect).stream(tools=tools)
    events: list[Event] = []
    cumulative: list[str] = []
    for chunk in chunks:
        events.extend(parser.feed(chunk))
        cumulative.append("".join(e.text for e in events if isinstance(e, TextEvent)))
    events.extend(parser.flush())
    return events, cumulative, parser.finish()


def summary(events: list[Event]) -> tuple[str, list[ToolCall]]:
    text = "".join(e.text for e in events if isinstance(e, TextEvent))
    calls = [e.call for e in events if isinstance(e, CallEvent)]
    return text, calls


def check_stream(dialect: str, text: str, chunks: list[str], tools: Any = None) -> None:
    assert "".join(chunks) == text
    d = registry.get(dialect)
    one_events, _, _ = run_stream(dialect, [text], tools)
    events, cumulative, result = run_stream(dialect, chunks, tools)
    assert result == d.parse(text, tools=tools)
    assert summary(events) == summary(one_events)
    joined, calls = summary(events)
    for partial in cumulative:  # never a piece of text that is later taken back
        assert joined.startswith(partial)
    if result.ok:
        assert joined == result.content
        assert calls == list(result.calls)
    else:
        assert text.startswith(joined)
        assert d.first_marker(joined) == -1, joined
    assert [e.index for e in events if isinstance(e, CallEvent)] == list(range(len(calls)))


# --------------------------------------------------------------------- strategies

#: where ``check_stream_cuts`` cuts a text (taken modulo its length)
CUTS = st.lists(st.integers(0, 10_000), max_size=10)


def mutate(draw: st.DrawFn, text: str, mutations: list[tuple[str, str]]) -> str:
    """``text`` with one of the (old, new) ``mutations`` made once, and maybe cut short."""
    old, new = draw(st.sampled_from(mutations))
    if old:
        text = text.replace(old, new, 1)
    if draw(st.booleans()):
        text = text[: draw(st.integers(0, len(text)))]
    return text


#: Text without markup characters: content and string values that any dialect can carry.
SAFE = st.text(
    alphabet=st.sampled_from(list("abcxyz ABC.,:;!?-_'()0123456789\né中🙂")), max_size=14
)
NAMES = st.sampled_from(["get_weather", "read_file", "f", "search_web"])
KEYS = st.sampled_from(["city", "path", "n", "opts", "q"])
SCALAR = st.one_of(
    st.integers(-1000, 1000),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda f: round(f, 3)),
    SAFE.filter(lambda s: s.strip() == s and s != ""),
)
VALUE = st.recursive(
    SCALAR,
    lambda x: st.lists(x, max_size=3) | st.dictionaries(st.sampled_from(["a", "b"]), x, max_size=2),
    max_leaves=5,
)
ARGS = st.dictionaries(KEYS, VALUE, max_size=3)
CALLS = st.lists(st.builds(ToolCall, NAMES, ARGS), max_size=3)
CONTENT = SAFE.map(str.strip)


def schema_of(value: Any) -> dict[str, Any]:
    kinds = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    if value is None:
        return {"type": "null"}
    if isinstance(value, dict):
        return {"type": "object"}
    return {"type": kinds[type(value)]}


def tools_for(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Tool definitions whose schemas type every argument the way the calls do.

    Calls of one name in one list may disagree on a key's type; the list is then typed by
    the first call, and the round trip needs only the first call of each name to agree.
    """
    seen: dict[str, dict[str, Any]] = {}
    for call in calls:
        props = seen.setdefault(call.name, {})
        for key, value in call.arguments.items():
            props.setdefault(key, schema_of(value))
    return [tool(name, **props) for name, props in seen.items()]


def consistent(calls: list[ToolCall]) -> bool:
    """Every call agrees with the schemas ``tools_for`` derives (one type per key)."""
    types: dict[tuple[str, str], str] = {}
    for call in calls:
        for key, value in call.arguments.items():
            kind = schema_of(value)["type"]
            if types.setdefault((call.name, key), kind) != kind:
                return False
    return True
