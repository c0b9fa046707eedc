"""gpt-oss Harmony: golden cases from the documented format, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import harmony, registry
from harness.dialects.base import ToolCall
from tests.dialects.golden import (
    ARGS,
    CONTENT,
    CUTS,
    NAMES,
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
from tests.dialects.golden import (
    ToolCall as _TC,
)

D = "gpt-oss"
A = "<|channel|>analysis<|message|>Need weather.<|end|>"
S = "<|start|>assistant"
CALL_SF = (
    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    '{"location":"SF"}<|call|>'
)
W = ToolCall("get_weather", {"location": "SF"})
DOC = A + S + CALL_SF  # the documented example
FINAL = "<|channel|>final<|message|>It is sunny.<|return|>"
PRE = "<|channel|>commentary<|message|>Checking the weather.<|end|>"

CASES: list[Case] = [
    good("documented-example", DOC, [W], "", canonical=True),
    good("call-first", CALL_SF, [W], "", canonical=True),
    good("preamble-then-call", PRE + S + CALL_SF, [W], "Checking the weather.", canonical=True),
    good("analysis-preamble-call", A + S + PRE + S + CALL_SF, [W], "Checking the weather."),
    good("final-answer", FINAL, [], "It is sunny.", canonical=True),
    good("analysis-then-final", A + S + FINAL, [], "It is sunny.", canonical=True),
    good("two-analysis", A + S + A + S + FINAL, [], "It is sunny."),
    good("empty-args", CALL_SF.replace('{"location":"SF"}', "{}"), [ToolCall("get_weather", {})]),
    good(
        "nested-args",
        CALL_SF.replace('{"location":"SF"}', '{"q": {"a": [1, true, null]}, "s": "x<y"}'),
        [ToolCall("get_weather", {"q": {"a": [1, True, None]}, "s": "x<y"})],
    ),
    good(
        "unicode-args",
        CALL_SF.replace("SF", "東京"),
        [ToolCall("get_weather", {"location": "東京"})],
    ),
    good(
        "recipient-in-role",
        A + S + " to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>"
        '{"location":"SF"}<|call|>',
        [W],
        nc=("role header",),
    ),
    good(
        "recipient-in-role-bare-json",
        A + S + " to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"location":"SF"}<|call|>',
        [W],
        nc=("constrain",),
    ),
    good("no-constrain", CALL_SF.replace(" <|constrain|>json", ""), [W], nc=("constrain",)),
    good("bare-recipient", CALL_SF.replace("functions.", ""), [W], nc=("without functions",)),
    good("no-stop-token-call", CALL_SF.removesuffix("<|call|>"), [W], nc=("end-of-turn",)),
    good(
        "no-stop-token-final",
        FINAL.removesuffix("<|return|>"),
        [],
        "It is sunny.",
        nc=("end-of-turn",),
    ),
    good(
        "final-ended-by-end",
        FINAL.replace("<|return|>", "<|end|>"),
        [],
        "It is sunny.",
        nc=("<|end|>",),
    ),
    good("newline-between-messages", A + "\n" + S + CALL_SF, [W], nc=("between",)),
    good("start-on-first-message", S + CALL_SF, [W], nc=("first message",)),
    plain("plain-server-content", "It is sunny in SF."),
    plain("fenced-harmony", "The format:\n```\n" + DOC + "\n```\nas documented."),
    plain("prose-pipes", "a | b | end | c"),
    miss("mangled-channel", DOC.replace("<|channel|>", "<|channel>", 1), "Harmony-like", 0),
    miss("bars-only", "|channel|analysis|message|Need weather.", "Harmony-like", 0),
    miss(
        "tokens-lost-leak",
        'analysisNeed weather.assistantcommentary to=functions.get_weather json{"location":"SF"}',
        "to=functions",
        41,
    ),
    miss("bad-json", CALL_SF.replace('"SF"}', '"SF"'), "not valid JSON"),
    miss("args-not-object", CALL_SF.replace('{"location":"SF"}', "[1]"), "not an object"),
    miss("truncated-args", CALL_SF[:-12], "truncated"),
    miss("truncated-analysis", "<|channel|>analysis<|message|>Need wea", "truncated"),
    miss("truncated-header", "<|channel|>commentary to=functions.get_wea", "truncated"),
    miss("text-after-call", DOC + " and then", "text after the call"),
    miss("message-after-call", DOC + S + FINAL, "text after the call"),
    miss("text-after-final", FINAL + "P.S.", "text after the final"),
    miss("text-before", "Sure! " + DOC, "before the first", 6),
    miss("unknown-channel", "<|channel|>thoughts<|message|>hm<|end|>", "unknown channel"),
    miss(
        "call-ended-by-end",
        CALL_SF.replace("<|call|>", "<|end|>") + S + FINAL,
        "instead of <|call|>",
    ),
    miss("message-not-ended", A.replace("<|end|>", "") + S + FINAL, "not ended"),
    miss("missing-start", A + CALL_SF, "<|start|>assistant"),
    miss("analysis-ends-turn", A, "no final answer"),
    miss(
        "malformed-header",
        "<|channel|>commentary to=functions.f <|constrain|> json <|message|>{}<|call|>",
        "malformed message header",
    ),
    miss("call-on-final", "<|channel|>final to=functions.f<|message|>{}<|call|>", "final channel"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_golden(case: Case) -> None:
    check_case(D, case)


def test_enough_cases() -> None:
    check_enough(CASES)


def test_auto_and_aliases() -> None:
    assert registry.parse(DOC).dialect == D
    assert registry.get("openai").name == D
    assert registry.get("gpt-oss").name == D
    with pytest.raises(ValueError, match="one tool call"):
        harmony.encode("x", [W, W])


MUTATIONS = [
    ("", ""),
    ("<|call|>", ""),
    ("<|end|>", "<|end>"),
    ("<|message|>", "<|message|"),
    ("<|constrain|>", ""),
    ('"}', '"'),
    ("<|start|>assistant", ""),
    ("<|return|>", "<|return|> more"),
]


@st.composite
def texts(draw: st.DrawFn) -> str:
    calls = draw(st.lists(st.builds(_TC, NAMES, ARGS), max_size=1))
    text = harmony.encode(draw(CONTENT), calls)
    if draw(st.booleans()):
        text = "<|channel|>analysis<|message|>" + draw(CONTENT) + "<|end|><|start|>assistant" + text
    text = mutate(draw, text, MUTATIONS)
    return text


@settings(max_examples=150, deadline=None)
@given(text=texts(), cuts=CUTS)
def test_stream_equals_one_shot(text: str, cuts: list[int]) -> None:
    check_stream_cuts(D, text, cuts)


@settings(max_examples=150, deadline=None)
@given(content=CONTENT, calls=st.lists(st.builds(_TC, NAMES, ARGS), max_size=1))
def test_round_trip(content: str, calls: list[ToolCall]) -> None:
    check_round_trip(D, content, calls)
