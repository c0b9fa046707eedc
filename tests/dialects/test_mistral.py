"""Mistral, the v3 JSON list and the v11 compact form: golden cases, streaming, round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import mistral, registry
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

TC, EOS = "[TOOL_CALLS]", "</s>"
W = ToolCall("get_weather", {"city": "A"})
T = ToolCall("get_time", {})
IW = {"name": "get_weather", "arguments": {"city": "A"}, "id": "abc123XYZ"}
IT = {"name": "get_time", "arguments": {}, "id": "def456UVW"}


def lst(*items: object, sep: str = " ") -> str:
    return TC + sep + json.dumps(list(items))


DOC3 = lst(IW)  # the documented example
CW = TC + 'get_weather[ARGS]{"city": "A"}'
CT = TC + "get_time[ARGS]{}"

V3: list[Case] = [
    good("documented-example", DOC3 + EOS, [W], "", canonical=True),
    good("tekken-no-space", lst(IW, sep="") + EOS, [W], canonical=True),
    good("two-calls", lst(IW, IT) + EOS, [W, T], canonical=True),
    good("text-before", "Let me check." + DOC3 + EOS, [W], "Let me check.", canonical=True),
    good("think-before", "[THINK]plan[/THINK]" + DOC3 + EOS, [W], "[THINK]plan[/THINK]"),
    good("no-id-v2", lst({"name": "get_weather", "arguments": {"city": "A"}}) + EOS, [W]),
    good("no-arguments", lst({"name": "get_time"}) + EOS, [T]),
    good(
        "nested",
        lst({"name": "f", "arguments": {"a": [1, {"b": None}]}}) + EOS,
        [ToolCall("f", {"a": [1, {"b": None}]})],
    ),
    good(
        "string-arguments",
        lst({"name": "get_weather", "arguments": '{"city": "A"}'}) + EOS,
        [W],
        nc=("JSON string",),
    ),
    good("newline-after-marker", lst(IW, sep="\n") + EOS, [W], nc=("newlines",)),
    good("compact-json", TC + ' [{"name":"get_weather","arguments":{"city":"A"}}]' + EOS, [W]),
    good("server-content", DOC3, [W], nc=("end-of-turn",)),
    good("trailing-newline", DOC3 + "\n" + EOS, [W], nc=("whitespace after",)),
    plain("prose", "Tool calls are listed in brackets [like this]."),
    plain("fenced", "```\n" + DOC3 + "\n```"),
    plain("answer", "Sunny." + EOS, "Sunny."),
    miss("mangled-singular", DOC3.replace(TC, "[TOOL_CALL]"), "tag", 0),
    miss("lost-open-bracket", "x TOOL_CALLS] " + json.dumps([IW]), "tag", 2),
    miss("lowercase-space", DOC3.replace(TC, "[TOOL_CALLS ]"), "tag", 0),
    miss("orphan-args", "Done [ARGS]", "tag", 5),
    miss("not-json", TC + " [{name: get_weather}]" + EOS, "not valid JSON"),
    miss("truncated-list", DOC3[:30], "truncated"),
    miss("truncated-after-marker", "Ok." + TC, "truncated"),
    miss("empty-list", TC + " []" + EOS, "empty"),
    miss("not-a-list", TC + ' {"name": "f"}' + EOS, "expected a JSON list"),
    miss("item-not-object", TC + ' ["f"]' + EOS, "not an object"),
    miss("extra-key", lst({"name": "f", "arguments": {}, "type": "function"}) + EOS, "unexpected"),
    miss("no-name", lst({"arguments": {}}) + EOS, "name"),
    miss("args-not-object", lst({"name": "f", "arguments": [1]}) + EOS, "not a JSON object"),
    miss("duplicate-key", TC + ' [{"name": "f", "name": "g", "arguments": {}}]', "repeated"),
    miss("text-after", DOC3 + " Done." + EOS, "text after"),
    miss("second-marker", DOC3 + DOC3 + EOS, "stray tag"),
    miss("v11-in-v3", CW + EOS, "v11"),
]

V11: list[Case] = [
    good("documented-example", CW + EOS, [W], "", canonical=True),
    good("two-calls", CW + CT + EOS, [W, T], canonical=True),
    good("text-before", "Checking." + CW + EOS, [W], "Checking.", canonical=True),
    good("think-before", "<think>plan</think>" + CW + EOS, [W], "<think>plan</think>"),
    good("call-id", TC + 'get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "A"}' + EOS, [W]),
    good("three-calls", CW + CT + CW + EOS, [W, T, W]),
    good(
        "nested",
        TC + 'f[ARGS]{"a": {"b": [true, null]}}' + EOS,
        [ToolCall("f", {"a": {"b": [True, None]}})],
    ),
    good(
        "brackets-in-string",
        TC + 'f[ARGS]{"q": "[ARGS] and [x]"}' + EOS,
        [ToolCall("f", {"q": "[ARGS] and [x]"})],
    ),
    good("dotted-name", TC + "ns.f[ARGS]{}" + EOS, [ToolCall("ns.f", {})]),
    good("space-after-args", TC + 'get_weather[ARGS] {"city": "A"}' + EOS, [W], nc=("newlines",)),
    good("newline-between-calls", CW + "\n" + CT + EOS, [W, T], nc=("newlines",)),
    good("server-content", CW, [W], nc=("end-of-turn",)),
    good("trailing-space", CW + " " + EOS, [W], nc=("whitespace after",)),
    plain("prose", "The [ARGUMENTS] are listed below."),
    plain("fenced", "Format:\n```\n" + CW + CT + "\n```"),
    plain("answer", "Done." + EOS, "Done."),
    miss("mangled-marker", CW.replace(TC, "[TOOL CALLS]"), "tag"),
    miss("marker-bracket-lost", CW.replace(TC, "[TOOL_CALLS"), "tag", 0),
    miss("orphan-args", "Done.[ARGS]{}", "tag", 5),
    miss("no-args-marker", TC + 'get_weather{"city": "A"}' + EOS, "without [ARGS]"),
    miss("bad-json", CW.replace('"A"}', '"A"') + EOS, "JSON"),
    miss("truncated-json", CW[:-3], "truncated"),
    miss("truncated-name", "x" + TC + "get_wea", "truncated"),
    miss("args-not-object", TC + "f[ARGS][1, 2]" + EOS, "not an object"),
    miss("concatenated", CW + '{"city": "B"}' + EOS, "text after"),
    miss("text-after", CW + " thanks" + EOS, "text after"),
    miss("call-id-empty", TC + "f[CALL_ID][ARGS]{}" + EOS, "without an id"),
    miss("list-in-v11", DOC3 + EOS, "v3 call list"),
    miss("no-name", TC + '[ARGS]{"a": 1}', "v3 call list"),
    miss("junk-name", TC + "get weather[ARGS]{}", "without [ARGS]"),
    miss("duplicate-key", TC + 'f[ARGS]{"a": 1, "a": 2}', "repeated"),
    miss("orphan-marker-after", CW + "[TOOL_CALLS]", "truncated"),
]


@pytest.mark.parametrize("case", V3, ids=[c.id for c in V3])
def test_golden_v3(case: Case) -> None:
    check_case("mistral", case)


@pytest.mark.parametrize("case", V11, ids=[c.id for c in V11])
def test_golden_v11(case: Case) -> None:
    check_case("mistral-v11", case)


def test_enough_cases() -> None:
    check_enough(V3, V11)


def test_auto_picks_the_form() -> None:
    assert registry.parse("x" + DOC3 + EOS).dialect == "mistral"
    assert registry.parse("x" + CW + CT + EOS).dialect == "mistral-v11"


MUTATIONS = [
    ("", ""),
    ("[ARGS]", ""),
    ("[TOOL_CALLS]", "[TOOL_CALL]"),
    ("}", ""),
    ("]", ""),
    ("[TOOL_CALLS]", "TOOL_CALLS]"),
    (EOS, " more" + EOS),
]


@st.composite
def texts(draw: st.DrawFn) -> tuple[str, str]:
    version = draw(st.sampled_from(["v3", "v11"]))
    text = mistral.encode(draw(CONTENT), draw(CALLS), version)
    text = mutate(draw, text, MUTATIONS)
    return mistral.VERSIONS[version], text


@settings(max_examples=150, deadline=None)
@given(item=texts(), cuts=CUTS)
def test_stream_equals_one_shot(item: tuple[str, str], cuts: list[int]) -> None:
    dialect, text = item
    check_stream_cuts(dialect, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=CALLS, version=st.sampled_from(["v3", "v11"]))
def test_round_trip(content: str, calls: list[ToolCall], version: str) -> None:
    check_round_trip(mistral.VERSIONS[version], content, calls)
