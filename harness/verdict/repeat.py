"""Loops: exact periodic repetition of tokens, and drifting loops with no exact period.

Tokens are words of any script, or single characters of scripts written without spaces
(Chinese, Japanese, Thai, ...), case-folded; punctuation and markup are not tokens. Each
token gets a 64-bit hash, each n-gram of tokens a combined hash, and numpy finds, for every
n-gram, the distance to its previous occurrence. Then:

* an exact loop is a stretch where that distance stays the same (the period), so the number
  of copies is known without comparing strings;
* a drifting loop is a window where most n-grams were already seen a little earlier: the
  ratio of distinct n-grams in the window is low even though no period is exact.

Repetition that mirrors the context (the prompt repeated it, or asked for N copies) is not a
loop: the unit is looked up in the context and the number of copies allowed is taken from it.

Speed: tokens are found and hashed with numpy over the code points (a polynomial hash
through one cumulative sum), never as Python strings; a sort of the n-gram hashes first
tells whether anything repeats at all, and prose with no repeated n-grams stops there.
The context is tokenized only when a loop has been found.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from harness.verdict.salad import WIDE, Chars

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
N = 4  # n-gram length for exact loops
N_DRIFT = 3  # n-gram length for drifting loops
_NEAR = 320  # a drifting loop repeats n-grams seen within this many tokens
_WINDOW = 64  # tokens per drift window
_DRIFT_MIN = 0.35 + 0.3 * 0.3  # repeated share of a window below which drift scores < 0.3
_PLANES = 0x30000
_P = np.uint64(0x100000001B3)  # odd: invertible modulo 2**64
_IP = np.uint64(pow(0x100000001B3, -1, 1 << 64))
_M1 = np.uint64(0x9E3779B97F4A7C15)

Ids = npt.NDArray[np.uint64]


@dataclass(frozen=True)
class Loop:
    start: int  # token index where the repeated stretch starts (first copy)
    end: int  # token index after it
    period: int  # tokens per copy (0 for a drifting loop)
    copies: float
    score: float
    kind: str  # "loop" or "drift"


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

    def __len__(self) -> int:
        return int(self.ids.size)


# ------------------------------------------------------------------ tokenizing


@cache
def _char_tables() -> tuple[npt.NDArray[np.uint8], None]:
    """Per code point: 0 separator, 1 word character, 2 spaceless-script character (a token
    of its own)."""
    kind = np.zeros(_PLANES + 1, dtype=np.uint8)
    kind[[cp for cp in range(_PLANES) if chr(cp).isalnum()]] = 1
    kind[ord("_")] = 0
    for lo_cp, hi_cp in _SPACELESS_RANGES:
        kind[lo_cp:hi_cp] = 2
    return kind, None


_ASCII_KIND = bytes(1 if chr(c).isascii() and chr(c).isalnum() else 0 for c in range(256))
_ASCII_LOWER = bytes(c + 32 if 65 <= c <= 90 else c for c in range(256))


def tokenize(text: str, ch: Chars | None = None) -> Tokens:
    """Tokens of ``text`` with their ids and character offsets (numpy, no strings)."""
    ch = ch if ch is not None else Chars(text)
    kind = np.frombuffer(ch.b7.translate(_ASCII_KIND), dtype=np.uint8)
    if not ch.ascii:
        ktab, _ = _char_tables()
        kind = kind.copy()
        wide = ch.wide
        kind[wide] = ktab[np.minimum(ch.codes[wide], _PLANES)]
    if ch.ascii:
        vals: npt.NDArray[np.unsignedinteger] = np.frombuffer(
            ch.b7.translate(_ASCII_LOWER), dtype=np.uint8
        )
    else:
        low = text.lower()
        low = low if len(low) == len(text) else text
        vals = np.frombuffer(low.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    word = kind > 0
    solo = kind == 2
    # a token starts at a word character after a separator, and at every spaceless one
    start = word.copy()
    start[1:] &= ~word[:-1] | solo[:-1]
    start |= solo
    starts = np.flatnonzero(start)
    if not starts.size:
        empty = np.zeros(0, dtype=np.uint64)
        no = empty.astype(bool)
        return Tokens(empty, starts, starts, no, no, lambda i, j: [])
    # ... and ends before a separator or a spaceless character, or at a spaceless one
    end = word.copy()
    end[:-1] &= ~word[1:] | solo[1:] | solo[:-1]
    ends = np.flatnonzero(end) + 1
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
    dpos = np.flatnonzero(ch.cls("digit"))
    ndig = np.searchsorted(dpos, ends) - np.searchsorted(dpos, starts)
    digit = ndig == lens
    small = digit | ((lens == 1) & (ch.b[starts] != WIDE))

    def words(i: int, j: int) -> list[str]:
        pairs = zip(starts[i:j].tolist(), ends[i:j].tolist(), strict=True)
        return [text[s:e].lower() for s, e in pairs]

    return Tokens(ids, starts, ends, digit, small, words, ndig == 0, sub)


def periodic(tok: Tokens) -> list[tuple[int, float]]:
    """Words that are one unit of 2-8 letters repeated 4+ times ("एकएकएकएक",
    "búnbúnbúnbún"; 6+ times for two-letter units: "hahaha" is laughter): a loop the word
    tokenizer cannot see. (character offset, copies) per word; a word is periodic with
    period k when it equals itself shifted by k, one hash comparison."""
    if tok.sub is None or tok.letters is None or not len(tok):
        return []
    lens = tok.ends - tok.starts
    cand = np.flatnonzero(tok.letters & (lens >= 8))
    out: list[tuple[int, float]] = []
    for k in range(2, 9):
        cand = cand[lens[cand] >= (6 if k == 2 else 4) * k]
        if not cand.size:
            break
        s, e = tok.starts[cand], tok.ends[cand]
        same = tok.sub(s, e - k) == tok.sub(s + k, e)
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
    words = np.flatnonzero(tok.letters & (lens >= part))
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
    first = np.cumsum(splits) - splits
    at = np.arange(which.size) - np.repeat(first, splits) + part + tok.starts[which]
    a = tok.sub(tok.starts[which], at)
    b = tok.sub(at, tok.ends[which])
    maybe = np.flatnonzero(
        bitmap[(a >> np.uint64(48)).astype(np.intp)] & bitmap[(b >> np.uint64(48)).astype(np.intp)]
    )
    if not maybe.size:
        return none
    vocab = np.sort(ids)
    a, b, which = a[maybe], b[maybe], which[maybe]
    ka = np.minimum(np.searchsorted(vocab, a), vocab.size - 1)
    kb = np.minimum(np.searchsorted(vocab, b), vocab.size - 1)
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


# ------------------------------------------------------------------ n-grams


def _grams(ids: Ids, n: int) -> Ids:
    """One hash per n-gram of ids."""
    n = min(n, ids.size)
    if n == 0:
        return ids
    g = ids[: ids.size - n + 1].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            g = g * _M1 + ids[k : ids.size - n + 1 + k] + np.uint64(k)
    return g


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


def _gram_counts(ids: Ids, n: int) -> Ids:
    """Rolling hash of every n-gram (any n): for context look-ups of a loop's unit."""
    m = ids.size
    pw, ipw = _pow_tables(m)
    h = np.zeros(m + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(ids * pw[:m], out=h[1:])
        return (h[n:] - h[:-n]) * ipw[: m - n + 1]


def _dups(g: Ids) -> int:
    """How many n-grams repeat an earlier one (a sort, no index bookkeeping)."""
    if g.size < 2:
        return 0
    s = np.sort(g)
    return int(np.count_nonzero(s[1:] == s[:-1]))


def _prev_distance(g: Ids) -> npt.NDArray[np.int64]:
    """For each n-gram, distance (in tokens) to its previous occurrence; huge if none.

    The index is packed into the low bits of the hash so that one plain sort (much faster
    than an argsort) groups equal n-grams in order of position.
    """
    n = g.size
    dist = np.full(n, 1 << 40, dtype=np.int64)
    if n < 2:
        return dist
    bits = np.uint64(max(1, n.bit_length()))
    key = ((g >> bits) << bits) | np.arange(n, dtype=np.uint64)
    key.sort()
    idx = (key & ((np.uint64(1) << bits) - np.uint64(1))).astype(np.int64)
    h = key >> bits
    same = np.flatnonzero(h[1:] == h[:-1]) + 1
    dist[idx[same]] = idx[same] - idx[same - 1]
    return dist


# ------------------------------------------------------------------ loops


def _gate(tok: Tokens) -> tuple[bool, bool]:
    """(an exact loop is possible, a drifting loop is possible): an exact loop needs a
    repeated 4-gram, a drifting one a window's worth of repeated 3-grams."""
    if len(tok) < N + 2:
        return False, False
    exact = _dups(_grams(tok.ids, N)) > 0
    g3 = _grams(tok.ids, N_DRIFT)
    drift = g3.size >= 24 and _dups(g3) >= _DRIFT_MIN * min(_WINDOW, g3.size)
    return exact, drift


def possible(tok: Tokens) -> bool:
    """Cheap (two sorts): can these tokens hold a loop at all? Prose usually cannot."""
    return any(_gate(tok))


def find_loops(tokens: list[str], context_tokens: list[str] | None = None) -> list[Loop]:
    """Exact and drifting loops in a token list (highest score first)."""
    ctx = from_strings(context_tokens) if context_tokens is not None else None
    return find(from_strings(tokens), (lambda: ctx) if ctx is not None else None)


def find(tok: Tokens, context: Callable[[], Tokens | None] | None = None) -> list[Loop]:
    """Exact and drifting loops (highest score first). ``context`` gives the context's
    tokens, asked for only when there is a loop to compare with it."""
    if len(tok) < N + 2:
        return []
    g4 = _grams(tok.ids, N)
    g3 = _grams(tok.ids, N_DRIFT)
    d4 = _prev_distance(g4)
    loops = _exact(tok, d4)
    ctx: Tokens | None = None
    d3 = _prev_distance(g3)
    if g3.size >= 24 and np.count_nonzero(d3 <= _NEAR) >= _DRIFT_MIN * min(_WINDOW, g3.size):
        numeric = tok.digit[: g3.size].copy()
        for k in range(1, min(N_DRIFT, len(tok))):
            numeric &= tok.digit[k : k + g3.size]
        drift = _drift(d3, numeric, None)
        if drift and context is not None:
            ctx = context()
            if ctx is not None and len(ctx) >= N:
                drift = _drift(d3, numeric, np.isin(g3, _grams(ctx.ids, N_DRIFT)))
        loops.extend(drift)
    if context is not None and any(lp.kind == "loop" for lp in loops):
        ctx = ctx if ctx is not None else context()
        if ctx is not None:
            loops = [_mirror(tok, lp, ctx) for lp in loops]
    loops.sort(key=lambda lp: -lp.score)
    return loops


def _exact(tok: Tokens, dist: npt.NDArray[np.int64]) -> list[Loop]:
    key = np.where(dist <= _NEAR, dist, 0)
    if not key.any():
        return []
    change = np.flatnonzero(np.diff(key) != 0) + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [key.size]))
    periods = key[starts]
    span = ends - starts + N - 1 + periods
    copies = span / np.maximum(periods, 1)
    unit = np.minimum(1.0, 0.25 + 0.05 * periods)
    score = (copies - 1) * unit
    keep = np.flatnonzero((periods > 0) & (copies >= 2) & (span >= 6) & (score >= 0.3))
    out: list[Loop] = []
    for i in keep[np.argsort(-score[keep])][:32]:
        s, p = int(starts[i]), int(periods[i])
        sc = float(score[i])
        if tok.digit[s : s + p].all():
            if copies[i] < 64:
                continue  # rows of numbers (a matrix of zeros) are data, not a loop
            sc *= 0.5
        elif tok.small[s : s + p].all():
            sc *= 0.4  # one-letter variables and numbers: formulas, weak evidence
        first = max(0, s - p)
        out.append(Loop(first, first + int(span[i]), p, float(copies[i]), sc, "loop"))
    return out


def _drift(
    dist: npt.NDArray[np.int64],
    numeric: npt.NDArray[np.bool_],
    in_context: npt.NDArray[np.bool_] | None,
) -> list[Loop]:
    if dist.size < 24:
        return []
    rep = (dist <= _NEAR) & ~numeric  # rows of numbers (data, matrices) are not loops
    if in_context is not None:
        rep &= ~in_context  # n-grams present in the context do not count as repeats
    w = min(_WINDOW, dist.size)
    c = np.concatenate(([0], np.cumsum(rep)))
    dens = (c[w:] - c[:-w]) / w
    best = int(np.argmax(dens))
    d = float(dens[best])
    score = (d - 0.35) / 0.3
    if score < 0.3:
        return []
    # the loop starts where the first dense window's repeated n-grams were first seen
    first = int(np.flatnonzero(dens >= 0.5 * (d + 0.35))[0]) if d > 0.35 else best
    idx = np.flatnonzero(rep[first : first + w]) + first
    if idx.size:
        first = max(0, int((idx - dist[idx]).min()))
    return [Loop(first, best + w + N_DRIFT - 1, 0, 0.0, float(score), "drift")]


def _mirror(tok: Tokens, lp: Loop, ctx: Tokens) -> Loop:
    """Discount a loop whose unit the context already holds, up to the count it allows."""
    if lp.kind != "loop" or len(ctx) < lp.period:
        return lp
    unit = tok.ids[lp.start : lp.start + lp.period]
    target = _gram_counts(unit, lp.period)[0]
    reps = int(np.count_nonzero(_gram_counts(ctx.ids, lp.period) == target))
    if reps == 0 or (reps == 1 and lp.period < 3):
        return lp  # a short unit (a common word) seen once in the context proves nothing
    numbers = [int(w) for w in ctx.words(0, len(ctx)) if w.isdigit() and len(w) <= 5]
    allowed = max([reps, *numbers]) * 1.25 + 2
    if lp.copies <= allowed:
        return Loop(lp.start, lp.end, lp.period, lp.copies, lp.score * 0.1, lp.kind)
    return lp
