"""DeepSeek V3 / R1 and V3.1 markers: golden cases, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import deepseek_v3 as ds
from harness.dialects import registry
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

SB, SE, CB, CE, SEP, EOS = ds.CALLS_BEGIN, ds.CALLS_END, ds.CALL_BEGIN, ds.CALL_END, ds.SEP, ds.EOS
W = ToolCall("get_weather", {"city": "Tokyo"})
T = ToolCall("get_time", {})
V3W = f'{CB}function{SEP}get_weather\n```json\n{{"city": "Tokyo"}}\n```{CE}'
V3T = f"{CB}function{SEP}get_time\n```json\n{{}}\n```{CE}"
V31W = f'{CB}get_weather{SEP}{{"city": "Tokyo"}}{CE}'
V31T = f"{CB}get_time{SEP}{{}}{CE}"
DOC3 = SB + V3W + "\n" + V3T + SE
DOC31 = SB + V31W + V31T + SE

V3_CASES: list[Case] = [
    good("documented-example", DOC3 + EOS, [W, T], "", canonical=True),
    good("one-call", SB + V3W + SE + EOS, [W], canonical=True),
    good("text-before", "Let me check." + DOC3 + EOS, [W, T], "Let me check.", canonical=True),
    good(
        "r1-thinking-before",
        "<think>\nplan\n</think>\n\n" + DOC3 + EOS,
        [W, T],
        "<think>\nplan\n</think>",
    ),
    good("three-calls", SB + V3W + "\n" + V3T + "\n" + V3W + SE + EOS, [W, T, W]),
    good(
        "nested",
        SB + V3W.replace('{"city": "Tokyo"}', '{"a": [1, {"b": null}]}') + SE + EOS,
        [ToolCall("get_weather", {"a": [1, {"b": None}]})],
    ),
    good(
        "fence-in-string",
        SB + V3W.replace("Tokyo", "```x```") + SE + EOS,
        [ToolCall("get_weather", {"city": "```x```"})],
    ),
    good(
        "fence-without-json", SB + V3W.replace("```json", "```") + SE + EOS, [W], nc=("newlines",)
    ),
    good(
        "fence-on-one-line",
        SB + V3W.replace("\n```json\n", "```json").replace("\n```", "```") + SE + EOS,
        [W],
        nc=("newlines",),
    ),
    good("no-newline-between-calls", SB + V3W + V3T + SE + EOS, [W, T], nc=("newlines",)),
    good("newline-before-end", SB + V3W + "\n" + SE + EOS, [W], nc=("newlines",)),
    good("server-content", DOC3, [W, T], nc=("end-of-turn",)),
    plain("prose", "The tool sep is a special marker."),
    plain("fenced-markup", "Like:\n```\n" + SB + "\n```"),
    plain("eos-only", "Hi." + EOS, "Hi."),
    miss("ascii-bars", DOC3.replace(SB, "<|tool▁calls▁begin|>"), "tag", 0),
    miss("underscores", DOC3.replace(SB, "<｜tool_calls_begin｜>"), "tag", 0),
    miss("call-outside-section", V3W + EOS, "tag", 0),
    miss("orphan-end", "Done." + CE, "tag", 5),
    miss("type-not-function", SB + V3W.replace("function", "method", 1) + SE, "not function"),
    miss("no-fence", SB + f'{CB}function{SEP}get_weather\n{{"city": "Tokyo"}}{CE}' + SE, "fence"),
    miss("v31-style-in-v3", DOC31 + EOS, "V3.1-style"),
    miss("bad-json", SB + V3W.replace('"Tokyo"}', '"Tokyo"') + SE, "not valid JSON"),
    miss("args-not-object", SB + V3W.replace('{"city": "Tokyo"}', '"x"') + SE, "not an object"),
    miss("sep-lost", SB + V3W.replace(SEP, "") + SE, "without"),
    miss("call-end-lost", SB + V3W.replace(CE, "") + "\n" + V3T + SE, "not closed"),
    miss("section-end-lost", SB + V3W + EOS, "truncated"),
    miss("truncated", DOC3[:60], "truncated"),
    miss("text-after", DOC3 + "\nDone." + EOS, "text after"),
    miss("empty-section", SB + SE, "no call"),
    miss("junk-in-section", SB + "x" + V3W + SE, "expected"),
    miss(
        "unclosed-fence",
        SB + f'{CB}function{SEP}get_weather\n```json\n{{"a": 1}}{CE}' + SE,
        "fence",
    ),
]

V31_CASES: list[Case] = [
    good("documented-example", DOC31 + EOS, [W, T], "", canonical=True),
    good("one-call", SB + V31W + SE + EOS, [W], canonical=True),
    good("text-before", "Checking." + DOC31 + EOS, [W, T], "Checking.", canonical=True),
    good("think-closed-before", "</think>Checking." + DOC31 + EOS, [W, T], "</think>Checking."),
    good("three-calls", SB + V31W + V31T + V31W + SE + EOS, [W, T, W]),
    good(
        "nested",
        SB + V31W.replace('{"city": "Tokyo"}', '{"a": {"b": [true]}}') + SE + EOS,
        [ToolCall("get_weather", {"a": {"b": [True]}})],
    ),
    good(
        "unicode",
        SB + V31W.replace("Tokyo", "東京") + SE + EOS,
        [ToolCall("get_weather", {"city": "東京"})],
    ),
    good("newlines-between-calls", SB + V31W + "\n" + V31T + SE + EOS, [W, T], nc=("newlines",)),
    good("newline-after-begin", SB + "\n" + V31W + SE + EOS, [W], nc=("newlines",)),
    good(
        "spaces-around-name",
        SB + V31W.replace("get_weather", " get_weather ") + SE + EOS,
        [W],
        nc=("newlines",),
    ),
    good(
        "json-with-spaces",
        SB + V31W.replace('{"city": "Tokyo"}', ' {"city": "Tokyo"} ') + SE + EOS,
        [W],
    ),
    good("server-content", DOC31, [W, T], nc=("end-of-turn",)),
    plain("prose", "Nothing to call."),
    plain("fenced", "```\n" + DOC31 + "\n```"),
    plain("eos", "Done." + EOS, "Done."),
    miss("v3-style-in-v31", DOC3 + EOS, "V3-style"),
    miss("mangled-begin", DOC31.replace(SB, "<｜tool▁calls▁begin>"), "tag", 0),
    miss("ascii", DOC31.replace(SB, "<|tool_calls_begin|>"), "tag", 0),
    miss("call-outside", V31W + EOS, "tag", 0),
    miss("orphan-sep", "a" + SEP + "b", "tag", 1),
    miss("bad-json", SB + V31W.replace("}", "", 1) + SE, "not valid JSON"),
    miss("concatenated-json", SB + V31W.replace("}", "}{}", 1) + SE, "concatenated"),
    miss("args-array", SB + V31W.replace('{"city": "Tokyo"}', "[]") + SE, "not an object"),
    miss("name-with-space", SB + V31W.replace("get_weather", "get weather") + SE, "malformed"),
    miss("sep-lost", SB + V31W.replace(SEP, "") + SE, "without"),
    miss("end-lost", SB + V31W.replace(CE, "") + V31T + SE, "not closed"),
    miss("section-end-lost", SB + V31W, "truncated"),
    miss("truncated", DOC31[:40], "truncated"),
    miss("text-after", DOC31 + "ok", "text after"),
    miss("empty-section", SB + SE + EOS, "no call"),
    miss("second-section", DOC31 + DOC31, "stray tag"),
]


@pytest.mark.parametrize("case", V3_CASES, ids=[c.id for c in V3_CASES])
def test_golden_v3(case: Case) -> None:
    check_case("deepseek-v3", case)


@pytest.mark.parametrize("case", V31_CASES, ids=[c.id for c in V31_CASES])
def test_golden_v31(case: Case) -> None:
    check_case("deepseek-v31", case)


def test_enough_cases() -> None:
    check_enough(V3_CASES, V31_CASES)


def test_auto_and_aliases() -> None:
    assert registry.parse("x" + DOC3 + EOS).dialect == "deepseek-v3"
    assert registry.parse("x" + DOC31 + EOS).dialect == "deepseek-v31"
    assert registry.get("deepseek_v31").name == "deepseek-v31"
    assert registry.get("deepseekv3").name == "deepseek-v3"


MUTATIONS = [
    ("", ""),
    (CE, ""),
    (SE, ""),
    (SEP, ""),
    ("｜>", "|>"),
    ("}", ""),
    ("```", "``"),
    (EOS, "\nmore" + EOS),
]


@st.composite
def texts(draw: st.DrawFn) -> tuple[str, str]:
    version = draw(st.sampled_from(["v3", "v31"]))
    text = ds.encode(draw(CONTENT), draw(CALLS), version)
    text = mutate(draw, text, MUTATIONS)
    return ds.VERSIONS[version], text


@settings(max_examples=150, deadline=None)
@given(item=texts(), cuts=CUTS)
def test_stream_equals_one_shot(item: tuple[str, str], cuts: list[int]) -> None:
    dialect, text = item
    check_stream_cuts(dialect, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=CALLS, version=st.sampled_from(["v3", "v31"]))
def test_round_trip(content: str, calls: list[ToolCall], version: str) -> None:
    check_round_trip(ds.VERSIONS[version], content, calls)
