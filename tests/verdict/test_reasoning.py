"""Reasoning is part of the output, never debris: every form a server or a raw output carries
it in, split off and judged as text of its own; broken reasoning markup still caught."""

from __future__ import annotations

import json

import pytest

from harness import labels as L
from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.verdict import CONFIRMED, STRUCTURAL, SUSPECT, classify_text, classify_turn
from harness.verdict.detector import coherence
from harness.verdict.reasoning import HARMONY, OPEN_BY_TEMPLATE, THINK, split

THOUGHT = (
    "Okay, the user wants the weather in Paris for tomorrow. I should call get_weather with "
    "the city name; the unit is optional, so I will leave it out and report in Celsius."
)
ANSWER = "Tomorrow in Paris it will be sunny, with a high of 21 degrees and a light breeze."
HERMES = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
SALAD = "Paris 设置 데이터 ->मेंToString()المwrite_through скийする فيщий dtype데이터 <｜User｜>("


@pytest.mark.parametrize(
    ("text", "form"),
    [
        (f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}", THINK),
        (f"<think>{THOUGHT}</think>{ANSWER}", THINK),
        (f"\n<thinking>\n{THOUGHT}\n</thinking>\n{ANSWER}", THINK),
        (f"<seed:think>{THOUGHT}</seed:think>\n{ANSWER}", THINK),
        (f"\u25c1think\u25b7{THOUGHT}\u25c1/think\u25b7{ANSWER}", THINK),
        (f"{THOUGHT}\n</think>\n\n{ANSWER}", OPEN_BY_TEMPLATE),
        (
            f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>final"
            f"<|message|>{ANSWER}<|return|>",
            HARMONY,
        ),
    ],
)
def test_every_reasoning_form_is_split_and_the_answer_is_clean(text: str, form: str) -> None:
    part = split(text)
    assert part.form == form
    assert part.reasoning.strip() == THOUGHT
    assert part.answer == ANSWER
    assert text[part.answer_start :].startswith(ANSWER)
    for source in ("server", "raw"):
        v = classify_turn(text, source=source)
        assert (v.label, v.corrupted, v.tier) == (L.OK_TEXT, False, ""), (source, v)
        assert v.evidence["reasoning_in_content"] == form


def test_a_block_still_open_when_the_output_ended_is_all_reasoning() -> None:
    text = f"<think>\n{THOUGHT}"
    part = split(text)
    assert (part.form, part.closed, part.answer) == (THINK, False, "")
    v = classify_turn(text, finish_reason="length", source="server")
    assert v.label == L.TRUNCATED
    assert not v.corrupted
    assert v.evidence["reasoning_unclosed"] is True


def test_reasoning_fields_are_judged_apart_from_the_answer() -> None:
    v = classify_turn(ANSWER, reasoning=THOUGHT, source="server")
    assert v.label == L.OK_TEXT
    assert "reasoning_in_content" not in v.evidence  # the server separated it, as it should


def test_a_tool_call_after_the_reasoning_is_parsed_as_usual() -> None:
    raw = classify_turn(f"<think>{THOUGHT}</think>\n\n{HERMES}", tools=TOOLS, source="raw")
    assert raw.label == L.OK_TOOL_CALL
    assert raw.tool_calls == [{"name": "get_weather", "arguments": {"city": "Paris"}}]
    call = ToolCall("get_weather", {"city": "Paris"})
    dsml_out = f"<think>{THOUGHT}</think>" + dsml.encode_turn("", [call])
    got = classify_turn(dsml_out, tools=TOOLS, source="raw", dialect="dsml-v4")
    assert (got.label, got.tool_calls) == (L.OK_TOOL_CALL, [call.to_dict()])
    # a server left the call in its content: its parser failed (a leak), not the model
    leak = classify_turn(f"<think>{THOUGHT}</think>\n\n{HERMES}", tools=TOOLS, source="server")
    assert leak.label == L.PARSER_LEAK
    assert not leak.corrupted
    harmony = (
        f"<|channel|>analysis<|message|>{THOUGHT}<|end|><|start|>assistant<|channel|>commentary"
        ' to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris"}<|call|>'
    )
    got = classify_turn(harmony, tools=TOOLS, source="raw", dialect="gpt-oss")
    assert (got.label, got.tool_calls) == (L.OK_TOOL_CALL, [call.to_dict()])


def test_server_calls_beside_reasoning_in_content() -> None:
    function = {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}
    calls = [{"id": "c0", "type": "function", "function": function}]
    v = classify_turn(f"<think>{THOUGHT}</think>", tool_calls=calls, tools=TOOLS, source="server")
    assert v.label == L.OK_TOOL_CALL


@pytest.mark.parametrize(
    ("text", "what"),
    [
        (f"{ANSWER} <think> I wonder whether it will rain later, let me", "opened inside"),
        (f"Tomorrow in Par</think>is it will be sunny, {ANSWER}", "glued into"),
        (f"<think>{THOUGHT}</think>{ANSWER} And</think>then more.", "glued into"),
        (f"<think>{THOUGHT}</think>{ANSWER}\n\n</think>\n\nMore text here.", "no block to close"),
        (f"<think>{THOUGHT} <think> again</think>{ANSWER}", "opened inside"),
    ],
)
def test_broken_reasoning_markup_is_caught_exactly(text: str, what: str) -> None:
    for v in (classify_turn(text, source="server"), classify_text(text)):
        assert v.label == L.TOKEN_SALAD
        assert v.corrupted
        assert v.tier == STRUCTURAL
        assert what in v.evidence["reason"]
        offset = v.evidence["offset"]
        assert text[offset:].lower().lstrip("<\u25c1/").startswith(("think", "/think"))


@pytest.mark.parametrize(
    "text",
    [
        f"Wrap the reasoning like this: `<think>...</think>` and then answer. {ANSWER}",
        f"An example output:\n\n```\n<think>\nreasoning\n</think>\nanswer\n```\n\n{ANSWER}",
        f"<think>{THOUGHT}</think>Use the tags as in `</think>` when quoting. {ANSWER}",
    ],
)
def test_tags_in_code_are_literals(text: str) -> None:
    v = classify_turn(text, source="server")
    assert not v.corrupted, v


def test_a_capitalized_section_closed_in_the_answer_is_content() -> None:
    text = f"{ANSWER}\n\n<Thinking>\n{THOUGHT}\n</Thinking>\n\nSo: sunny tomorrow."
    for v in (classify_turn(text, source="server"), classify_text(text)):
        assert not v.corrupted, v
        assert "reasoning_in_content" not in v.evidence
    cut = f"{ANSWER}\n\n<Thinking>\nI will break it down: 1. the sky 2. the"  # a token limit
    assert not classify_turn(cut, source="server", finish_reason="length").corrupted
    # unclosed inside a line, lower case (a template's marker) or glued: broken markup still
    for bad in (f"{ANSWER} <Thinking> I wonder whether it will rain later, let me",
                f"{ANSWER} <thinking>{THOUGHT}</thinking> More.",
                f"{ANSWER} Par<Thinking>is</Thinking> sunny."):  # fmt: skip
        v = classify_turn(bad, source="server")
        assert v.tier == STRUCTURAL, bad


def test_a_think_tag_inside_a_tool_argument_is_an_argument() -> None:
    call = ToolCall("write_file", {"path": "notes.md", "content": "a </think> tag, then <think>"})
    out = dsml.encode_turn("I will save the notes.", [call])
    tools = [{"type": "function", "function": {"name": "write_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"},
                                         "content": {"type": "string"}}}}}]  # fmt: skip
    v = classify_turn(out, tools=tools, source="raw", dialect="dsml-v4")
    assert v.label == L.OK_TOOL_CALL, v
    hermes = ('<tool_call>\n{"name": "write_file", "arguments": {"path": "a.md", "content": '
              '"x </think> y"}}\n</tool_call>')  # fmt: skip
    assert classify_turn(hermes, tools=tools, source="raw").label == L.OK_TOOL_CALL


def test_salad_in_the_reasoning_or_the_answer_is_still_salad() -> None:
    in_thought = f"<think>{THOUGHT} {SALAD}</think>\n\n{ANSWER}"
    v = classify_turn(in_thought, source="server")
    assert v.label == L.TOKEN_SALAD
    assert v.tier == SUSPECT
    assert v.evidence["in_content_reasoning"] is True
    assert not v.evidence["in_reasoning"]
    assert v.evidence["offset"] < in_thought.index("</think>")

    in_answer = f"<think>{THOUGHT}</think>\n\n{ANSWER} {SALAD}"
    v = classify_turn(in_answer, source="server")
    assert v.label == L.TOKEN_SALAD
    assert v.tier == SUSPECT
    assert v.evidence["offset"] > in_answer.index("</think>")

    field = classify_turn(ANSWER, reasoning=f"{THOUGHT} {SALAD}", source="server")
    assert field.label == L.TOKEN_SALAD
    assert field.evidence["in_reasoning"] is True
    assert field.evidence["offset"] > len(THOUGHT) - 5


def test_a_closer_among_chat_token_debris_is_debris_not_reasoning() -> None:
    text = "I'll read the file <｜User｜><｜Assistant｜></think>\ndtype데이터 <｜User｜>(\" الم"
    assert split(text).form == ""
    assert classify_turn(text, source="server").corrupted
    glued = "I'll read the file</think>dtype and then"
    assert split(glued).form == ""


def test_a_loop_to_the_end_is_named_but_left_to_an_oracle() -> None:
    # a small model's greedy answers end in such loops on their own: the text shows a loop,
    # not whose it is, so it stays a suspect for the judge or a lone re-send
    looped = "Here is the plan. " + "I will check the file again. " * 12
    v = classify_text(looped)
    assert v.label == L.REPETITION
    assert v.tier == SUSPECT != CONFIRMED
    assert v.evidence["loop_to_the_end"]["copies"] == 12
    # a loop that the answer leaves again is left to the judge
    left = looped + "Then the work is done, and here is the summary you asked for."
    assert classify_text(left).tier in (SUSPECT, "")
    # a rule line is no loop
    assert coherence.loop_to_the_end("Results:\n" + "-" * 80) is None
