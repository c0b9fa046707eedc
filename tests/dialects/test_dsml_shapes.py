"""Table-driven: every near-miss shape is found (not ok, with offset and reason); every
harmless deviation parses and is flagged non-canonical; prose is not a near miss."""

from __future__ import annotations

import pytest

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.dialects.dsml import EOS, MARK

CALLS = [ToolCall("get_weather", {"city": "Tokyo", "days": [1, 2]}), ToolCall("get_time", {})]
GOOD = dsml.encode_turn("Checking both.", CALLS)
GOOD32 = dsml.encode_turn("Checking both.", CALLS, "v32")
P_CITY = f'<{MARK}parameter name="city" string="true">'
INV_W = f'<{MARK}invoke name="get_weather">'


def _mut(old: str, new: str, base: str = GOOD) -> str:
    assert old in base
    return base.replace(old, new, 1)


# (id, text, where the error must point: a substring whose first index is the offset, reason)
NEAR_MISSES = [
    ("block-name-toolcalls", _mut("tool_calls>", "toolcalls>"), f"<{MARK}toolcalls>", "DSML tag"),
    ("block-name-calls", _mut(f"<{MARK}tool_calls>", f"<{MARK}calls>"), f"<{MARK}calls>", "DSML"),
    ("marker-lost", _mut(f"<{MARK}tool_calls>", "< calls>"), "< calls>", "without the DSML marker"),
    ("doubled-bars", _mut(MARK, "\uff5c\uff5cDSML\uff5c\uff5c"), "<\uff5c\uff5cDSML", "DSML"),
    ("ascii-bars", _mut(MARK, "|DSML|"), "<|DSML|", "mangled DSML marker"),
    ("ascii-bars-everywhere", GOOD.replace(MARK, "|DSML|"), "<|DSML|", "mangled DSML marker"),
    ("double-vertical-bars", _mut(MARK, "\u2016DSML\u2016"), "<\u2016DSML", "mangled"),
    (
        "space-after-marker",
        _mut(f"{MARK}tool_calls>", f"{MARK} tool_calls>"),
        "<\uff5cDSML",
        "DSML",
    ),
    ("invoke-opener-missing", _mut(INV_W + "\n", ""), P_CITY, "an opener missing"),
    ("block-opener-missing", _mut(f"<{MARK}tool_calls>\n", ""), INV_W, "outside a well-formed"),
    ("closer-without-opener", f"Done.\n</{MARK}invoke>", f"</{MARK}invoke>", "outside"),
    (
        "param-without-marker",
        _mut(P_CITY, '<parameter name="city" string="true">'),
        '<parameter name="city"',
        "without the DSML marker",
    ),
    (
        "param-without-string",
        _mut(P_CITY, f'<{MARK}parameter name="city">'),
        f'<{MARK}parameter name="city">',
        "string=",
    ),
    (
        "string-True",
        _mut('string="true"', 'string="True"'),
        f'<{MARK}parameter name="city"',
        "string=",
    ),
    (
        "typographic-quotes",
        _mut('name="get_weather"', "name=\u201cget_weather\u201d"),
        INV_W[:8],
        "typographic",
    ),
    (
        "mixed-v32-closer",
        _mut(f"</{MARK}tool_calls>", f"</{MARK}function_calls>"),
        f"</{MARK}function_calls>",
        "mixed dialects",
    ),
    (
        "mixed-hermes-inside",
        _mut(f"</{MARK}tool_calls>", '<tool_call>{"name": "x"}</tool_call>'),
        "<tool_call>",
        "mixed dialects",
    ),
    ("text-after-block", _mut(EOS, "\nLet me know!" + EOS), "Let me know", "text after"),
    ("salad-after-block", GOOD + "дляコンテンツа strSQLат", EOS, "after the tool-call block"),
    ("truncated-mid-value", GOOD[: GOOD.index("Tokyo") + 3], "Tok", "truncated"),
    ("truncated-no-closer", GOOD[: GOOD.index(f"</{MARK}tool_calls>")], None, "truncated"),
    (
        "repeated-parameter",
        _mut(P_CITY + "Tokyo", P_CITY + "Tokyo</\uff5cDSML\uff5cparameter>\n" + P_CITY + "Osaka"),
        None,
        "repeated parameter",
    ),
    ("bad-json-value", _mut("[1, 2]", "[1, 2"), "[1, 2", "not valid JSON"),
    ("concatenated-json-value", _mut("[1, 2]", "[1, 2][1, 2]"), "[1, 2][", "concatenated"),
    (
        "lost-parameter-closer",
        _mut("Tokyo</\uff5cDSML\uff5cparameter>", "Tokyo"),
        None,
        "lost closer",
    ),
    ("v32-block-in-v4-turn", GOOD32, f"<{MARK}function_calls>", "in a v4 turn"),
    (
        "fragment-before-block",
        _mut("Checking both.", "Checking <|DSML|both."),
        "<|DSML|",
        "before the block",
    ),
    (
        "all-markers-lost",
        'Reading.\n\n<invoke name="Read">\n<parameter name="path">a.py</parameter>\n</invoke>',
        "<invoke",
        "without the DSML marker",
    ),
    ("empty-block", f"<{MARK}tool_calls>\n</{MARK}tool_calls>" + EOS, None, "no invoke"),
]


@pytest.mark.parametrize(
    ("text", "at", "reason"), [c[1:] for c in NEAR_MISSES], ids=[c[0] for c in NEAR_MISSES]
)
def test_near_miss_is_found_not_ok(text: str, at: str | None, reason: str) -> None:
    version = "v4"
    result = dsml.parse(text, version)
    assert result.found, result
    assert not result.ok
    assert result.calls == ()
    assert result.error is not None
    assert reason in result.error, result.error
    assert result.offset is not None
    if at is not None:
        # the offset points at (or inside the tag of) the broken piece
        expected = text.index(at)
        assert expected <= result.offset <= expected + len(at), (
            result.offset,
            expected,
            result.error,
        )


# (id, text, expected noncanonical flag)
_SELF_CLOSING = _mut(
    f'<{MARK}invoke name="get_time">\n\n</{MARK}invoke>', f'<{MARK}invoke name="get_time"/>'
)
_INDENTED = GOOD.replace(f"\n<{MARK}invoke", f"\n    <{MARK}invoke").replace(
    f"\n<{MARK}parameter", f"\n        <{MARK}parameter"
)
_P_DAYS = f'<{MARK}parameter name="days" string="false">'
_JSON_BODY = _mut(
    f"{P_CITY}Tokyo</{MARK}parameter>\n{_P_DAYS}[1, 2]</{MARK}parameter>",
    '{"city": "Tokyo", "days": [1, 2]}',
)
DEVIATIONS = [
    ("self-closing-invoke", _SELF_CLOSING, "self-closing invoke"),
    ("indented-tags", _INDENTED, "indented tags"),
    ("no-blank-line", _mut("both.\n\n<", "both.\n<"), "no blank line before the block"),
    ("no-newline-at-all", _mut("both.\n\n<", "both.<"), "no blank line before the block"),
    ("no-eos", GOOD.removesuffix(EOS), "no end-of-turn token"),
    ("json-body", _JSON_BODY, "JSON object as the invoke body"),
    (
        "zero-args-no-empty-line",
        _mut('"get_time">\n\n<', '"get_time">\n<'),
        "no empty line in a zero-argument invoke",
    ),
    ("trailing-newline", _mut(EOS, "\n" + EOS), "whitespace after the block"),
]


@pytest.mark.parametrize(
    ("text", "flag"), [c[1:] for c in DEVIATIONS], ids=[c[0] for c in DEVIATIONS]
)
def test_harmless_deviation_parses_noncanonical(text: str, flag: str) -> None:
    result = dsml.parse(text, "v4")
    assert result.ok, (result.error, result.offset)
    assert flag in result.noncanonical
    assert list(result.calls) == CALLS
    assert result.content == "Checking both."


PROSE = [
    "You can invoke the weather tool with a city parameter name of your choice.",
    "| name | value |\n|---|---|\n| a | 1 |\n| b | 2 |",
    "Use `a || b` and `x | y` in shell pipelines.",
    'The parameter string must be quoted: name="x".',
    'In HTML, write <b>bold</b> and <a href="x">links</a>; 3 < 4 > 2.',
    "<tool_call> is another model family's tag.",
]


@pytest.mark.parametrize("text", PROSE)
def test_prose_is_not_a_near_miss(text: str) -> None:
    result = dsml.parse(text + EOS)
    assert not result.found, result.error
    assert result.ok


def test_ascii_marker_in_prose_is_a_near_miss() -> None:
    result = dsml.parse('Here: <|DSML|invoke name="f">' + EOS)
    assert result.found
    assert not result.ok
    assert result.offset == 6


def test_bare_block_tag_is_a_near_miss_even_in_prose() -> None:
    # A block tag that lost its marker cannot be told from a lost envelope: flagged.
    result = dsml.parse("Calls are listed in the <calls> section." + EOS)
    assert result.found
    assert not result.ok
