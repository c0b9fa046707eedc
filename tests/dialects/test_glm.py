"""GLM-4.5 and GLM-4.7: golden cases from the documented layouts, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import glm, registry
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

W = ToolCall("get_weather", {"city": "Tokyo"})
T = ToolCall("get_time", {})
OBS = "<|observation|>"
TOOLS = [
    tool(
        "f",
        n={"type": "integer"},
        on={"type": "boolean"},
        s={"type": "string"},
        o={"type": "object"},
        maybe={"type": ["null", "string"]},
    )
]


def cases(version: str) -> list[Case]:
    nl = glm.VERSIONS[version]
    other = "" if nl else "\n"

    def call(name: str, *kv: tuple[str, str], sep: str = nl) -> str:
        args = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in kv)
        return f"<tool_call>{name}{sep}{args}</tool_call>"

    cw, ct = call("get_weather", ("city", "Tokyo")), call("get_time")
    two = cw + nl + ct
    return [
        good("one-call", cw + OBS, [W], canonical=True),
        good("zero-args", ct + OBS, [T], canonical=True),
        good("two-calls", two + OBS, [W, T], canonical=True),
        good("text-then-calls", "Checking." + nl + two + OBS, [W, T], "Checking.", canonical=True),
        good("think-then-call", "<think>plan</think>" + nl + cw + OBS, [W], "<think>plan</think>"),
        good("three-calls", two + nl + cw + OBS, [W, T, W]),
        good("value-with-newlines", call("f", ("s", "a\nb")) + OBS, [ToolCall("f", {"s": "a\nb"})]),
        good(
            "value-raw-markup",
            call("f", ("s", "x < y & z")) + OBS,
            [ToolCall("f", {"s": "x < y & z"})],
        ),
        good(
            "json-object-value",
            call("f", ("o", '{"a": [1]}')) + OBS,
            [ToolCall("f", {"o": {"a": [1]}})],
        ),
        good(
            "typed-by-schema",
            call("f", ("n", "5"), ("on", "false"), ("s", "5")) + OBS,
            [ToolCall("f", {"n": 5, "on": False, "s": "5"})],
            tools=TOOLS,
        ),
        good(
            "null-when-allowed",
            call("f", ("maybe", "null")) + OBS,
            [ToolCall("f", {"maybe": None})],
            tools=TOOLS,
        ),
        good(
            "quoted-string-kept",
            call("f", ("s", '"Tokyo"')) + OBS,
            [ToolCall("f", {"s": '"Tokyo"'})],
            tools=TOOLS,
        ),
        good(
            "no-schema-guess",
            call("f", ("n", "5"), ("s", "Tokyo")) + OBS,
            [ToolCall("f", {"n": 5, "s": "Tokyo"})],
        ),
        good(
            "other-layout",
            call("get_weather", ("city", "Tokyo"), sep=other) + OBS,
            [W],
            nc=("newlines",),
        ),
        good("server-content", cw, [W], nc=("end-of-turn",)),
        good("user-token-end", cw + "<|user|>", [W], canonical=True),
        good(
            "space-after-name",
            cw.replace("get_weather", "get_weather ") + OBS,
            [W],
            nc=("newlines",),
        ),
        good("fenced-then-call", "```\n" + cw + "\n```\n" + cw + OBS, [W], "```\n" + cw + "\n```"),
        plain("fenced-only", "Example:\n```\n" + two + "\n```"),
        plain("prose", "Pass the argument key and value."),
        plain("answer", "It is sunny.<|user|>", "It is sunny."),
        miss("orphan-value-closer", "Done.\n</arg_value>", "</arg_value>", 6),
        miss("orphan-key", "Use <arg_key>city</arg_key> here.", "<arg_key>", 4),
        miss("mangled-opener", cw.replace("<tool_call>", "<tool call>") + OBS, "tag", 0),
        miss(
            "key-without-value",
            call("f").replace("</tool_call>", f"<arg_key>a</arg_key>{nl}</tool_call>") + OBS,
            "<arg_value>",
        ),
        miss("value-not-closed", cw.replace("</arg_value>", "") + OBS, "not closed"),
        miss("key-not-closed", cw.replace("</arg_key>", "") + OBS, "not closed"),
        miss("no-closer", cw.replace("</tool_call>", "") + OBS, "truncated"),
        miss("truncated-in-value", cw[:45], "truncated"),
        miss(
            "no-name",
            "<tool_call>" + nl + "<arg_key>a</arg_key><arg_value>1</arg_value>" + "</tool_call>",
            "function name",
        ),
        miss("name-with-spaces", cw.replace("get_weather", "get the weather") + OBS, "malformed"),
        miss("repeated-key", call("f", ("a", "1"), ("a", "2")) + OBS, "repeated"),
        miss("text-after", cw + nl + "Anything else?" + OBS, "text after"),
        miss("stray-closer-after", cw + "</tool_call>" + OBS, "stray tag"),
        miss("junk-in-block", cw.replace("</arg_value>", "</arg_value>hello") + OBS, "expected"),
        miss(
            "hermes-json-inside",
            '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
            "Hermes JSON",
        ),
    ]


V45, V47 = cases("glm45"), cases("glm47")


@pytest.mark.parametrize("case", V45, ids=[c.id for c in V45])
def test_golden_glm45(case: Case) -> None:
    check_case("glm45", case)


@pytest.mark.parametrize("case", V47, ids=[c.id for c in V47])
def test_golden_glm47(case: Case) -> None:
    check_case("glm47", case)


def test_enough_cases() -> None:
    check_enough(V45)


def test_auto_picks_the_layout() -> None:
    assert registry.parse(glm.encode("x", [W, T], "glm45")).dialect == "glm45"
    assert registry.parse(glm.encode("x", [W, T], "glm47")).dialect == "glm47"
    assert registry.get("glm4_moe").name == "glm45"


MUTATIONS = [
    ("", ""),
    ("</arg_value>", ""),
    ("</tool_call>", ""),
    ("<arg_key>", "<arg key>"),
    ("\n", ""),
    ("<|observation|>", "\nok<|observation|>"),
    ("<|observation|>", ""),
]


@st.composite
def texts(draw: st.DrawFn) -> tuple[str, str]:
    version = draw(st.sampled_from(list(glm.VERSIONS)))
    text = glm.encode(draw(CONTENT), draw(CALLS), version)
    text = mutate(draw, text, MUTATIONS)
    return version, text


@settings(max_examples=150, deadline=None)
@given(item=texts(), cuts=CUTS)
def test_stream_equals_one_shot(item: tuple[str, str], cuts: list[int]) -> None:
    version, text = item
    check_stream_cuts(version, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=CALLS.filter(consistent), version=st.sampled_from(list(glm.VERSIONS)))
def test_round_trip(content: str, calls: list[ToolCall], version: str) -> None:
    check_round_trip(version, content, calls, tools_for(calls))
