"""Regions of a text that are not prose: code, quoted code, URLs, blobs, tool-call markup.

Salad signals ignore these regions (a regex or base64 is symbol soup by design, a quoted
``ab ab ab`` is not a loop); repetition inside fenced code is judged more leniently.
``Masked.text`` has the same length as the original, with masked regions blanked, so every
offset still points into the original text.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import numpy.typing as npt

from harness.dialects.jsonstrict import StrictJSONError, raw_decode_strict
from harness.dialects.registry import markup_spans
from harness.dialects.registry import parse as parse_markup
from harness.verdict.detector.salad import SPECIAL as _DEBRIS

#: One or two backticks around a code span. Written with a literal backtick first (the same
#: matches as ``(`{1,2})...\1``), so the regex engine jumps from backtick to backtick.
_INLINE = re.compile(r"`(`?)[^`\n]{1,300}?`\1")
# URLs, e-mail addresses and regexes are found from a literal anchor ("://", "@", a
# backslash escape) and extended to the surrounding non-space run: fast scans, no
# per-position backtracking.
_URL_NEEDLES = ("://", "www.", "WWW.", "mailto:", "MAILTO:")
_URL_ANCHORS = tuple(re.compile(re.escape(a)) for a in _URL_NEEDLES)
_TILDES = re.compile("~~~")
_LATEX_OPEN = re.compile(r"\\[(\[]")  # "\\(" or "\\["
_HERMES_OPEN = re.compile("<tool_call>")
_EMAIL_ANCHOR = re.compile(r"@[\w-]+\.\w")
_PATH_TAIL = r"[\w.@+-]+(?:[\\/][\w.@+-]+)+[\\/]?"
_PATH = re.compile(r"[\\/]" + _PATH_TAIL)
_PATH_BY_LEAD = (re.compile(r"\\" + _PATH_TAIL), re.compile("/" + _PATH_TAIL))  # _by_lead
_NONSPACE = re.compile(r"[^\s<>\"'`)\]]*")
_DSML_BLOCK = re.compile(
    "<\uff5cDSML\uff5c(tool_calls|function_calls)>.*?</\uff5cDSML\uff5c\\1>", re.S
)
_DSML_TAG = re.compile(
    "</?\uff5cDSML\uff5c[^>\n]{0,200}>|<\uff5cend\u2581of\u2581sentence\uff5c>\\s*\\Z"
)
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
#: Hermes tags, and a closer cut at the very end of the text (``</tool_c``).
_HERMES_TAG = re.compile(r"</?tool_call>|</t(?:o(?:o(?:l(?:_(?:c(?:a(?:l(?:l)?)?)?)?)?)?)?)?\s*\Z")
_REGEX = re.compile(r"\\[dwsDWSbB.+*?()\[\]]")
_REGEX_MARK = re.compile(
    r"\\[dwsDWSbB.]|\[\^?[^\]\s]{1,40}\]|\(\?[:=!<]|\{\d+(?:,\d*)?\}|[+*?]\??\)?"
)
_MATH_DOLLAR = r"\$\$.{1,2000}?\$\$|\$[^$\n]{1,300}?\$"
_MATH_BACKSLASH = r"\\\(.{1,300}?\\\)|\\\[.{1,2000}?\\\]"
_MATH = re.compile(f"{_MATH_DOLLAR}|{_MATH_BACKSLASH}", re.S)
_MATH_BY_LEAD = (re.compile(_MATH_DOLLAR, re.S), re.compile(_MATH_BACKSLASH, re.S))
#: Inline "math" holding marks LaTeX never writes is not math (soup between two dollars).
_NOT_MATH = re.compile(r"[`\"?@]")
_TAG = re.compile(r"</?[A-Za-z][\w:-]*(?:\s[^<>\n]{0,300})?/?>")


@dataclass(frozen=True)
class Masked:
    original: str
    loops: str  # what loops are searched in: markup, quoted code, URLs, regexes blanked;
    # code, math and blobs kept (a formula or a hash repeated is still a loop)
    code: tuple[tuple[int, int], ...]  # fenced or indented code, sorted and disjoint
    values: tuple[tuple[int, int], ...]  # long tool-call argument values, scored on their own
    quoted: tuple[tuple[int, int], ...] = ()  # inline code spans
    #: what salad is read in: ``loops`` with math and blobs blanked as well
    prose: str = ""
    #: what ``loops`` blanks, then what ``prose`` blanks as well (each sorted, disjoint)
    blanked: tuple[tuple[int, int], ...] = ()
    data: tuple[tuple[int, int], ...] = ()
    #: tool-call markup of the dialects besides DSML and Hermes (its tokens are not debris)
    markup: tuple[tuple[int, int], ...] = ()

    @cached_property
    def _merged(self) -> npt.NDArray[np.int64]:
        merged = _merge([*self.blanked, *self.data, *self.code])
        return np.array(merged, dtype=np.int64).reshape(-1, 2)

    @property
    def starts(self) -> npt.NDArray[np.int64]:  # masked intervals (code too), sorted, disjoint
        return self._merged[:, 0]

    @property
    def ends(self) -> npt.NDArray[np.int64]:
        return self._merged[:, 1]

    @property
    def text(self) -> str:
        """Same length as the original; every masked region (code too) blanked."""
        merged = list(zip(self.starts.tolist(), self.ends.tolist(), strict=True))
        return _blank(self.original, merged)

    def quoted_at(self, pos: int) -> bool:
        return any(s <= pos < e for s, e in self.quoted)

    def markup_at(self, pos: int) -> bool:
        return any(s <= pos < e for s, e in self.markup)

    def in_code(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which positions fall in fenced or indented code (``code`` is sorted, disjoint)."""
        if not self.code or not pos.size:
            return np.zeros(pos.size, dtype=bool)
        lo, hi = np.array(self.code, dtype=np.int64).T
        k = lo.searchsorted(pos, side="right") - 1  # the last block starting at or before
        out: npt.NDArray[np.bool_] = (k >= 0) & (pos < hi[np.maximum(k, 0)])
        return out

    def inside(self, pos: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Which positions fall in a masked region."""
        if self.starts.size == 0 or pos.size == 0:
            return np.zeros(pos.size, dtype=bool)
        k = self.starts.searchsorted(pos, side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        return ok & (pos < self.ends[kk])


_DSML_VALUE = re.compile(
    '<\uff5cDSML\uff5cparameter name="[^"\n]*" string="true">(.*?)</\uff5cDSML\uff5cparameter>',
    re.S,
)


#: The markup spans found so far inside ``shared_markup`` (text -> spans), else None.
_SHARED: ContextVar[dict[str, tuple[tuple[int, int], ...]] | None] = ContextVar(
    "shared_markup", default=None
)


@contextmanager
def shared_markup() -> Iterator[None]:
    """Inside, ``mask`` and ``without_markup`` find the tool-call markup of a text once:
    the fitted decision reads one text with both (the rules, then the features), and on a
    text with markup the dialects' parse costs as much as the rest of the masking."""
    token = _SHARED.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)


def _markup(text: str) -> tuple[tuple[int, int], ...]:
    """``markup_spans`` of ``text`` (found once inside ``shared_markup``)."""
    shared = _SHARED.get()
    if shared is None:
        return tuple(markup_spans(text))
    found = shared.get(text)
    if found is None:
        found = shared[text] = tuple(markup_spans(text))
    return found


def mask(text: str) -> Masked:
    spans: list[tuple[int, int]] = []
    code: list[tuple[int, int]] = []
    values: list[tuple[int, int]] = []
    # Gates: a needle that is absent costs a scan of the whole text, and a compiled
    # literal searches about twice as fast as ``in``; cheap tests go first.
    fenced = "```" in text or ("~" in text and _TILDES.search(text) is not None)
    indented = "\n    " in text or "\t" in text or text.startswith("    ")
    if fenced or indented:
        code.extend(_code_blocks(text, fenced, indented))
    data: list[tuple[int, int]] = []  # math and blobs: not prose, but loops in them count
    if "$" in text or ("\\" in text and _LATEX_OPEN.search(text) is not None):
        data.extend(
            m.span()
            for m in _by_lead(_MATH, _MATH_BY_LEAD, text)
            if not _NOT_MATH.search(m.group(0))
        )
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
    if "<" in text and _HERMES_OPEN.search(text) is not None:
        for m in _HERMES.finditer(text):
            if _is_json(m.group(1)):
                spans.append(m.span())
            elif (objs := _json_values(text, m.start(1), m.end(1))) is not None:
                spans.append(m.span())  # concatenated calls: the dialect reports them;
                values.extend(objs)  # each call is still read on its own
    markup: list[tuple[int, int]] = []
    if "<" in text or "[" in text:
        # the other dialects' markup (Kimi, Harmony, DeepSeek V3, Mistral, Llama, ...)
        markup = list(_markup(text))
        spans.extend(markup)
    if (
        "<" in text
        and _MANGLED_TAG.search(text) is not None  # (first: a match is rare)
        and ("DSML" in text or "dsml" in text or "calls" in text)
    ):
        # mangled envelope tags (ASCII or doubled bars, a lost marker): markup, not salad;
        # the dialect parser reports them
        spans.extend(m.span() for m in _MANGLED_TAG.finditer(text))
    if _ends_like_json(text) and ("}{" in text or "} {" in text or "][" in text or "] [" in text):
        tail = _json_tail(text)
        if tail is not None:
            spans.append((tail[0][0], tail[-1][1]))
            values.extend(tail)
    for anchor in _URL_ANCHORS:
        hit = anchor.search(text)
        while hit is not None:
            spans.append(_around(text, hit.start()))
            hit = anchor.search(text, spans[-1][1])
    if "@" in text:
        spans.extend(_around(text, m.start()) for m in _EMAIL_ANCHOR.finditer(text))
    if "/" in text or "\\" in text:
        spans.extend(m.span() for m in _by_lead(_PATH, _PATH_BY_LEAD, text))
    data.extend(_blobs(text))
    math = None  # the merged data, when the regex search needs it
    if "\\" in text:
        math = _merge(data)
        math_starts = [a for a, _ in math]
        e = -1
        for m in _REGEX.finditer(text):
            i = m.start()
            if i < e:
                continue  # inside the run just judged: the same run, the same answer
            k = bisect_right(math_starts, i) - 1
            if k >= 0 and i < math[k][1]:
                continue  # LaTeX (\sqrt, x_{1,2}) is math, not a regex
            s, e = _around(text, i)
            if len(_REGEX_MARK.findall(text, s, e)) >= 2:
                spans.append((s, e))  # a regex repeats its pieces by design: no loops
    if not spans and not code and not data:
        return Masked(text, text, (), tuple(values), tuple(quoted), text)
    # merged step by step: each merge sorts a list that is mostly sorted already
    loop_spans = _merge(spans)
    loops = _blank(text, loop_spans)
    data_spans = (math if math is not None else _merge(data)) if data else []
    # (blanks are blanks: prose is loops with the data blanked too)
    prose = _blank(loops, data_spans) if data else loops
    return Masked(
        text,
        loops,
        tuple(_merge(code)),
        tuple(values),
        tuple(quoted),
        prose,
        tuple(loop_spans),
        tuple(data_spans),
        tuple(markup),
    )


def _by_lead(
    whole: re.Pattern[str], parts: tuple[re.Pattern[str], ...], text: str
) -> list[re.Match[str]]:
    """``whole.finditer(text)`` from ``parts``, ``whole`` split by its leading character
    (a literal lets the regex engine jump between its occurrences; a class is tried at every
    position). When the parts' matches do not overlap they are the matches of ``whole``."""
    found = sorted((m for p in parts for m in p.finditer(text)), key=lambda m: m.start())
    for a, b in zip(found, found[1:], strict=False):
        if b.start() < a.end():
            return list(whole.finditer(text))
    return found


# Every line-based pattern starts with a literal newline (the text start is checked
# apart): the regex engine then jumps from newline to newline instead of trying each
# position.
_FENCE_OPEN = re.compile(r"\n[ \t]*(```|~~~)[^\n]*\n")
_FENCE_CLOSE = {f: re.compile(rf"\n[ \t]*{f}[ \t]*(?=\n|\Z)") for f in ("```", "~~~")}
_INDENTED_LINE = re.compile(r"\n(?: {4}|\t)")


def _code_blocks(text: str, fenced: bool, indented: bool) -> list[tuple[int, int]]:
    """Fenced blocks (an opener line of ``` or ~~~, up to the same fence alone on a line or
    the end) and runs of 3+ lines indented by four spaces or a tab."""
    out: list[tuple[int, int]] = []
    body = "\n" + text  # offsets in body are one more than in text
    pos = 0
    while fenced:
        m = _FENCE_OPEN.search(body, pos)
        if m is None:
            break
        close = _FENCE_CLOSE[m.group(1)].search(body, m.end() - 1)
        end = close.end() - 1 if close is not None else len(text)
        out.append((m.start(), end))
        pos = end + 1
    if indented:
        run_start, run, prev_end = -1, 0, -2
        for m in _INDENTED_LINE.finditer(body):
            s = m.start()  # the line start, in text offsets
            nl = text.find("\n", s)
            e = nl + 1 if nl >= 0 else len(text)
            if s == prev_end:
                run += 1
            else:
                if run >= 3:
                    out.append((run_start, prev_end))
                run_start, run = s, 1
            prev_end = e
        if run >= 3:
            out.append((run_start, prev_end))
    return out


def _around(text: str, i: int) -> tuple[int, int]:
    """The run of non-space characters around position ``i``."""
    s = text.rfind(" ", 0, i)  # each later search stops there: no scan of the whole prefix
    s = max(s, text.rfind("\n", s + 1, i))
    s = max(s, text.rfind("\t", s + 1, i)) + 1
    m = _NONSPACE.match(text, i)
    return s, m.end() if m else i + 1


_BLOB_TABLE = bytes(
    1 if chr(c) in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_-=." else 0
    for c in range(256)
)


_BLOB_RUN = b"\x01" * 40


def _blobs(text: str) -> list[tuple[int, int]]:
    """Runs of 40+ base64 / identifier characters with some variety (keys, hashes, data)."""
    if len(text) < 40:
        return []
    b = text.encode("ascii", "replace")  # one byte per character; non-ASCII is no blob
    ok = b.translate(_BLOB_TABLE)
    # a search for 40 blob bytes in a row skips ahead on every other byte: fast when
    # there is none; each one found starts a run, which ends at the next other byte
    out = []
    i = ok.find(_BLOB_RUN)
    while i >= 0:
        e = ok.find(b"\x00", i + 40)
        e = len(ok) if e < 0 else e
        if len(set(text[i:e])) >= 8:
            out.append((i, e))
        i = ok.find(_BLOB_RUN, e)
    return out


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of ``spans`` as sorted, disjoint intervals (touching ones joined)."""
    merged: list[tuple[int, int]] = []
    if not spans:
        return merged
    it = iter(sorted(spans))
    cs, ce = next(it)
    for s, e in it:
        if s <= ce:
            if e > ce:
                ce = e
        else:
            merged.append((cs, ce))
            cs, ce = s, e
    merged.append((cs, ce))
    return merged


def without_markup(text: str) -> tuple[str, tuple[tuple[int, int], ...]]:
    """``text`` without its tool-call markup and inline code, and the spans taken out
    (sorted, disjoint): well-formed DSML and Hermes blocks, DSML and Hermes tags, the calls
    after the first of calls glued together (``{...}{...}``, at the end of the text or in a
    Hermes block), the other dialects' markup (``markup_spans``) and inline code spans
    (`` `evict_lru` ``), each replaced by a
    line break. The dialect parsers judge the calls; what is left is what a model wrote as
    prose (several near-identical calls are not a loop, fullwidth bars are not salad, an
    identifier the writer marked as code is not a word of the language). Substring tests
    first: most texts hold none and come back as they are (the same object)."""
    spans: list[tuple[int, int]] = []
    if "`" in text:
        spans.extend(m.span() for m in _INLINE.finditer(text))
    if "\uff5c" in text:
        spans.extend(m.span() for m in _DSML_BLOCK.finditer(text))
        spans.extend(m.span() for m in _DSML_TAG.finditer(text))
    if "<tool_call>" in text:
        for m in _HERMES.finditer(text):
            if _is_json(m.group(1)):
                spans.append(m.span())
            elif (objs := _json_values(text, m.start(1), m.end(1))) is not None:
                spans.append((objs[1][0], m.end()))  # calls glued together: all but the first
        spans.extend(m.span() for m in _HERMES_TAG.finditer(text))  # a broken block's tags
    if "<" in text or "[" in text:
        spans.extend(_markup(text))
    if _ends_like_json(text) and ("}{" in text or "} {" in text or "][" in text or "] [" in text):
        tail = _json_tail(text)
        if tail is not None and len(tail) > 1:
            # calls glued together: the dialect reports them; the first is read as it is
            # (salad inside it is still salad), the copies after it are not a loop
            spans.append((tail[1][0], tail[-1][1]))
    if not spans:
        return text, ()
    # and the one that closes a quoted call turn: before the fence's end, or the text's
    spans.extend(m.span() for m in _EOS_CLOSING.finditer(text))
    merged = []
    for a, b in _merge(spans):  # the end-of-turn token a call turn ends with is the call's
        eos = _EOS_AFTER.match(text, b)
        merged.append((a, eos.end() if eos else b))
    parts = []
    last = 0
    for a, b in merged:
        parts.append(text[last:a])
        last = b
    parts.append(text[last:])
    return "\n".join(parts), tuple(merged)


#: End-of-turn tokens (the dialect encoders end a call turn with one).
_EOS_TOKENS = (
    "(?:<\uff5cend\u2581of\u2581sentence\uff5c>|<\\|im_end\\|>|<\\|eot_id\\|>|<\\|endoftext\\|>"
    "|<\\|end\\|>|<\\|return\\|>|<\\|call\\|>|<end_of_turn>|</s>)"
)
_EOS_AFTER = re.compile("\\s*" + _EOS_TOKENS)
_EOS_CLOSING = re.compile(_EOS_TOKENS + "(?=\\s*(?:```|~~~|\\Z))")


def quoted_calls(text: str) -> list[tuple[int, int]]:
    """The insides of fenced code blocks (``_code_blocks``) that hold a well-formed raw
    tool-call turn of some dialect, end-of-turn token included (a model showing the
    format). The parsers read such a block as content, and the pieces left between its tags
    (``"get_weather">``, ``[e~[``) would read as salad; ``classify_turn`` takes them out
    before the detector reads the text."""
    out = []
    for s, e in _code_blocks(text, True, False):
        a = text.find("\n", s, e) + 1  # after the opener line
        if a == 0:
            continue
        b = text.rfind("\n", a, e)  # before the closing fence, when there is one
        if b < 0 or text[b + 1 : e].strip() not in ("```", "~~~"):
            b = e
        inner = text[a:b]
        if "<" in inner or "[" in inner or "\uff5c" in inner:
            got = parse_markup(inner, "auto", server_content=True)
            if got.found and got.ok and got.calls:
                out.append((a, b))
    return out


#: An edit block: aider's and Cline's SEARCH/REPLACE, a merge conflict; with the code
#: fence around it and the file's path on the line before the fence (aider's layout).
_EDIT_BLOCK = re.compile(
    r"(?:^[^\s`<>][^\n]{0,300}\n)?(?:^[ \t]*(?:```|~~~)[^\n]*\n)?"
    r"^[ \t]*<{7} ?(?:SEARCH|HEAD|ORIGINAL|ours)\b[^\n]*\n.*?^[ \t]*={7}[ \t]*\n"
    r".*?^[ \t]*>{7}[^\n]*(?:\n[ \t]*(?:```|~~~)[ \t]*$)?",
    re.M | re.S,
)


def edit_blocks(text: str) -> list[tuple[int, int]]:
    """The edit blocks of ``text`` (``<<<<<<< SEARCH`` ... ``=======`` ... ``>>>>>>>
    REPLACE``): code quoted twice by design, the new side repeating the old one's lines, and
    the same scaffolding block after block, which is no loop. ``classify_turn`` takes them
    out before the detector reads the text (as it does a raw tool call shown in code), but
    not a block with special-token debris in it, which no code holds."""
    if "<<<<<<<" not in text:
        return []
    blocks = [(m.start(), m.end()) for m in _EDIT_BLOCK.finditer(text)]
    return [(a, b) for a, b in blocks if not _DEBRIS.search(text, a, b)]  # debris is read


def original_offset(offset: int, removed: Sequence[tuple[int, int]]) -> int:
    """Where ``offset`` of ``without_markup``'s text is in the original text."""
    for a, b in removed:
        if offset < a:
            break
        offset += b - a - 1  # each span became one line break
    return offset


def _blank(text: str, merged: Sequence[Sequence[int]]) -> str:
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


_MANGLED_TAG = re.compile(
    r"</?[^<>\n]{0,6}DSML[^<>\n]{0,200}>"
    r"|<[ \t]{0,2}/?[ \t]{0,2}(?:tool_?calls|function_?calls|calls)[ \t]{0,2}>",
    re.IGNORECASE,
)
_JSON_START = re.compile(r"\n[ \t]*(?=[\[{])")
_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<\uff5cend\u2581of\u2581sentence\uff5c>")


def _json_values(text: str, start: int, end: int) -> list[tuple[int, int]] | None:
    """Spans of two or more JSON values that fill ``text[start:end]`` (whitespace aside)."""
    out: list[tuple[int, int]] = []
    pos = start
    while True:
        while pos < end and text[pos] in " \t\r\n":
            pos += 1
        if pos >= end:
            return out if len(out) >= 2 else None
        if text[pos] not in "[{":
            return None
        try:
            _, stop = raw_decode_strict(text, pos)
        except StrictJSONError:
            return None
        if stop > end:
            return None
        out.append((pos, stop))
        pos = stop


def _ends_like_json(text: str) -> bool:
    """The first test of ``_json_tail``: the output (an end token aside) ends with } or ]."""
    body = text.rstrip()
    for eos in _END_TOKENS:
        if body.endswith(eos):
            body = body[: -len(eos)]
            break
    return bool(body) and text[len(body) - 1] in "}]"


def _json_tail(text: str) -> list[tuple[int, int]] | None:
    """JSON values glued together at the end of an output (``{...}{...}``): the spans."""
    body = text.rstrip()
    for eos in _END_TOKENS:
        if body.endswith(eos):
            body = body[: -len(eos)]
            break
    end = len(body)
    if end == 0 or text[end - 1] not in "}]":
        return None
    starts = [0] if text[:1] in "[{" else []
    starts.extend(m.end() for m in _JSON_START.finditer(text, 0, end))
    for s in starts:
        found = _json_values(text, s, end)
        if found is not None:
            return found
    return None


def _is_json(s: str) -> bool:
    try:
        json.loads(s)
    except ValueError:
        return False
    return True
