"""Tokens of a text as numpy arrays: offsets and 64-bit ids, with no Python strings.

Tokens are words of any script, or single characters of scripts written without spaces
(Chinese, Japanese, Thai, ...), case-folded; punctuation and markup are not tokens. Each
token's id is a polynomial hash of its lower-case code points, taken from one cumulative
sum over the text, so any character range can be hashed in O(1) as well (``Tokens.sub``):
the glued-word and periodic-word checks hash every split point of every word at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from harness.verdict.detector.chars import WIDE, Chars

_SPACELESS = (
    "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3100-\u312f"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
)
_SPACELESS_RANGES = (
    (0x0E00, 0x0F00),
    (0x1000, 0x10A0),
    (0x1780, 0x1800),
    (0x3040, 0x3100),
    (0x3100, 0x3130),
    (0x3400, 0x4DC0),
    (0x4E00, 0xA000),
    (0xF900, 0xFB00),
)
TOKEN = re.compile(f"[{_SPACELESS}]|[^\\W_{_SPACELESS}]+")
_PLANES = 0x30000
_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_IP = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_M1 = np.uint64(0x9E3779B97F4A7C15)

Ids = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class Tokens:
    ids: Ids  # one hash per token
    starts: npt.NDArray[np.int64]  # character offsets (empty when built from strings)
    ends: npt.NDArray[np.int64]
    digit: npt.NDArray[np.bool_]  # all digits
    small: npt.NDArray[np.bool_]  # one ASCII character, or all digits (formula units)
    words: Callable[[int, int], list[str]]  # the case-folded tokens [i, j)
    letters: npt.NDArray[np.bool_] | None = None  # no digit inside
    #: ids of arbitrary character ranges [s, e), comparable with ``ids``
    sub: Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], Ids] | None = None
    #: the cumulative sum ``sub`` hashes from: sum of code point * P**i over [0, offset)
    prefix: Ids | None = None

    def __len__(self) -> int:
        return int(self.ids.size)


# ------------------------------------------------------------------ tokenizing


_EXPANDS = np.uint32(0xFFFFFFFF)  # lower case of more than one character ("İ" -> "i̇")
_CAPITAL_SIGMA = 0x03A3  # lower case depends on the position ("ς" at a word's end)


@cache
def _char_tables() -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint32]]:
    """Per code point: 0 separator, 1 word character, 2 spaceless-script character (a token
    of its own); and its lower case (``str.lower``), ``_EXPANDS`` when that is longer."""
    chars = list(map(chr, range(_PLANES)))
    kind = np.zeros(_PLANES + 1, dtype=np.uint8)
    kind[:_PLANES] = np.fromiter(map(str.isalnum, chars), dtype=bool, count=_PLANES)
    lower = np.arange(_PLANES + 1, dtype=np.uint32)
    for cp, low in enumerate(map(str.lower, chars)):
        if len(low) != 1:
            lower[cp] = _EXPANDS
        elif low != chars[cp]:
            lower[cp] = ord(low)
    kind[ord("_")] = 0
    for lo_cp, hi_cp in _SPACELESS_RANGES:
        kind[lo_cp:hi_cp] = 2
    return kind, lower


_ASCII_KIND = bytes(1 if chr(c).isascii() and chr(c).isalnum() else 0 for c in range(256))
_ASCII_LOWER = bytes(c + 32 if 65 <= c <= 90 else c for c in range(256))


def tokenize(text: str, ch: Chars | None = None) -> Tokens:
    """Tokens of ``text`` with their ids and character offsets (numpy, no strings)."""
    ch = ch if ch is not None else Chars(text)
    kind = np.frombuffer(ch.b7.translate(_ASCII_KIND), dtype=np.uint8)
    vals: npt.NDArray[np.unsignedinteger] = np.frombuffer(
        ch.b7.translate(_ASCII_LOWER), dtype=np.uint8
    )
    if not ch.ascii:
        ktab, ltab = _char_tables()
        wide = ch.wide
        cw = ch.codes[wide]
        at = np.minimum(cw, _PLANES)
        kind = kind.copy()
        kind[wide] = ktab[at]
        # lower case from the table (code points past the table have none); str.lower
        # when it reads the context (capital sigma); none at all when it would make the
        # text longer (as the offsets must stay those of the text)
        lw = np.where(cw < _PLANES, ltab[at], cw)
        if np.count_nonzero(lw == _EXPANDS):  # the text is hashed as it is, not lower-cased
            vals = ch.codes
        elif np.count_nonzero(cw == _CAPITAL_SIGMA):
            low = text.lower()
            vals = np.frombuffer(low.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        else:
            vals = vals.astype(np.uint32)
            vals[wide] = lw
    word = kind > 0
    # a token starts at a word character after a separator, and at every spaceless one,
    # and ends before a separator or a spaceless character, or at a spaceless one: two
    # neighbours are in one token when both are word characters of a spaced script
    joined = kind == 1
    joined = joined[:-1] & joined[1:]
    start = word.copy()
    start[1:] &= ~joined
    starts = start.nonzero()[0]
    if not starts.size:
        empty = np.zeros(0, dtype=np.uint64)
        no = empty.astype(bool)
        return Tokens(empty, starts, starts, no, no, lambda i, j: [])
    end = word.copy()
    end[:-1] &= ~joined
    ends = end.nonzero()[0] + 1
    # polynomial hash of each token's (lower-case) code points: one cumulative sum, then
    # two look-ups per token; the same for ASCII and non-ASCII text
    n = len(text)
    pw, ipw = _pow_tables(n)
    h = np.zeros(n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(vals * pw[:n], out=h[1:])

    def sub(s: npt.NDArray[np.int64], e: npt.NDArray[np.int64]) -> Ids:
        with np.errstate(over="ignore"):
            raw = (h[e] - h[s]) * ipw[s]
            return (raw ^ (raw >> np.uint64(31))) * _M1

    ids = sub(starts, ends)
    lens = ends - starts
    cdig = np.zeros(n + 1, dtype=np.int32)  # digits before each offset
    ch.cls("digit").cumsum(out=cdig[1:])
    ndig = cdig[ends] - cdig[starts]
    digit = ndig == lens
    small = digit | ((lens == 1) & (ch.b[starts] != WIDE))

    def words(i: int, j: int) -> list[str]:
        pairs = zip(starts[i:j].tolist(), ends[i:j].tolist(), strict=True)
        return [text[s:e].lower() for s, e in pairs]

    return Tokens(ids, starts, ends, digit, small, words, ndig == 0, sub, h)


def periodic(tok: Tokens) -> list[tuple[int, float]]:
    """Words that are one unit of 2-8 letters repeated 4+ times ("एकएकएकएक",
    "búnbúnbúnbún"; 6+ times for two-letter units: "hahaha" is laughter): a loop the word
    tokenizer cannot see. (character offset, copies) per word; a word is periodic with
    period k when it equals itself shifted by k, one hash comparison."""
    h = tok.prefix
    if h is None or tok.letters is None or not len(tok):
        return []
    lens = tok.ends - tok.starts
    cand = (tok.letters & (lens >= 8)).nonzero()[0]
    out: list[tuple[int, float]] = []
    pw, _ = _pow_tables(8)
    for k in range(2, 9):
        cand = cand[lens[cand] >= (6 if k == 2 else 4) * k]
        if not cand.size:
            break
        s, e = tok.starts[cand], tok.ends[cand]
        # sub(s, e - k) == sub(s + k, e), without the hashing: the mix is one-to-one, and
        # (h[e-k] - h[s]) / P**s == (h[e] - h[s+k]) / P**(s+k) is this times P**(s+k)
        same = (h[e - k] - h[s]) * pw[k] == h[e] - h[s + k]
        for i in cand[same].tolist():
            out.append((int(tok.starts[i]), float(lens[i] / k)))
        cand = cand[~same]
    return out


def glued(tok: Tokens, part: int = 3) -> npt.NDArray[np.int64]:
    """Tokens that are two other tokens of the same text glued together ("eineDas",
    "ΑθήναΑθήνα", "wiewie"): word soup made of the text's own words. Only tokens seen once,
    of letters, 2 x ``part`` long or more; both pieces (``part``+ letters) must occur on
    their own elsewhere in the text. Returns the character offsets of those tokens.
    Vectorized: every split point of every candidate is hashed at once, and looked up in
    a 64 k-entry bitmap of the vocabulary before the exact look-up of the few that pass."""
    none = np.zeros(0, dtype=np.int64)
    if tok.sub is None or tok.letters is None or len(tok) < 3:
        return none
    lens = tok.ends - tok.starts
    words = (tok.letters & (lens >= part)).nonzero()[0]
    if words.size < 3:
        return none
    ids = tok.ids[words]
    seen_once = ~_repeated(ids)
    cand = words[seen_once & (lens[words] >= 2 * part)]
    if not cand.size:
        return none
    bitmap = np.zeros(1 << 16, dtype=bool)
    bitmap[(ids >> np.uint64(48)).astype(np.intp)] = True
    splits = lens[cand] - 2 * part + 1
    which = np.repeat(cand, splits)
    first = splits.cumsum() - splits
    at = np.arange(which.size) - np.repeat(first, splits) + part + tok.starts[which]
    a = tok.sub(tok.starts[which], at)
    b = tok.sub(at, tok.ends[which])
    maybe = (
        bitmap[(a >> np.uint64(48)).astype(np.intp)] & bitmap[(b >> np.uint64(48)).astype(np.intp)]
    ).nonzero()[0]
    if not maybe.size:
        return none
    vocab = np.sort(ids)
    a, b, which = a[maybe], b[maybe], which[maybe]
    ka = np.minimum(vocab.searchsorted(a), vocab.size - 1)
    kb = np.minimum(vocab.searchsorted(b), vocab.size - 1)
    hit = which[(vocab[ka] == a) & (vocab[kb] == b)]
    if not hit.size:
        return none
    out: npt.NDArray[np.int64] = tok.starts[np.unique(hit)]
    return out


def _repeated(ids: Ids) -> npt.NDArray[np.bool_]:
    """Per id: does it occur more than once (one packed sort, no argsort)."""
    n = ids.size
    bits = np.uint64(max(1, n.bit_length()))
    key = ((ids >> bits) << bits) | np.arange(n, dtype=np.uint64)
    key.sort()
    h = key >> bits
    same = np.zeros(n + 1, dtype=bool)
    same[1:-1] = h[1:] == h[:-1]
    rep = same[:-1] | same[1:]  # equal to the neighbour before or after, in sorted order
    out = np.zeros(n, dtype=bool)
    out[(key & ((np.uint64(1) << bits) - np.uint64(1))).astype(np.intp)] = rep
    return out


def tokens_of(text: str) -> list[str]:
    """The case-folded tokens of ``text`` as strings (for tests and small texts)."""
    low = text.lower()
    if len(low) != len(text):
        low = text
    return TOKEN.findall(low)


def from_strings(tokens: list[str]) -> Tokens:
    ids = np.fromiter(
        (hash(t) & 0xFFFFFFFFFFFFFFFF for t in tokens), dtype=np.uint64, count=len(tokens)
    )
    digit = np.fromiter(map(str.isdigit, tokens), dtype=bool, count=len(tokens))
    small = digit | np.fromiter(
        ((len(t) == 1 and t.isascii()) for t in tokens), dtype=bool, count=len(tokens)
    )
    none = np.zeros(0, dtype=np.int64)
    return Tokens(ids, none, none, digit, small, lambda i, j: tokens[i:j])


@cache
def _powers(size: int) -> tuple[Ids, Ids]:
    pw = np.full(size, _P, dtype=np.uint64)
    pw[0] = 1
    ipw = np.full(size, _IP, dtype=np.uint64)
    ipw[0] = 1
    return np.cumprod(pw, dtype=np.uint64), np.cumprod(ipw, dtype=np.uint64)


def _pow_tables(n: int) -> tuple[Ids, Ids]:
    pw, ipw = _powers(1 << max(10, (n + 1).bit_length()))  # cached by powers of two
    return pw[: n + 1], ipw[: n + 1]
