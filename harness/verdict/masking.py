"""Regions of a text that are not prose: code, quoted code, URLs, blobs, tool-call markup.

Salad signals ignore these regions (a regex or base64 is symbol soup by design, a quoted
``ab ab ab`` is not a loop); repetition inside fenced code is judged more leniently.
``Masked.text`` has the same length as the original, with masked regions blanked, so every
offset still points into the original text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.verdict.salad import SPECIAL as _DEBRIS

_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n.*?(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_INLINE = re.compile(r"(`{1,2})[^`\n]{1,300}?\1")
# URLs, e-mail addresses and regexes are found from a literal anchor ("://", "@", a
# backslash escape) and extended to the surrounding non-space run: fast scans, no
# per-position backtracking.
_URL_ANCHOR = re.compile(r"://|www\.|mailto:", re.I)
_EMAIL_ANCHOR = re.compile(r"@[\w-]+\.\w")
_PATH = re.compile(r"[\\/][\w.@+-]+(?:[\\/][\w.@+-]+)+[\\/]?")
_NONSPACE = re.compile(r"[^\s<>\"'`)\]]*")
_BLOB_CHARS = np.zeros(128, dtype=bool)
for _c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=":
    _BLOB_CHARS[ord(_c)] = True
_DSML_BLOCK = re.compile(
    "<\uff5cDSML\uff5c(tool_calls|function_calls)>.*?</\uff5cDSML\uff5c\\1>", re.S
)
_DSML_TAG = re.compile(
    "</?\uff5cDSML\uff5c[^>\n]{0,200}>|<\uff5cend\u2581of\u2581sentence\uff5c>\\s*\\Z"
)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_REGEX = re.compile(r"\\[dwsDWSbB.+*?()\[\]]")
_REGEX_MARK = re.compile(
    r"\\[dwsDWSbB.]|\[\^?[^\]\s]{1,40}\]|\(\?[:=!<]|\{\d+(?:,\d*)?\}|[+*?]\??\)?"
)
_MATH = re.compile(
    r"\$\$.{1,2000}?\$\$|\$[^$\n]{1,300}?\$|\\\(.{1,300}?\\\)|\\\[.{1,2000}?\\\]", re.S
)
_TAG = re.compile(r"</?[A-Za-z][\w:-]*(?:\s[^<>\n]{0,300})?/?>")
_CODE_LINES = re.compile(r"(?:^(?: {4}|\t)[^\n]*\n?){3,}", re.M)


@dataclass(frozen=True)
class Masked:
    text: str  # same length as the original; masked regions are spaces
    loops: str  # the same, but fenced and indented code kept (loops in code are real loops)
    starts: npt.NDArray[np.int64]  # sorted, non-overlapping masked intervals
    ends: npt.NDArray[np.int64]
    code: tuple[tuple[int, int], ...]  # fenced or indented code (a subset of the intervals)
    values: tuple[tuple[int, int], ...]  # long tool-call argument values, scored on their own
    quoted: tuple[tuple[int, int], ...] = ()  # inline code spans

    def quoted_at(self, pos: int) -> bool:
        return any(s <= pos < e for s, e in self.quoted)

    def in_code(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which positions fall in fenced or indented code."""
        out = np.zeros(pos.size, dtype=bool)
        for s, e in self.code:
            out |= (pos >= s) & (pos < e)
        return out

    def inside(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which positions fall in a masked region."""
        if self.starts.size == 0 or pos.size == 0:
            return np.zeros(pos.size, dtype=bool)
        k = np.searchsorted(self.starts, pos, side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        return ok & (pos < self.ends[kk])


_DSML_VALUE = re.compile(
    '<\uff5cDSML\uff5cparameter name="[^"\n]*" string="true">(.*?)</\uff5cDSML\uff5cparameter>',
    re.S,
)


def mask(text: str) -> Masked:
    spans: list[tuple[int, int]] = []
    code: list[tuple[int, int]] = []
    values: list[tuple[int, int]] = []
    if "```" in text or "~~~" in text:
        code.extend(m.span() for m in _FENCE.finditer(text))
    if "    " in text or "\t" in text:
        code.extend(m.span() for m in _CODE_LINES.finditer(text))
    if "$" in text or "\\(" in text or "\\[" in text:
        spans.extend(m.span() for m in _MATH.finditer(text))
    quoted: list[tuple[int, int]] = []
    if "`" in text:
        quoted = [m.span() for m in _INLINE.finditer(text)]
        spans.extend(quoted)
    if "\uff5c" in text:
        for m in _DSML_BLOCK.finditer(text):
            spans.append(m.span())
            for v in _DSML_VALUE.finditer(text, m.start(), m.end()):
                if v.end(1) - v.start(1) >= 200:
                    values.append(v.span(1))
        spans.extend(m.span() for m in _DSML_TAG.finditer(text))
    if "<" in text:
        spans.extend(m.span() for m in _TAG.finditer(text) if not _DEBRIS.fullmatch(m.group(0)))
    if "<tool_call>" in text:
        for m in _HERMES.finditer(text):
            if _is_json(m.group(1)):
                spans.append(m.span())
    if "/" in text or ":" in text or "www" in text:
        spans.extend(_around(text, m.start()) for m in _URL_ANCHOR.finditer(text))
    if "@" in text:
        spans.extend(_around(text, m.start()) for m in _EMAIL_ANCHOR.finditer(text))
    if "/" in text or "\\" in text:
        spans.extend(m.span() for m in _PATH.finditer(text))
    spans.extend(_blobs(text))
    if "\\" in text:
        for m in _REGEX.finditer(text):
            s, e = _around(text, m.start())
            if len(_REGEX_MARK.findall(text, s, e)) >= 2:
                spans.append((s, e))
    if not spans and not code:
        return Masked(text, text, _EMPTY, _EMPTY, (), tuple(values), tuple(quoted))
    loops = _blank(text, _merge(spans))
    merged = _merge(spans + code)
    arr = np.array(merged, dtype=np.int64).reshape(-1, 2)
    return Masked(
        _blank(text, merged),
        loops,
        arr[:, 0].copy(),
        arr[:, 1].copy(),
        tuple((s, e) for s, e in _merge(code)),
        tuple(values),
        tuple(quoted),
    )


def _around(text: str, i: int) -> tuple[int, int]:
    """The run of non-space characters around position ``i``."""
    s = max(text.rfind(" ", 0, i), text.rfind("\n", 0, i), text.rfind("\t", 0, i)) + 1
    m = _NONSPACE.match(text, i)
    return s, m.end() if m else i + 1


def _blobs(text: str) -> list[tuple[int, int]]:
    """Runs of 40+ base64 / identifier characters with some variety (keys, hashes, data)."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    ok = np.zeros(codes.size, dtype=bool)
    small = codes < 128
    ok[small] = _BLOB_CHARS[codes[small]]
    if ok.sum() < 40:
        return []
    d = np.diff(np.concatenate(([0], ok.view(np.int8), [0])))
    st, en = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = (en - st) >= 40
    return [(s, e) for s, e in zip(st[keep].tolist(), en[keep].tolist(), strict=True)
            if len(set(text[s:e])) >= 8]


def _merge(spans: list[tuple[int, int]]) -> list[list[int]]:
    merged: list[list[int]] = []
    for s, e in sorted(spans):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return merged


def _blank(text: str, merged: list[list[int]]) -> str:
    if not merged:
        return text
    parts = []
    last = 0
    for s, e in merged:
        parts.append(text[last:s])
        parts.append(" " * (e - s))
        last = e
    parts.append(text[last:])
    return "".join(parts)


_EMPTY = np.zeros(0, dtype=np.int64)


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True
