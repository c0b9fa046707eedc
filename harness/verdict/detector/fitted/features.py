"""The feature vector of one text, which the fitted decision (``model.py``) reads.

Three families, all language- and format-agnostic:

* **the rule signals** (``text.rules``): the windowed score of the hand-written signals and
  each signal's value in its deciding window (special tokens, loops, script switches, ...);
* **the character model** (``charmodel.py``): mean 4-gram and 3-gram surprisal, the worst
  windows of 12, 32 and 96 characters, the share of unseen 4-grams and its worst 32-window;
* **the word model** (``wordmodel.py``): the share of words, and of pairs of neighbouring
  words, clean text does not use, and their worst windows of 8 (words; characters of
  unseen words among the characters of 8 words);
* **shape**: length, shares of non-ASCII, digits, ASCII punctuation, white space, capitals
  and line breaks, the share of repeated 6-grams (whole text and its end), how periodic the
  end is, repeated lines and words, mojibake (runs of Latin-1 / cp1252 characters that
  decode as UTF-8 once re-encoded), U+FFFD, doubled identifiers and special tokens.

``vector`` also returns where the character model found its worst window (the onset when
the rules found none).
"""

from __future__ import annotations

import math
import re
import zlib

import numpy as np
import numpy.typing as npt

from harness.verdict.detector import salad
from harness.verdict.detector.fitted.charmodel import CharModel, Reading, codes
from harness.verdict.detector.fitted.charweights import CharWeights
from harness.verdict.detector.fitted.wordmodel import WordModel, text_words
from harness.verdict.detector.masking import original_offset, without_markup

RULE_SIGNALS = (
    "special_token",
    "special_token_run",
    "replacement_char",
    "char_run",
    "symbol_soup",
    "glued_punctuation",
    "stray_symbol",
    "identifier_soup",
    "stutter",
    "stutter_run",
    "script_switch",
    "script_variety",
    "glued_words",
    "glued_sentence",
    "loop",
    "drift",
    "tool_value",
)
NAMES = (
    "rule_score",
    *(f"rule_{s}" for s in RULE_SIGNALS),
    "log_len",
    "s4_mean",
    "s3_mean",
    "s4_w12",
    "s4_w32",
    "s4_w96",
    "unseen4",
    "unseen4_w32",
    "unseen4_w12",
    "s4_p90",
    "unseen6",
    "unseen6_w32",
    "unseen_w",
    "unseen_w_w8",
    "unseen_wchars_w8",
    "unseen_pair",
    "unseen_pair_w8",
    "non_ascii",
    "digits",
    "punct",
    "space",
    "upper",
    "newlines",
    "dup6",
    "dup_lines",
    "top_line",
    "word_types",
    "mojibake",
    "fffd",
    "tail_dup6",
    "tail_period_match",
    "tail_copies",
    "doubled_word",
    "specials_raw",
    "unseen6_contrast",
    "unseen_w_contrast",
    "long_unseen_w",
    "digit_in_word",
    "compressed",
    "weights_w32",
    "weights_w12",
    "weights_mean",
)
RULE_CAP = 5.0  # the rules' score and signals are read up to this
TAIL = 256  # characters of the end of a text read for a loop that runs to the end
_MOJI = re.compile(
    "[\u00c2-\u00f4][\u0080-\u00bf\u0152\u0153\u0160\u0161\u0178\u017d\u017e\u0192\u02c6\u02dc\u2013-\u203a\u20ac\u2122]+"
)
_WORD = re.compile(r"\w+")
_DIGIT_IN_WORD = re.compile(r"[^\W\d_]\d+[^\W\d_]")  # blo3ck, sel3f: digit noise
#: Every match of ``_DIGIT_IN_WORD`` holds a digit: a text without one has none (a scan of
#: one class costs a fifth of the pattern's, which is tried at every letter).
_DIGIT = re.compile(r"\d")


def _worst(c: npt.NDArray[np.integer], n: int, w: int) -> tuple[int, int]:
    """The largest sum of ``w`` consecutive values (of ``n``; ``c`` is their cumulative
    sum) and where that window starts; the sum of all of them when there are fewer."""
    if n <= w:
        return int(c[-1]), 0
    m = c[w:] - c[:-w]
    i = int(m.argmax())
    return int(m[i]), i + 1


#: Character class of each ASCII code point for the shares: 0 other, 1 digit, 2 punctuation,
#: 3 space or tab, 4 capital, 5 line break; every non-ASCII character is 6.
_CLASS = np.zeros(129, dtype=np.intp)
_CLASS[48:58] = 1
for _a, _b in ((33, 47), (58, 64), (91, 96), (123, 126)):
    _CLASS[_a : _b + 1] = 2
_CLASS[[32, 9]] = 3
_CLASS[65:91] = 4
_CLASS[10] = 5
_CLASS[128] = 6


def _char_features(r: Reading, x: list[float], k: int) -> int:
    """The character model's features of one text, from ``x[k]`` on (``NAMES``: from
    ``s4_mean`` to ``s4_p90``); returns where its worst 32-character window starts."""
    s4 = r.s4  # eighths of a bit
    m = s4.size
    c4 = s4.cumsum()
    cu = r.unseen4.cumsum()
    x[k] = int(c4[-1]) / (8 * m)
    x[k + 1] = r.s3_sum / (8 * m)
    x[k + 2] = _worst(c4, m, 12)[0] / (8 * min(12, m))
    best, where = _worst(c4, m, 32)
    x[k + 3] = best / (8 * min(32, m))
    x[k + 4] = _worst(c4, m, 96)[0] / (8 * min(96, m))
    x[k + 5] = int(cu[-1]) / m
    x[k + 6] = _worst(cu, m, 32)[0] / min(32, m)
    x[k + 7] = _worst(cu, m, 12)[0] / min(12, m)
    x[k + 8] = int(np.count_nonzero(s4 >= 48)) / m  # characters costing 6+ bits
    return where


def _mojibake(text: str) -> int:
    n = 0
    for m in _MOJI.finditer(text):
        try:
            m.group().encode("cp1252").decode("utf-8")
        except UnicodeError:
            try:
                m.group().encode("latin-1").decode("utf-8")
            except UnicodeError:
                continue
        n += 1
    return n


def vector(
    text: str,
    rule_score: float,
    rule_signals: dict[str, float],
    model: CharModel,
    wmodel: WordModel,
    weights: CharWeights,
    context: str | None = None,
) -> tuple[npt.NDArray[np.float64], int]:
    """The features of ``text`` (in ``NAMES`` order) and the character model's worst spot.
    Past the rule signals, they are read without the text's tool-call markup
    (``masking.without_markup``): the dialect parsers judge the calls."""
    raw = text
    text, removed = without_markup(text)
    x = [0.0] * len(NAMES)
    x[0] = min(rule_score, RULE_CAP)
    for i, s in enumerate(RULE_SIGNALS, 1):
        v = rule_signals.get(s)
        if v:
            x[i] = min(v, RULE_CAP)
    k = 1 + len(RULE_SIGNALS)
    n = len(text)
    x[k] = math.log1p(n)
    orig = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    wide = not text.isascii()
    cp = codes(orig, wide)
    where = 0
    h6 = u6 = c6 = u1 = None
    contrast6 = contrast1 = 0.0  # the worst spot less the text's level (``_local``)
    if n >= 5:
        reading = model.read(cp)
        where = _char_features(reading, x, k + 1)
        h6, u6 = reading.sixes, reading.unseen6
    if h6 is not None and u6 is not None:
        c6 = u6.cumsum()
        m = c6.size
        x[k + 10] = int(c6[-1]) / m
        x[k + 11] = _worst(c6, m, 32)[0] / min(32, m)
        contrast6 = x[k + 11] - x[k + 10]
    k += 12
    wh, _starts, wlen = text_words(text, cp, wide)
    if wh.size:
        u1, u2 = wmodel.unseen(wh)
        m = wh.size
        c1 = u1.cumsum()
        x[k] = int(c1[-1]) / m
        x[k + 1] = _worst(c1, m, 8)[0] / min(8, m)
        contrast1 = x[k + 1] - x[k]
        cl = wlen.cumsum()
        cc = (u1 * wlen).cumsum()
        if m > 8:
            x[k + 2] = float(((cc[8:] - cc[:-8]) / (cl[8:] - cl[:-8])).max())
        else:
            x[k + 2] = int(cc[-1]) / int(cl[-1])
        if u2.size:
            c2 = u2.cumsum()
            x[k + 3] = int(c2[-1]) / u2.size
            x[k + 4] = _worst(c2, u2.size, 8)[0] / min(8, u2.size)
    k += 5
    if n:
        cls = np.bincount(_CLASS.take(np.minimum(orig, 128) if wide else orig), minlength=7)
        cls = cls.tolist()
        x[k] = cls[6] / n
        x[k + 1] = cls[1] / n
        x[k + 2] = cls[2] / n
        x[k + 3] = (cls[3] + cls[5]) / n
        x[k + 4] = cls[4] / n
        x[k + 5] = cls[5] / n
    k += 6
    rep_ok = not context  # a prompt may ask for repetition: the rules weigh it with context
    whole = _dup(h6) if h6 is not None and n >= 48 else 0.0
    x[k] = whole if rep_ok else 0.0
    lines = [ln for ln in text.split("\n") if len(ln) >= 4 and not ln.isspace()]
    if len(lines) >= 3 and rep_ok:
        counts: dict[str, int] = {}
        for ln in lines:
            ln = ln.strip()
            counts[ln] = counts.get(ln, 0) + 1
        x[k + 1] = 1 - len(counts) / len(lines)
        x[k + 2] = max(counts.values()) / len(lines)
    words = _WORD.findall(text.lower())
    x[k + 3] = len(set(words)) / len(words) if len(words) >= 8 and rep_ok else 1.0
    if wide:
        x[k + 4] = min(_mojibake(text), 20)
        x[k + 5] = min(text.count("\ufffd"), 20)
    k += 6
    x[k] = _dup(h6[-TAIL:]) if h6 is not None and n > TAIL + 8 else whole
    if x[k] > 0.4 and n >= 48:
        x[k + 1], x[k + 2] = _tail_period(cp[-TAIL:])
    if removed:  # a doubled name inside a call is still one
        words = _WORD.findall(raw.lower())
    x[k + 3] = min(
        sum(
            1
            for w in words
            if len(w) >= 8 and not len(w) % 2 and w[: len(w) // 2] == w[len(w) // 2 :]
        ),
        5,
    )
    if "<" in text or "[" in text or "\uff5c" in text:
        x[k + 4] = min(sum(1 for _ in salad.special_tokens(text)), 5)
    k = _LOCAL
    x[k : k + 5] = _local(text, contrast6, contrast1, u1, wlen)
    if n:
        x[k + 5], x[k + 6], x[k + 7] = weights.scores(orig, cp)
    return np.array(x), original_offset(where, removed) if removed else where


def _dup(h: npt.NDArray[np.uint32]) -> float:
    """The share of 6-grams seen earlier in the same text (repetition of any kind)."""
    s = np.sort(h)
    return int(np.count_nonzero(s[1:] == s[:-1])) / h.size


def _tail_period(t: npt.NDArray[np.uint32]) -> tuple[float, float]:
    """How periodic the end of a text is (normalized code points: digits are all "0", so
    rising list numbers do not hide a loop): the best share of characters equal to the one
    ``p`` earlier, for ``p`` up to a third of the tail, and the copies of that period."""
    n = t.size
    top = min(64, n // 3)
    span = n - top
    i = np.arange(span)
    shifts = np.arange(1, top + 1)
    match = (t[None, i] == t[shifts[:, None] + i[None, :]]).mean(axis=1)
    p = int(np.argmax(match))
    return float(match[p]), float(np.log1p(n / (p + 1)))


_LOCAL = NAMES.index("unseen6_contrast")


def _local(
    text: str,
    contrast6: float,
    contrast1: float,
    u1: npt.NDArray[np.uint8] | None,
    wlen: npt.NDArray[np.intp] | None,
) -> list[float]:
    """How much the worst spot stands out of the text's own level (a corrupted span in a
    long text of code holds as many unseen 6-grams as the code's worst line, but far more
    than its usual one: ``contrast6``, the worst 32 6-grams' share of unseen ones less the
    text's; ``contrast1``, the same of the worst 8 words, both read by ``vector``), long
    unseen words, digits inside words (``blo3ck``) and how well the text compresses
    (``u1``: unseen words)."""
    x = [contrast6, 0.0, 0.0, 0.0, 0.0]
    if u1 is not None and wlen is not None:
        m = u1.size
        x[1] = contrast1
        x[2] = int(np.count_nonzero((wlen >= 12) & (u1 == 1))) / m
        if _DIGIT.search(text) is not None:
            x[3] = len(_DIGIT_IN_WORD.findall(text)) / m
    if text:
        b = text.encode("utf-8", "surrogatepass")
        x[4] = len(zlib.compress(b, 6)) / len(b)
    return x


__all__ = ["NAMES", "RULE_SIGNALS", "vector"]
