"""MiniMax-M2: golden cases from the documented format, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import minimax_m2, registry
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
    consistent,
    good,
    miss,
    mutate,
    plain,
    tool,
    tools_for,
)

D = "minimax-m2"
EOS = "[e~["
W = ToolCall("get_weather", {"city": "Tokyo"})
T = ToolCall("get_time", {})
IW = '<invoke name="get_weather">\n<parameter name="city">Tokyo</parameter>\n</invoke>\n'
IT = '<invoke name="get_time">\n</invoke>\n'
DOC = f"<minimax:tool_call>\n{IW}{IT}</minimax:tool_call>"
ONE = f"<minimax:tool_call>\n{IW}</minimax:tool_call>"
TOOLS = [
    tool(
        "f",
        n={"type": "integer"},
        s={"type": "string"},
        on={"type": "boolean"},
        o={"type": ["object", "null"]},
    )
]


def f(**params: str) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<minimax:tool_call>\n<invoke name="f">\n{body}</invoke>\n</minimax:tool_call>'


CASES: list[Case] = [
    good("documented-example", DOC + EOS, [W, T], "", canonical=True),
    good("one-call", ONE + EOS, [W], canonical=True),
    good("text-before", "Checking.\n" + DOC + EOS, [W, T], "Checking.", canonical=True),
    good("think-before", "<think>\nplan\n</think>\n\n" + ONE + EOS, [W], "<think>\nplan\n</think>"),
    good("zero-args", f"<minimax:tool_call>\n{IT}</minimax:tool_call>" + EOS, [T]),
    good("three-calls", f"<minimax:tool_call>\n{IW}{IT}{IW}</minimax:tool_call>" + EOS, [W, T, W]),
    good("multiline-value", f(s="a\nb") + EOS, [ToolCall("f", {"s": "a\nb"})]),
    good("raw-markup-in-value", f(s="x < y & z") + EOS, [ToolCall("f", {"s": "x < y & z"})]),
    good("edge-newlines-kept", f(s="\nx\n") + EOS, [ToolCall("f", {"s": "\nx\n"})], tools=TOOLS),
    good(
        "typed",
        f(n="4", s="4", on="true", o='{"a": 1}') + EOS,
        [ToolCall("f", {"n": 4, "s": "4", "on": True, "o": {"a": 1}})],
        tools=TOOLS,
    ),
    good("null-allowed", f(o="null") + EOS, [ToolCall("f", {"o": None})], tools=TOOLS),
    good("no-schema", f(n="4", s="Tokyo") + EOS, [ToolCall("f", {"n": 4, "s": "Tokyo"})]),
    good(
        "one-line",
        '<minimax:tool_call><invoke name="get_weather"><parameter name="city">'
        "Tokyo</parameter></invoke></minimax:tool_call>" + EOS,
        [W],
        nc=("newlines",),
    ),
    good("indented", DOC.replace("<invoke", "  <invoke") + EOS, [W, T], nc=("newlines",)),
    good("no-newline-before", "Sure." + ONE + EOS, [W], "Sure.", nc=("newline between",)),
    good("server-content", DOC, [W, T], nc=("end-of-turn",)),
    good("trailing-newline", DOC + "\n" + EOS, [W, T], nc=("whitespace after",)),
    plain("prose", "The MiniMax tool call format uses invoke tags."),
    plain("fenced", "```xml\n" + DOC + "\n```"),
    plain("answer", "Sunny." + EOS, "Sunny."),
    miss("orphan-param-closer", "Working.\n</parameter>\n", "</parameter>", 9),
    miss("invoke-without-wrapper", IW + EOS, "<invoke name=", 0),
    miss("mangled-wrapper", DOC.replace("<minimax:tool_call>", "<minimax_tool_call>"), "tag", 0),
    miss("wrapper-space", DOC.replace("<minimax:tool_call>", "<minimax: tool_call>"), "tag", 0),
    miss(
        "single-quoted-name",
        DOC.replace('name="get_weather"', "name='get_weather'"),
        "double quotes",
    ),
    miss("unquoted-name", DOC.replace('"city"', "city"), "double quotes"),
    miss("param-not-closed", DOC.replace("Tokyo</parameter>", "Tokyo"), "not closed"),
    miss(
        "invoke-not-closed",
        f"<minimax:tool_call>\n{IW[:-10]}{IT}</minimax:tool_call>",
        "not closed",
    ),
    miss("block-not-closed", f"<minimax:tool_call>\n{IW}" + EOS, "truncated"),
    miss("truncated-value", DOC[:70], "truncated"),
    miss(
        "repeated-parameter",
        f(a="1").replace("</invoke>", '<parameter name="a">2</parameter>\n</invoke>'),
        "repeated",
    ),
    miss("text-after", DOC + "\nDone." + EOS, "text after"),
    miss("second-wrapper", DOC + DOC + EOS, "stray tag"),
    miss("empty-block", "<minimax:tool_call>\n</minimax:tool_call>", "no invoke"),
    miss("junk-in-block", DOC.replace(IW, "hello\n" + IW), "expected"),
    miss(
        "junk-in-invoke", DOC.replace("Tokyo</parameter>\n", "Tokyo</parameter>\nhi\n"), "expected"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(case: Case) -> None:
    check_case(D, case)


def test_enough_cases() -> None:
    check_enough(CASES)


def test_auto_and_aliases() -> None:
    assert registry.parse("x\n" + DOC + EOS).dialect == D
    assert registry.get("minimax_m2").name == D
    # DSML's bare-invoke near miss does not make a valid MiniMax block "mixed"
    assert registry.parse(DOC).ok


MUTATIONS = [
    ("", ""),
    ("</parameter>", ""),
    ("</invoke>", ""),
    ("</minimax:tool_call>", ""),
    ('name="', "name='"),
    ("\n", ""),
    (EOS, "\nmore" + EOS),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    text = minimax_m2.encode(draw(CONTENT), draw(CALLS))
    text = mutate(draw, text, MUTATIONS)
    return text


@settings(max_examples=150, deadline=None)
@given(text=texts(), cuts=CUTS)
def test_stream_equals_one_shot(text: str, cuts: list[int]) -> None:
    check_stream_cuts(D, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=CALLS.filter(consistent))
def test_round_trip(content: str, calls: list[ToolCall]) -> None:
    check_round_trip(D, content, calls, tools_for(calls))
