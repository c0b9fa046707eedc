"""What the peers' own tool-parser tests expect of text around and inside tool calls: content
is content, a cut block is a malformed call, an argument is an argument."""

from __future__ import annotations

import json

import pytest

from harness import labels as L
from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.verdict import STRUCTURAL, classify_text, classify_turn

CALL = ToolCall("get_weather", {"city": "Paris", "days": 3})
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "text": {"type": "string"}}}}}
    for n in ("get_weather", "write")
]  # fmt: skip


@pytest.mark.parametrize("fence", ["```", "~~~"])
@pytest.mark.parametrize("source", ["server", "raw"])
def test_dsml_quoted_in_a_fence_is_content(fence: str, source: str) -> None:
    block = dsml.encode_turn("", [CALL], eos=False).strip()
    text = f"A call looks like this:\n\n{fence}\n{block}\n{fence}\n\nThat is the whole format."
    v = classify_turn(text, source=source, dialect="dsml-v4", tools=TOOLS)
    assert v.label == L.OK_TEXT
    assert v.tool_calls == []


@pytest.mark.parametrize("dialect", ["dsml-v4", "hermes", "gpt-oss"])
def test_a_bare_parameter_tag_in_prose_is_content(dialect: str) -> None:
    text = (
        "In that template the closing tag </parameter> ends a value, and an XML element "
        "named <parameter> holds one."
    )
    for source in ("server", "raw"):
        assert classify_turn(text, source=source, dialect=dialect).label == L.OK_TEXT
    # where Qwen3-Coder markup is what the server speaks, or nobody said what it speaks, a
    # stray closer is still a near miss (a server's parser leaving it behind)
    assert classify_turn(text, source="raw", dialect="qwen3-coder").corrupted
    assert classify_turn(text, source="raw", dialect="auto").corrupted
    # and real markup of another dialect, begun and left broken, is still found
    leak = "Done.<function=get_weather>\n<parameter=city>\nParis\n</function>"
    assert classify_turn(leak, source="raw", dialect="dsml-v4").label == L.MALFORMED_TOOL_CALL


def test_a_dsml_turn_cut_anywhere_in_its_block_is_a_malformed_call() -> None:
    full = dsml.encode_turn("Let me check the weather for you.", [CALL])
    opener = full.index("<\uff5cDSML\uff5c")
    closer = full.index("</\uff5cDSML\uff5ctool_calls>")
    labels = {}
    for cut in range(opener + len("<\uff5cDSML\uff5c"), closer):
        v = classify_turn(full[:cut], source="raw", dialect="dsml-v4", tools=TOOLS)
        labels[cut] = (v.label, v.tier)
    assert set(labels.values()) == {(L.MALFORMED_TOOL_CALL, STRUCTURAL)}


@pytest.mark.parametrize("ch", ["x", "=", "0", "-", " "])
def test_an_argument_of_one_character_repeated_is_an_argument(ch: str) -> None:
    raw = dsml.encode_turn("", [ToolCall("write", {"text": ch * 300})])
    assert classify_turn(raw, source="raw", dialect="dsml-v4", tools=TOOLS).label == L.OK_TOOL_CALL
    args = json.dumps({"text": ch * 300})
    calls = [{"id": "c", "type": "function", "function": {"name": "write", "arguments": args}}]
    assert classify_turn("", tool_calls=calls, tools=TOOLS).label == L.OK_TOOL_CALL


def test_a_phrase_looping_in_an_argument_is_still_a_loop() -> None:
    raw = dsml.encode_turn("", [ToolCall("write", {"text": "the cat sat on the mat. " * 30})])
    assert classify_turn(raw, source="raw", dialect="dsml-v4", tools=TOOLS).label == L.REPETITION


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "units": "metric"}}',
        '```json\n{"name": "get_weather", "parameters": {"city": "Paris"}}\n```',
        '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time"}]',
    ],
)
def test_a_tool_call_written_as_a_json_object_is_content(text: str) -> None:
    assert classify_text(text).label == L.OK_TEXT
    assert classify_turn(text, source="server").label == L.OK_TEXT


def test_salad_in_the_sentences_of_a_json_answer_is_still_salad() -> None:
    text = json.dumps(
        {"answer": "Par 设置 데이터 ->मेंToString()المwrite_through скийする فيщий dtype데이터"}
    )
    assert classify_text(text).label == L.TOKEN_SALAD
