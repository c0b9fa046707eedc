"""The pieces of the DSML grammar shared by the one-shot parser (dsml.py) and the stream
parser (stream.py): markers, the near-miss fragment scanner, and the invoke parser."""

from __future__ import annotations

import re
from typing import Any

from harness.dialects.base import ToolCall
from harness.dialects.jsonstrict import StrictJSONError, loads_strict, raw_decode_strict

BAR = "\uff5c"  # FULLWIDTH VERTICAL LINE
MARK = f"{BAR}DSML{BAR}"
EOS = f"<{BAR}end\u2581of\u2581sentence{BAR}>"
BLOCKS = {"v4": "tool_calls", "v32": "function_calls"}
OPENERS = {version: f"<{MARK}{block}>" for version, block in BLOCKS.items()}
PARAM_CLOSE = f"</{MARK}parameter>"
INVOKE_CLOSE = f"</{MARK}invoke>"

NC_NO_EOS = "no end-of-turn token"
NC_NO_BLANK_LINE = "no blank line before the block"
NC_INDENTED = "indented tags"
NC_SELF_CLOSING = "self-closing invoke"
NC_NO_EMPTY_LINE = "no empty line in a zero-argument invoke"
NC_JSON_BODY = "JSON object as the invoke body"
NC_TRAILING_WS = "whitespace after the block"
NC_NO_NEWLINE = "a canonical newline missing between tags"

_WS = " \t"
# Look-alikes of the fullwidth bar seen in corrupted envelopes (ASCII '|' handled apart,
# since markdown tables are full of it): fullwidth, double, divides, box drawing, broken.
_BARS = "\uff5c\u2016\u2223\u2502\u00a6"

#: Fragments that only DSML-like markup contains. Every alternative starts with '<', a
#: bar, or "DSML", and is at most FRAGMENT_MAX characters long (the stream parser relies
#: on both). Plain prose ("invoke the tool", a '|' table) matches none of them.
FRAGMENT_MAX = 128
_LT = r"(?:<[ \t]?/?[ \t]?)?"  # a fragment starts at its tag's '<' when there is one
_FRAGMENT = re.compile(
    rf"{_LT}[{_BARS}]{{1,2}}[ \t]?DSML|DSML[ \t]?[{_BARS}]"  # the marker, right or mangled
    rf"|{_LT}\|{{1,2}}DSML|DSML\|"  # ASCII bars: <|DSML|tool_calls>
    r"|</?[ \t]{0,2}DSML"  # bars lost: <DSML...
    r"|<[ \t]{0,2}/?[ \t]{0,2}(?:tool_?calls|function_?calls|calls)[ \t]{0,2}>"  # marker lost
    r"|<[ \t]{1,3}/?[ \t]{0,2}(?:invoke|parameter)[ \t>]"  # "< invoke": a space for the marker
    r"|<(?:invoke|parameter)[ \t]{1,3}name[ \t]?=[^\n<>]{0,80}?string[ \t]?="  # DSML attrs
    # bare invoke nesting: the envelope with every marker lost. A named invoke that is
    # self-closing, or followed (after any whitespace, CRLF and indentation included) by a
    # parameter, a JSON body or its own closer; a parameter closer followed by an invoke
    # closer. Prose never writes these; documentation quoting them is tool markup anyway.
    r"|<invoke[ \t]{1,3}name[ \t]?=[^\n<>]{0,80}?"
    r"(?:/>|>\s{0,12}(?:<parameter[ \t=>]|\{|</invoke>))"
    r"|</parameter>\s{0,12}</invoke>",
    re.IGNORECASE,
)
#: Cheap gate in front of _FRAGMENT: every fragment holds "DSML" (in some case) or a '<'
#: followed by one of the tag words; both scans run at memchr speed, the full pattern does
#: not (it is tried at every position).
_GATE_TAG = re.compile(r"<[ \t/]{0,5}(?i:tool|function|calls|invoke|parameter)")

_INVOKE = re.compile(r'<\uff5cDSML\uff5cinvoke name="([^"\n<>]+)"([ \t]*/)?>')
_PARAM = re.compile(r'<\uff5cDSML\uff5cparameter name="([^"\n<>]*)" string="(true|false)">')
_HERMES_TAG = re.compile(r"<\s*/?\s*tool_call\s*>")
_BARE_TAG = re.compile(r"<\s*/?\s*(invoke|parameter)\b")


class DsmlError(ValueError):
    def __init__(self, reason: str, offset: int) -> None:
        super().__init__(f"{reason} at offset {offset}")
        self.reason = reason
        self.offset = offset

    @classmethod
    def at(cls, text: str, pos: int, reason: str) -> DsmlError:
        """An error at ``pos``; called "truncated" when no tag can close after it."""
        if ">" not in text[pos:]:
            return cls(f"truncated block: {reason}", pos)
        return cls(reason, pos)


def find_fragment(text: str, start: int = 0, end: int | None = None) -> re.Match[str] | None:
    """The first DSML-like fragment in ``text[start:end]``."""
    end = len(text) if end is None else end
    if not ("DSML" in text or "dsml" in text or "Dsml" in text) and (
        _GATE_TAG.search(text, start, end) is None
    ):
        return None
    return _FRAGMENT.search(text, start, end)


def describe_fragment(text: str, m: re.Match[str]) -> str:
    """A reason naming the tag around a fragment match."""
    start = m.start()
    lt = text.rfind("<", max(0, start - 4), start + 1)
    if lt >= 0:
        start = lt
    gt = text.find(">", m.end() - 1, m.end() + 60)
    nl = text.find("\n", start, m.end() + 60)
    end = gt + 1 if gt >= 0 and (nl < 0 or gt < nl) else max(m.end(), min(nl, m.end() + 20))
    snippet = text[start:end]
    if snippet.startswith((f"<{MARK}", f"</{MARK}")):
        tag = snippet.split(MARK, 1)[1].split(" ", 1)[0].rstrip(">/")
        if tag in ("invoke", "parameter", *BLOCKS.values()):
            return f"DSML tag {snippet!r} outside a well-formed block"
        return f"unknown DSML tag {snippet!r}"
    if "DSML" in snippet.upper():
        return f"mangled DSML marker in {snippet!r}"
    return f"DSML-like tag {snippet!r} without the DSML marker"


def split_eos(text: str) -> tuple[str, bool]:
    if text.endswith(EOS):
        return text[: -len(EOS)], True
    return text, False


def find_opener(body: str) -> tuple[int, str]:
    """(offset, version) of the first canonical block opener, or (-1, "")."""
    best, version = -1, ""
    for ver, opener in OPENERS.items():
        i = body.find(opener)
        if i >= 0 and (best < 0 or i < best):
            best, version = i, ver
    return best, version


def content_before(body: str, start: int, noncanonical: list[str]) -> str:
    """The visible content before a block opener at ``start`` (the blank line removed)."""
    pre = body[:start]
    stripped = pre.rstrip(_WS)
    if stripped != pre:
        noncanonical.append(NC_INDENTED)
    if stripped.endswith("\n\n"):
        return stripped[:-2]
    noncanonical.append(NC_NO_BLANK_LINE)
    return stripped.rstrip("\n")


def skip_indent(text: str, pos: int, noncanonical: list[str]) -> int:
    j = pos
    while j < len(text) and text[j] in _WS:
        j += 1
    if j != pos:
        noncanonical.append(NC_INDENTED)
    return j


def newline(text: str, pos: int, noncanonical: list[str]) -> int:
    """Skip the newline at ``pos``; a missing one is non-canonical (both servers accept it)."""
    if text.startswith("\n", pos):
        return pos + 1
    noncanonical.append(NC_NO_NEWLINE)
    return pos


def diagnose(text: str, pos: int, version: str, expected: str) -> DsmlError:
    """The most specific reason why the text at ``pos`` is not what the grammar expects."""
    rest = text[pos : pos + 400]
    line = rest.split("\n", 1)[0]
    if pos >= len(text) or ">" not in text[pos:]:
        return DsmlError(f"truncated block: expected {expected}", pos)
    other = "v32" if version == "v4" else "v4"
    if rest.startswith((f"</{MARK}{BLOCKS[other]}>", f"<{MARK}{BLOCKS[other]}>")):
        return DsmlError(
            f"mixed dialects: {BLOCKS[other]} tag inside a {BLOCKS[version]} block", pos
        )
    if _HERMES_TAG.match(rest):
        return DsmlError("mixed dialects: Hermes <tool_call> tag inside a DSML block", pos)
    if any(q in line.split(">", 1)[0] for q in "\u201c\u201d\u2018\u2019\u201e"):
        return DsmlError("typographic quotes in a tag attribute", pos)
    if line.startswith(f"<{MARK}parameter") and expected == "a parameter":
        if "string=" not in line.split(">", 1)[0]:
            return DsmlError("parameter without a string= attribute", pos)
        return DsmlError('malformed parameter opener (string= must be "true" or "false")', pos)
    if rest.startswith((f"<{MARK}parameter", INVOKE_CLOSE)):
        return DsmlError(f"{line[:30]!r} where {expected} belongs (an opener missing)", pos)
    if rest.startswith(f"<{MARK}invoke") and expected != "a parameter":
        return DsmlError("malformed invoke opener", pos)
    bare = _BARE_TAG.match(rest)
    if bare is not None:
        return DsmlError(f"{bare.group(1)} tag without the DSML marker", pos)
    frag = _FRAGMENT.match(text, pos)
    if frag is not None and MARK not in frag.group(0):
        return DsmlError(describe_fragment(text, frag), pos)
    return DsmlError(f"expected {expected}, found {line[:40]!r}", pos)


def _json_value(raw: str, key: str, vstart: int) -> Any:
    try:
        return loads_strict(raw)
    except StrictJSONError as exc:
        raise DsmlError(
            f"parameter {key!r} is not valid JSON ({exc.kind}: {exc.message})", vstart + exc.pos
        ) from None


def _json_body(text: str, pos: int) -> tuple[dict[str, Any], int]:
    try:
        value, end = raw_decode_strict(text, pos)
    except StrictJSONError as exc:
        raise DsmlError.at(
            text, exc.pos, f"invoke body is not valid JSON ({exc.kind}: {exc.message})"
        ) from None
    if not isinstance(value, dict):
        raise DsmlError("invoke body is JSON but not an object", pos)
    while end < len(text) and text[end] in " \t\n":
        end += 1
    return value, end


def parse_invoke(
    text: str, pos: int, version: str, noncanonical: list[str]
) -> tuple[ToolCall, int]:
    """Parse one invoke at ``pos``: (call, offset after the newline that follows it)."""
    m = _INVOKE.match(text, pos)
    if m is None:
        raise diagnose(text, pos, version, "an invoke or the block closer")
    name = m.group(1)
    pos = m.end()
    if m.group(2):
        noncanonical.append(NC_SELF_CLOSING)
        return ToolCall(name, {}), newline(text, pos, noncanonical)
    pos = newline(text, pos, noncanonical)
    pos = skip_indent(text, pos, noncanonical)
    args: dict[str, Any] = {}
    if text.startswith("\n", pos):  # zero arguments: an empty line
        pos = skip_indent(text, pos + 1, noncanonical)
    elif text.startswith(INVOKE_CLOSE, pos):
        noncanonical.append(NC_NO_EMPTY_LINE)
    elif text.startswith("{", pos):
        noncanonical.append(NC_JSON_BODY)
        args, pos = _json_body(text, pos)
    else:
        while True:
            pm = _PARAM.match(text, pos)
            if pm is None:
                raise diagnose(text, pos, version, "a parameter")
            key, is_str = pm.group(1), pm.group(2)
            vstart = pm.end()
            vend = text.find(PARAM_CLOSE, vstart)
            if vend < 0:
                raise DsmlError.at(text, vstart, f"parameter {key!r} not closed")
            raw = text[vstart:vend]
            marker = raw.find(MARK)
            if marker >= 0:
                raise DsmlError(
                    f"DSML marker inside the value of parameter {key!r} (a lost closer?)",
                    vstart + marker,
                )
            if key in args:
                raise DsmlError(f"repeated parameter {key!r}", pm.start())
            args[key] = raw if is_str == "true" else _json_value(raw, key, vstart)
            pos = newline(text, vend + len(PARAM_CLOSE), noncanonical)
            pos = skip_indent(text, pos, noncanonical)
            if text.startswith(INVOKE_CLOSE, pos):
                break
    if not text.startswith(INVOKE_CLOSE, pos):
        raise diagnose(text, pos, version, "the invoke closer")
    return ToolCall(name, args), newline(text, pos + len(INVOKE_CLOSE), noncanonical)
