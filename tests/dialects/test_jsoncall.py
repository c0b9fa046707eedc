"""Bare JSON tool calls: near misses found, valid JSON and prose left alone; bare invoke shapes
with every DSML marker lost; the registry's fallback order."""

from __future__ import annotations

import json

import pytest

from harness.dialects import dsml, hermes, jsoncall, registry
from harness.dialects.base import ToolCall

CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris", "days": 3}})
PLAIN = json.dumps({"city": "Paris", "days": 3})

PRE = "Let me check.\n\n"
# (id, text, offset of the near miss: the second value, or where the JSON breaks)
NEAR_MISSES = [
    ("concat-two", CALL + CALL, len(CALL)),
    ("concat-three", CALL * 3, len(CALL)),
    ("concat-no-name", PLAIN + PLAIN, len(PLAIN)),
    ("concat-space", CALL + " " + CALL, len(CALL) + 1),
    ("concat-after-prose", PRE + CALL + CALL, len(PRE) + len(CALL)),
    ("concat-arrays", f"[{CALL}][{CALL}]", len(CALL) + 2),
    ("concat-before-eos", CALL + CALL + "<|im_end|>", len(CALL)),
    ("unbalanced", CALL[:-1], None),
    ("missing-quote", CALL.replace('"Paris"', '"Paris'), None),
    ("extra-brace", CALL + "}", len(CALL)),
    ("whole-output-broken-object", '{"results": [{"sku": "A-1", "qty": 3}, "qty": 7}', None),
]


@pytest.mark.parametrize(
    ("text", "at"), [c[1:] for c in NEAR_MISSES], ids=[c[0] for c in NEAR_MISSES]
)
def test_near_miss(text: str, at: int | None) -> None:
    result = jsoncall.parse(text)
    assert result.found
    assert not result.ok
    assert result.error
    assert result.offset is not None
    if at is not None:
        assert result.offset == at
    via_registry = registry.parse(text)
    assert via_registry.found
    assert not via_registry.ok
    assert via_registry.dialect == "json"


CLEAN = [
    ("one-call-object", CALL),
    ("one-object", PLAIN),
    ("json-lines", PLAIN + "\n" + PLAIN + "\n" + PLAIN),
    ("array-of-similar-objects", json.dumps([{"id": i, "ok": True} for i in range(5)])),
    ("object-in-prose", f"The tool returned {PLAIN} {PLAIN} as usual."),
    ("object-then-text", PLAIN + " and that is all."),
    ("fenced", "```json\n" + PLAIN + PLAIN + "\n```"),
    ("python-dict", "{'city': 'Paris', 'days': 3}"),
    ("code-block-ending-in-brace", "int main(void) {\n  return 0;\n}"),
    ("latex", r"\frac{a}{b} = \left\{x\right\}"),
    ("prose", "No JSON here, only words {and braces}."),
]


@pytest.mark.parametrize("text", [c[1] for c in CLEAN], ids=[c[0] for c in CLEAN])
def test_valid_json_and_prose_are_content(text: str) -> None:
    assert jsoncall.first_marker(text) == -1
    result = registry.parse(text)
    assert not result.found
    assert result.ok
    assert result.content == text


def test_json_never_makes_a_turn_mixed() -> None:
    # broken JSON inside a Hermes block is the Hermes dialect's near miss, not "mixed"
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n<|im_end|>'
    result = registry.parse(text)
    assert result.dialect == "hermes"
    assert result.error is not None
    assert "mixed" not in result.error
    good = hermes.encode_turn("x", [ToolCall("f", {"a": 1})])
    assert registry.parse(good).ok


P = "Let me look that up.\n\n"
BARE_INVOKES = [
    (
        "crlf",
        P + '<invoke name="get_weather">\r\n<parameter name="city">Paris</parameter>\r\n</invoke>',
    ),
    (
        "indented",
        P + '<invoke name="f">\n        <parameter name="city">Paris</parameter>\n</invoke>',
    ),
    ("json-body", P + '<invoke name="get_weather">\n{"city": "Paris"}\n</invoke>'),
    ("zero-args", P + '<invoke name="get_time">\n\n</invoke>'),
    ("self-closing", P + '<invoke name="get_time"/>'),
    ("one-line", P + '<invoke name="f"><parameter name="city">Paris</parameter></invoke>'),
]


@pytest.mark.parametrize("text", [c[1] for c in BARE_INVOKES], ids=[c[0] for c in BARE_INVOKES])
def test_bare_invoke_with_every_marker_lost_is_a_near_miss(text: str) -> None:
    result = registry.parse(text)
    assert result.found
    assert not result.ok
    assert result.offset == text.index("<invoke")
    assert result.error is not None
    assert "without the DSML marker" in result.error


@pytest.mark.parametrize(
    "text",
    [
        "Use the invoke name to call it: invoke name=f then parameter x.",
        "An <invoke> element is XML; so is <parameter>.",
        'Set <input name="q"> and then {"a": 1}.',
        "Call invoke() with a name= argument and {braces}.",
    ],
)
def test_xml_like_prose_is_not_a_near_miss(text: str) -> None:
    assert dsml.find_fragment(text) is None
    assert not registry.parse(text).found
