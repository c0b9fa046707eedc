"""Qwen3-Coder XML: golden cases from the documented format, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import qwen3_coder, registry
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

D = "qwen3-coder"
EOS = "<|im_end|>"
W = ToolCall("get_weather", {"city": "Tokyo", "days": 3})
T = ToolCall("get_time", {})
ONE = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nTokyo\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
TWO = ONE + "\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
WT = [tool("get_weather", city={"type": "string"}, days={"type": "integer"})]
FLAGS = [
    tool(
        "f",
        on={"type": "boolean"},
        n={"type": "integer"},
        x={"type": "number"},
        s={"type": "string"},
        o={"type": "object"},
        a={"type": "array"},
        maybe={"type": ["string", "null"]},
    )
]


def f(**params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"


CASES: list[Case] = [
    good("one-call", ONE + EOS, [W], "", canonical=True),
    good("text-then-call", "Let me check.\n" + ONE + EOS, [W], "Let me check.", canonical=True),
    good("two-calls", "Both.\n" + TWO + EOS, [W, T], "Both.", canonical=True),
    good("zero-args", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>" + EOS, [T]),
    good("three-calls", TWO + "\n" + ONE + EOS, [W, T, W]),
    good(
        "multiline-value",
        f(s="line one\nline two") + EOS,
        [ToolCall("f", {"s": "line one\nline two"})],
    ),
    good("value-keeps-inner-blank-lines", f(s="\na\n") + EOS, [ToolCall("f", {"s": "\na\n"})]),
    good("json-object-value", f(o='{"k": [1, 2]}') + EOS, [ToolCall("f", {"o": {"k": [1, 2]}})]),
    good("jinja-true", f(on="True") + EOS, [ToolCall("f", {"on": True})]),
    good(
        "schema-typed",
        f(on="true", n="7", x="2.5", s="007", o="{}", a="[1]") + EOS,
        [ToolCall("f", {"on": True, "n": 7, "x": 2.5, "s": "007", "o": {}, "a": [1]})],
        tools=FLAGS,
    ),
    good(
        "schema-null-allowed", f(maybe="null") + EOS, [ToolCall("f", {"maybe": None})], tools=FLAGS
    ),
    good("schema-string-stays", f(s="null") + EOS, [ToolCall("f", {"s": "null"})], tools=FLAGS),
    good("schema-int-not-int", f(n="3.0") + EOS, [ToolCall("f", {"n": 3.0})], tools=FLAGS),
    good("no-schema-string", f(s="Tokyo") + EOS, [ToolCall("f", {"s": "Tokyo"})]),
    good("unknown-tool-accepted", f(s="x") + EOS, [ToolCall("f", {"s": "x"})], tools=WT),
    good(
        "reasoning-before",
        "<think>\nneed it\n</think>\n\n" + ONE + EOS,
        [W],
        "<think>\nneed it\n</think>",
    ),
    good("server-content-no-eos", ONE, [W], nc=("end-of-turn",)),
    good(
        "no-newlines-at-all",
        "<tool_call><function=get_weather><parameter=city>Tokyo</parameter>"
        "<parameter=days>3</parameter></function></tool_call>" + EOS,
        [W],
        nc=("newlines",),
        tools=WT,
    ),
    good("no-newline-before-block", "Sure." + ONE + EOS, [W], "Sure.", nc=("newline between",)),
    good("blank-line-between-calls", ONE + "\n\n" + ONE + EOS, [W, W], nc=("newlines",)),
    good("trailing-newline", ONE + "\n" + EOS, [W], nc=("whitespace after",)),
    good(
        "fenced-markup-then-call",
        "Format:\n```\n" + ONE + "\n```\nNow:\n" + ONE + EOS,
        [W],
        "Format:\n```\n" + ONE + "\n```\nNow:",
    ),
    plain("fenced-markup-is-content", "Example:\n```xml\n" + ONE + "\n```\nThat is all."),
    plain("fenced-orphan-closer", "```\n</parameter>\n```"),
    plain("prose", "Use a function call with parameters, e.g. f(x)."),
    plain("html", "<b>bold</b> and <i>it</i>" + EOS, "<b>bold</b> and <i>it</i>"),
    miss("orphan-param-closer", "Working.\n</parameter>\n", "</parameter>", at=9),
    miss("orphan-function-closer", "Done.\n</function>\n</tool_call>", "</function>", at=6),
    miss("function-without-tool-call", "<function=get_time>\n</function>" + EOS, "<function=", 0),
    miss("mangled-opener", "< tool_call>\n<function=f>\n</function>\n</tool_call>", "tag", 0),
    miss(
        "param-not-closed-before-function",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>\n</tool_call>" + EOS,
        "not closed",
        at=41,
    ),
    miss(
        "param-not-closed-before-next-param",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\n2\n</parameter>\n"
        "</function>\n</tool_call>",
        "not closed",
    ),
    miss("no-function-closer", "<tool_call>\n<function=f>\n</tool_call>" + EOS, "</function>"),
    miss("no-tool-call-closer", "<tool_call>\n<function=f>\n</function>\n" + EOS, "truncated"),
    miss("truncated-mid-value", ONE[:60], "truncated"),
    miss("truncated-after-opener", "Let me see.\n<tool_call>\n", "truncated"),
    miss(
        "hermes-json-inside",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
        "Hermes JSON",
    ),
    miss(
        "repeated-parameter",
        f(a="1").replace("</function>", "<parameter=a>\n2\n</parameter>\n</function>"),
        "repeated",
    ),
    miss("text-after-calls", ONE + "\nAnything else?" + EOS, "text after", len(ONE) + 1),
    miss("stray-tag-after-calls", ONE + "\n</tool_call>" + EOS, "stray tag"),
    miss(
        "junk-inside-function",
        "<tool_call>\n<function=f>\nhello\n</function>\n</tool_call>",
        "expected",
    ),
    miss(
        "unclosed-function-opener",
        "<tool_call>\n<function=f\n</function>\n</tool_call>",
        "<function=NAME>",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(case: Case) -> None:
    check_case(D, case)


def test_enough_cases() -> None:
    check_enough(CASES)


def test_auto_detection_and_aliases() -> None:
    assert registry.parse("Hi.\n" + TWO + EOS).dialect == D
    assert registry.detect(ONE) == D
    assert registry.get("qwen3_coder").name == D
    assert registry.get("qwen3_xml").name == D
    # the orphan closer is a near miss under auto too
    orphan = registry.parse("Working.\n</parameter>\n")
    assert orphan.found
    assert not orphan.ok
    # markup in a fence is content under auto
    fenced = registry.parse("```\n" + ONE + "\n```")
    assert not fenced.found


MUTATIONS = [
    ("", ""),
    ("</parameter>", ""),
    ("</function>", "</functon>"),
    ("<tool_call>", "<tool-call>"),
    ("\n</tool_call>", ""),
    ("<function=", "<function "),
    ("\n", ""),
    (EOS, "\nmore" + EOS),
    (EOS, ""),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    calls = draw(CALLS)
    text = qwen3_coder.encode(draw(CONTENT), calls)
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
