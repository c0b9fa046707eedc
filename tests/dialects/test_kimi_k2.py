"""Kimi-K2: golden cases from the documented format, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import kimi_k2, registry
from harness.dialects.base import ToolCall
from tests.dialects.golden import (
    CALLS,
    CONTENT,
    CUTS,
    Case,
    check_case,
    check_enough,
    check_round_trip,
    check_stream_cuts,
    good,
    miss,
    mutate,
    plain,
)

D = "kimi-k2"
SB, SE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, CE, AB = "<|tool_call_begin|>", "<|tool_call_end|>", "<|tool_call_argument_begin|>"
EOS = "<|im_end|>"
W = ToolCall("get_weather", {"city": "Tokyo"})
T = ToolCall("get_time", {})
CW = f'{CB}functions.get_weather:0{AB}{{"city": "Tokyo"}}{CE}'
CT = f"{CB}functions.get_time:1{AB}{{}}{CE}"
DOC = SB + CW + CT + SE  # the documented example


def sec(*calls: str) -> str:
    return SB + "".join(calls) + SE


CASES: list[Case] = [
    good("documented-example", DOC + EOS, [W, T], "", canonical=True),
    good("one-call", sec(CW) + EOS, [W], canonical=True),
    good("text-before", "Let me look." + sec(CW) + EOS, [W], "Let me look.", canonical=True),
    good(
        "thinking-before", "<think>need it</think>" + sec(CW) + EOS, [W], "<think>need it</think>"
    ),
    good("high-index", sec(CW.replace(":0", ":17")) + EOS, [W]),
    good("three-calls", sec(CW, CT, CW) + EOS, [W, T, W]),
    good(
        "nested-args",
        sec(CW.replace('{"city": "Tokyo"}', '{"a": {"b": [1, null, "x"]}}')) + EOS,
        [ToolCall("get_weather", {"a": {"b": [1, None, "x"]}})],
    ),
    good(
        "markers-in-a-string",
        sec(CW.replace("Tokyo", "<b>x</b>")) + EOS,
        [ToolCall("get_weather", {"city": "<b>x</b>"})],
    ),
    good(
        "dotted-name",
        sec(CW.replace("get_weather", "ns.get_weather")) + EOS,
        [ToolCall("ns.get_weather", {"city": "Tokyo"})],
    ),
    good("no-functions-prefix", sec(CW.replace("functions.", "")) + EOS, [W], nc=("functions.",)),
    good(
        "newlines-between-tokens",
        SB + "\n" + CW + "\n" + CT + "\n" + SE + EOS,
        [W, T],
        nc=("newlines",),
    ),
    good(
        "space-in-header", sec(CW.replace("functions.", " functions.")) + EOS, [W], nc=("newlines",)
    ),
    good("server-content", DOC, [W, T], nc=("end-of-turn",)),
    good("trailing-newline", DOC + "\n" + EOS, [W, T], nc=("whitespace after",)),
    plain("prose", "A tool call section begins here: not really."),
    plain("fenced", "Format:\n```\n" + DOC + "\n```"),
    plain("plain-eos", "Hello." + EOS, "Hello."),
    miss("mangled-section-begin", DOC.replace(SB, "<|tool_calls_section_begin>"), "tag", 0),
    miss("bars-lost", DOC.replace(SB, "<tool_calls_section_begin>"), "tag", 0),
    miss("call-outside-section", CW + EOS, "tag", 0),
    miss("orphan-section-end", "Done." + SE, "tag", 5),
    miss("no-index", sec(CW.replace(":0", "")) + EOS, ":INDEX"),
    miss(
        "bad-header",
        sec(CW.replace("functions.get_weather:0", "get weather 0")) + EOS,
        "malformed call header",
    ),
    miss("bad-json", sec(CW.replace('"Tokyo"}', '"Tokyo"')) + EOS, "not valid JSON"),
    miss("args-list", sec(CW.replace('{"city": "Tokyo"}', "[1, 2]")) + EOS, "not an object"),
    miss("duplicate-key", sec(CW.replace('"Tokyo"', '"Tokyo", "city": "Kyoto"')) + EOS, "repeated"),
    miss("call-end-lost", SB + CW.replace(CE, "") + CT + SE + EOS, "not closed"),
    miss("section-end-lost", SB + CW + EOS, "truncated"),
    miss("truncated-in-args", DOC[:70], "truncated"),
    miss("truncated-in-header", SB + CB + "functions.get_wea", "truncated"),
    miss("empty-section", SB + SE + EOS, "no call"),
    miss("text-after-section", DOC + " Done." + EOS, "text after", len(DOC) + 1),
    miss("second-section", DOC + DOC + EOS, "stray tag"),
    miss("junk-in-section", SB + "hello" + CW + SE, "expected"),
    miss("argument-begin-lost", sec(CW.replace(AB, "")) + EOS, "call header broken"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(case: Case) -> None:
    check_case(D, case)


def test_enough_cases() -> None:
    check_enough(CASES)


def test_auto_and_aliases() -> None:
    assert registry.parse("x" + DOC).dialect == D
    assert registry.get("kimi_k2").name == D


MUTATIONS = [
    ("", ""),
    (CE, ""),
    (SE, ""),
    (":", ""),
    ("|>", ">"),
    ('"}', '"'),
    ("functions.", ""),
    (EOS, "\nmore" + EOS),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    text = kimi_k2.encode(draw(CONTENT), draw(CALLS))
    text = mutate(draw, text, MUTATIONS)
    return text


@settings(max_examples=150, deadline=None)
@given(text=texts(), cuts=CUTS)
def test_stream_equals_one_shot(text: str, cuts: list[int]) -> None:
    check_stream_cuts(D, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=CALLS)
def test_round_trip(content: str, calls: list[ToolCall]) -> None:
    check_round_trip(D, content, calls)
