"""Every dialect through the classifier: a well-formed call is a call (its special tokens are
not salad), markup left in a server's content is a parser leak, a broken envelope is a
malformed tool call."""

from __future__ import annotations

import pytest

from harness import labels as L
from harness.dialects import registry
from harness.dialects.base import ToolCall
from harness.verdict import classify_turn
from tests.dialects.golden import tool

CALLS = [ToolCall("get_weather", {"city": "Tokyo"})]
TOOLS = [tool("get_weather", city={"type": "string"})]
DIALECTS = sorted(set(registry.names()) - {"auto", "dsml", "json", "none"})
#: (dialect, how to break its envelope): a closer or a marker lost or mangled
BREAKS = {
    "deepseek-v3": ("<\uff5ctool\u2581call\u2581end\uff5c>", ""),
    "deepseek-v31": ("<\uff5ctool\u2581sep\uff5c>", "<|tool_sep|>"),
    "dsml-v32": ("</\uff5cDSML\uff5cparameter>", ""),
    "dsml-v4": ("</\uff5cDSML\uff5cparameter>", ""),
    "glm45": ("</arg_value>", ""),
    "glm47": ("</arg_value>", ""),
    "gpt-oss": ("<|message|>", "<|message>"),
    "hermes": ("</tool_call>", ""),
    "kimi-k2": ("<|tool_call_end|>", ""),
    "llama3-json": ("}}", "}"),
    "llama4-pythonic": (")]", "]"),
    "minimax-m2": ("</parameter>", ""),
    "mistral": ("[TOOL_CALLS]", "[TOOL_CALL]"),
    "mistral-v11": ("[ARGS]", "[ARG]"),
    "qwen3-coder": ("</parameter>", ""),
}


def _turn(name: str) -> str:
    content = "" if name.startswith("llama") else "Let me check the weather for you."
    return registry.get(name).encode(content, CALLS)


@pytest.mark.parametrize("name", DIALECTS)
def test_a_well_formed_call_is_a_call(name: str) -> None:
    verdict = classify_turn(_turn(name), source="raw", tools=TOOLS, dialect=name)
    assert verdict.label == L.OK_TOOL_CALL, verdict.evidence
    assert verdict.tool_calls == [c.to_dict() for c in CALLS]


@pytest.mark.parametrize("name", DIALECTS)
def test_markup_in_server_content_is_a_leak(name: str) -> None:
    for dialect in ("auto", name):  # (a whole call list tells Llama 4 pythonic too)
        verdict = classify_turn(_turn(name), source="server", tools=TOOLS, dialect=dialect)
        assert verdict.label == L.PARSER_LEAK, (dialect, verdict.evidence)


@pytest.mark.parametrize("name", DIALECTS)
def test_a_broken_envelope_is_malformed(name: str) -> None:
    old, new = BREAKS[name]
    text = _turn(name)
    assert old in text
    broken = text.replace(old, new, 1)
    if name == "llama4-pythonic":
        # never guessed, so not masked when broken: a broken list reads as symbol soup
        verdict = classify_turn(broken, source="raw", tools=TOOLS, dialect=name)
        assert verdict.corrupted
        return
    for dialect in ("auto", name):
        verdict = classify_turn(broken, source="raw", tools=TOOLS, dialect=dialect)
        assert verdict.label == L.MALFORMED_TOOL_CALL, (dialect, verdict.evidence)
