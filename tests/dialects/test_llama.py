"""Llama 3 JSON and Llama 4 pythonic: golden cases, streaming, round trips."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.dialects import llama, registry
from harness.dialects.base import ToolCall
from tests.dialects.golden import (
    CALLS,
    CUTS,
    Case,
    check_case,
    check_enough,
    check_stream_cuts,
    good,
    miss,
    mutate,
    plain,
)

EOT, EOM, EOT4 = "<|eot_id|>", "<|eom_id|>", "<|eot|>"
S = ToolCall("get_weather", {"city": "SF"})
J = '{"name": "get_weather", "parameters": {"city": "SF"}}'
P = '[get_weather(city="SF", days=3), get_time()]'
PC = [ToolCall("get_weather", {"city": "SF", "days": 3}), ToolCall("get_time", {})]

L3: list[Case] = [
    good("documented-example", J + EOT, [S], "", canonical=True),
    good("leading-newline", "\n" + J + EOT, [S]),
    good("python-tag-json", "<|python_tag|>" + J + EOM, [S], nc=("python_tag",)),
    good(
        "builtin-call",
        '<|python_tag|>brave_search.call(query="weather SF")' + EOM,
        [ToolCall("brave_search", {"query": "weather SF"})],
        canonical=True,
    ),
    good(
        "builtin-two-args",
        '<|python_tag|>wolfram_alpha.call(query="2+2", n=1)' + EOM,
        [ToolCall("wolfram_alpha", {"query": "2+2", "n": 1})],
    ),
    good(
        "python-tag-arguments-key",
        '<|python_tag|>{"name": "get_weather", "arguments": {"city": "SF"}}' + EOT,
        [S],
        nc=("arguments",),
    ),
    good("semicolon-separated", J + "; " + J + EOT, [S, S], nc=("several",)),
    good(
        "nested",
        '{"name": "f", "parameters": {"a": {"b": [1, null]}}}' + EOT,
        [ToolCall("f", {"a": {"b": [1, None]}})],
    ),
    good(
        "empty-parameters",
        '{"name": "get_time", "parameters": {}}' + EOT,
        [ToolCall("get_time", {})],
    ),
    good(
        "braces-in-string",
        '{"name": "f", "parameters": {"q": "{x}"}}' + EOT,
        [ToolCall("f", {"q": "{x}"})],
    ),
    good("compact-json", '{"name":"get_weather","parameters":{"city":"SF"}}' + EOT, [S]),
    good("server-content", J, [S], nc=("end-of-turn",)),
    good("trailing-newline", J + "\n" + EOT, [S], nc=("whitespace after",)),
    plain("answer", "It is sunny." + EOT, "It is sunny."),
    plain("other-json", '{"city": "SF", "days": 3}'),
    plain("hermes-shaped-json-is-not-llama", '{"name": "x", "arguments": {}} is the shape.'),
    plain("fenced-call", "Call it like:\n```json\n" + J + "\n```"),
    plain("json-in-prose", 'Write {"name": "f", "parameters": {}} to call f.'),
    miss("text-before", "Let me check.\n" + J + EOT, "text before", 14),
    miss("text-after", J + " Done." + EOT, "text after", len(J) + 1),
    miss("broken-json", J[:-2] + EOT, "JSON"),
    miss("truncated", J[:45], "truncated"),
    miss("unbalanced-extra-brace", J + "}" + EOT, "text after"),
    miss("concatenated", J + J + EOT, "text after"),
    miss("extra-key", '{"name": "f", "parameters": {}, "id": 1}' + EOT, "keys"),
    miss("parameters-not-object", '{"name": "f", "parameters": [1]}' + EOT, "not a JSON object"),
    miss("name-not-string", '{"name": "", "parameters": {}}' + EOT, "string name"),
    miss("duplicate-key", '{"name": "f", "parameters": {"a": 1, "a": 2}}' + EOT, "repeated"),
    miss("mangled-python-tag", "<|python_tag>" + J + EOT, "mangled", 0),
    miss("python-tag-no-bars", "<python_tag|>" + J, "mangled", 0),
    miss("python-tag-junk", "<|python_tag|>hello" + EOM, "JSON"),
    miss("builtin-truncated", '<|python_tag|>brave_search.call(query="we', "truncated"),
    miss("semicolon-then-junk", J + "; nope" + EOT, "JSON"),
]

L4: list[Case] = [
    good("documented-example", P + EOT4, PC, "", canonical=True),
    good("one-call", '[get_weather(city="SF")]' + EOT4, [S], canonical=True),
    good("wrapped", "<|python_start|>" + P + "<|python_end|>" + EOT4, PC, canonical=True),
    good("single-quotes", "[get_weather(city='SF')]" + EOT4, [S]),
    good(
        "python-literals",
        "[f(on=True, off=False, none=None)]" + EOT4,
        [ToolCall("f", {"on": True, "off": False, "none": None})],
    ),
    good(
        "nested-literals",
        '[f(a=[1, 2.5, "x"], b={"k": (1, 2)})]' + EOT4,
        [ToolCall("f", {"a": [1, 2.5, "x"], "b": {"k": (1, 2)}})],
    ),
    good("negative-numbers", "[f(n=-3, x=-0.5)]" + EOT4, [ToolCall("f", {"n": -3, "x": -0.5})]),
    good("multiline", '[\n  get_weather(city="SF", days=3),\n  get_time()\n]' + EOT4, PC),
    good("no-args", "[get_time()]" + EOT4, [ToolCall("get_time", {})]),
    good("eot-id", P + EOT, PC),
    good("server-content", P, PC, nc=("end-of-turn",)),
    good("leading-space", " " + P + EOT4, PC),
    good("brackets-in-string", '[f(q="[a(b)]")]' + EOT4, [ToolCall("f", {"q": "[a(b)]"})]),
    plain("prose-quoting-a-call", "You could call [get_weather(city='SF')] for that."),
    plain("answer", "Sunny today." + EOT4, "Sunny today."),
    plain("fenced", "```python\n" + P + "\n```"),
    plain("plain-list", "[1, 2, 3]"),
    miss("unbalanced", P[:-1] + EOT4, "call list"),
    miss("truncated", P[:20], "truncated"),
    miss("positional-arg", '[get_weather("SF")]' + EOT4, "positional"),
    miss("dotted-name", '[tools.get_weather(city="SF")]' + EOT4, "dotted"),
    miss("not-a-literal", "[f(x=os.system)]" + EOT4, "not a literal"),
    miss("star-kwargs", "[f(**opts)]" + EOT4, "**"),
    miss("text-after", P + " and done" + EOT4, "list of calls"),
    miss("item-not-call", '[get_weather(city="SF"), 3]' + EOT4, "not a call"),
    miss("json-true", "[f(on=true)]" + EOT4, "not a literal"),
    miss("unclosed-wrapper", "<|python_start|>" + P + EOT4, "not closed"),
    miss("mangled-wrapper", "<|python_start>" + P, "mangled", 0),
    miss("wrapper-text-after", "<|python_start|>" + P + "<|python_end|> ok", "text after"),
    miss("missing-comma", "[f(a=1) g(b=2)]" + EOT4, "call list"),
    miss("repeated-keyword", "[f(a=1, a=2)]" + EOT4, "repeated"),
    miss("unterminated-string", '[f(a="x)]' + EOT4, "call list"),
]


@pytest.mark.parametrize("case", L3, ids=[c.id for c in L3])
def test_golden_llama3(case: Case) -> None:
    check_case("llama3-json", case)


@pytest.mark.parametrize("case", L4, ids=[c.id for c in L4])
def test_golden_llama4(case: Case) -> None:
    check_case("llama4-pythonic", case)


def test_enough_cases() -> None:
    check_enough(L3, L4)


def test_aliases_and_auto() -> None:
    assert registry.parse(J + EOT).dialect == "llama3-json"
    assert registry.get("llama3_json").name == "llama3-json"
    assert registry.get("pythonic").name == "llama4-pythonic"
    # auto takes a call list when the markup tells: the output is one, or holds the wrapper
    assert registry.parse(P + EOT4).dialect == "llama4-pythonic"
    assert registry.parse(P + EOT4).calls == registry.get("pythonic").parse(P + EOT4).calls
    assert registry.detect("<|python_start|>" + P) == "llama4-pythonic"
    # ... but not a list that does not parse whole: an answer opening with a markdown link
    for prose in ["[f(x)](https://example.org) explains it.", P + " and then some text"]:
        assert registry.detect(prose) == "none", prose
        assert not registry.parse(prose).found
        assert registry.get("pythonic").parse(prose + EOT4).found  # named, a near miss
    with pytest.raises(ValueError, match="no content"):
        llama.encode("Hi", [S])


MUTATIONS = [("", ""), ("}", ""), (")", ""), ('"', "'"), ("[", "("), ("<|eot", " x<|eot")]
ARGS_OK = CALLS.filter(lambda cs: all(all(k.isidentifier() for k in c.arguments) for c in cs))


@st.composite
def texts(draw: st.DrawFn) -> tuple[str, str]:
    version = draw(st.sampled_from(["json", "pythonic"]))
    calls = draw(ARGS_OK)
    text = llama.encode("", calls, version) if calls else llama.encode("hi", [], version)
    text = mutate(draw, text, MUTATIONS)
    return llama.VERSIONS[version], text


@settings(max_examples=150, deadline=None)
@given(item=texts(), cuts=CUTS)
def test_stream_equals_one_shot(item: tuple[str, str], cuts: list[int]) -> None:
    dialect, text = item
    check_stream_cuts(dialect, text, cuts)


@settings(max_examples=150, deadline=None)
@given(calls=ARGS_OK.filter(bool), version=st.sampled_from(["json", "pythonic"]))
def test_round_trip(calls: list[ToolCall], version: str) -> None:
    result = llama.parse(llama.encode("", calls, version), version)
    assert result.ok, result.error
    assert list(result.calls) == calls
    assert result.content == ""
    assert result.noncanonical == (
        () if len(calls) == 1 or version == "pythonic" else (llama.NC_SEVERAL,)
    )
