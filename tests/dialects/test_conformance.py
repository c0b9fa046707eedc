"""The servers' parser behaviours every dialect follows: orphan closers are near misses,
markup quoted in fenced code is content, intact blocks without their newlines are accepted
as noncanonical. Checked one-shot, streamed, under "auto" and through the classifier."""

from __future__ import annotations

import pytest

from harness import labels as L
from harness.dialects import dsml, registry
from harness.dialects.base import ToolCall
from harness.verdict import classify_turn
from tests.dialects.golden import check_stream, chunkings

CALL = ToolCall("get_weather", {"city": "Tokyo"})
ENCODING = [n for n in registry.names() if n not in ("auto", "dsml", "json", "none")]
M = dsml.MARK


def _encoded(name: str) -> str:
    return registry.get(name).encode("", [CALL])


ORPHANS = [
    "Working.\n</parameter>\n",
    "Working.\n</function>\n",
    "Done.\n</tool_call>",
    "Done.</arg_value>",
    "Done.<|tool_call_end|>",
    "Done.<|call|>",
    "Done.[TOOL_CALLS]",
    "Done. [ARGS]",
    f"Done.\n</{M}parameter>\n</{M}invoke>",
]


@pytest.mark.parametrize("text", ORPHANS)
def test_orphan_closer_in_content_is_malformed(text: str) -> None:
    result = registry.parse(text)
    assert result.found
    assert not result.ok
    assert result.offset is not None
    assert result.offset >= text.index("Wor" if "Wor" in text else "Do") + 5
    verdict = classify_turn(text, source="server")
    if "<|" in text:  # the salad scorer sees a special token in text first: corrupted too
        assert verdict.corrupted
    else:
        assert verdict.label == L.MALFORMED_TOOL_CALL


@pytest.mark.parametrize("name", ENCODING)
def test_markup_in_a_fence_is_content(name: str) -> None:
    block = _encoded(name)
    text = f"The model writes:\n```\n{block}\n```\nThat is the format."
    for dialect in ("auto", name):
        result = registry.parse(text, dialect)
        assert not result.found, (dialect, result)
        assert result.content == text
    assert registry.get(name).first_marker(text) == -1
    if "<|" not in block and "<\uff5ctool" not in block:  # (special tokens: see below)
        assert classify_turn(text, source="server").label == L.OK_TEXT
    for chunks in chunkings(text):
        check_stream(name, text, chunks)


@pytest.mark.parametrize(
    "name", [n for n in ENCODING if n not in ("gpt-oss", "llama3-json", "llama4-pythonic")]
)
def test_a_call_after_a_fenced_example_still_counts(name: str) -> None:
    # (gpt-oss: the content is inside a message, where a quoted token is a token; Llama:
    # a call turn has no content)
    block = _encoded(name)
    prose = f"Example:\n~~~\n{block}\n~~~\nNow for real."
    text = registry.get(name).encode(prose, [CALL])
    result = registry.parse(text, name)
    assert result.ok, result.error
    assert result.calls == (CALL,)
    assert result.content.startswith("Example:\n~~~\n")


NEWLINE_FREE = [
    (
        "dsml-v4",
        f'<{M}tool_calls><{M}invoke name="get_weather"><{M}parameter name="city" '
        f'string="true">Tokyo</{M}parameter></{M}invoke></{M}tool_calls>',
    ),
    (
        "dsml-v32",
        f'x<{M}function_calls><{M}invoke name="get_weather"><{M}parameter name="city" '
        f'string="true">Tokyo</{M}parameter></{M}invoke></{M}function_calls>',
    ),
    ("hermes", 'x<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>'),
    (
        "qwen3-coder",
        "x<tool_call><function=get_weather><parameter=city>Tokyo</parameter>"
        "</function></tool_call>",
    ),
    (
        "glm45",
        "x<tool_call>get_weather<arg_key>city</arg_key><arg_value>Tokyo</arg_value></tool_call>",
    ),
]


@pytest.mark.parametrize(("name", "text"), NEWLINE_FREE, ids=[n for n, _ in NEWLINE_FREE])
def test_intact_block_without_newlines_is_noncanonical(name: str, text: str) -> None:
    result = registry.parse(text, name)
    assert result.ok, result.error
    assert result.calls == (CALL,)
    assert result.noncanonical
    auto = registry.parse(text)
    assert auto.ok
    assert auto.calls == (CALL,)
    verdict = classify_turn(text, source="raw")
    assert verdict.label == L.OK_TOOL_CALL
    assert verdict.noncanonical
    for chunks in chunkings(text):
        check_stream(name, text, chunks)


def test_dsml_stream_waits_for_a_fence_to_close() -> None:
    block = dsml.encode_block([CALL])
    text = f"Quoted:\n```\n{block}\n```\nDone."
    parser = registry.get("dsml-v4").stream()
    events = [e for ch in text for e in parser.feed(ch)] + parser.flush()
    result = parser.finish()
    assert not result.found
    assert "".join(getattr(e, "text", "") for e in events) == text
