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

Speed: tokens come from ``tokens.py`` (numpy arrays, no strings); the distance to the
previous occurrence comes from one plain sort of the n-gram hashes with the position packed
into the low bits. The context is tokenized only when a loop has to be compared with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.verdict.detector.tokens import (
    _M1,
    TOKEN,
    Ids,
    Tokens,
    _pow_tables,
    from_strings,
    glued,
    periodic,
    tokenize,
    tokens_of,
)

__all__ = [
    "TOKEN",
    "Loop",
    "Tokens",
    "find",
    "find_loops",
    "from_strings",
    "glued",
    "periodic",
    "tokenize",
    "tokens_of",
]

N = 4  # n-gram length for exact loops
N_DRIFT = 3  # n-gram length for drifting loops
_NEAR = 320  # a drifting loop repeats n-grams seen within this many tokens
_WINDOW = 64  # tokens per drift window
_DRIFT_MIN = 0.35 + 0.3 * 0.3  # repeated share of a window below which drift scores < 0.3


@dataclass(frozen=True)
class Loop:
    start: int  # token index where the repeated stretch starts (first copy)
    end: int  # token index after it
    period: int  # tokens per copy (0 for a drifting loop)
    copies: float
    score: float
    kind: str  # "loop" or "drift"


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


def _grams_longer(g: Ids, ids: Ids, n: int) -> Ids:
    """``_grams(ids, n + 1)`` from ``g = _grams(ids, n)``: one more step of the same sum."""
    with np.errstate(over="ignore"):
        return g[: ids.size - n] * _M1 + ids[n:] + np.uint64(n)


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
    same = (h[1:] == h[:-1]).nonzero()[0] + 1
    dist[idx[same]] = idx[same] - idx[same - 1]
    return dist


# ------------------------------------------------------------------ loops


def find_loops(tokens: list[str], context_tokens: list[str] | None = None) -> list[Loop]:
    """Exact and drifting loops in a token list (highest score first)."""
    ctx = from_strings(context_tokens) if context_tokens is not None else None
    return find(from_strings(tokens), (lambda: ctx) if ctx is not None else None)


def find(tok: Tokens, context: Callable[[], Tokens | None] | None = None) -> list[Loop]:
    """Exact and drifting loops (highest score first). ``context`` gives the context's
    tokens, asked for only when there is a loop to compare with it."""
    if len(tok) < N + 2:
        return []
    g3 = _grams(tok.ids, N_DRIFT)
    g4 = _grams_longer(g3, tok.ids, N_DRIFT)  # == _grams(tok.ids, N)
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
    if not np.count_nonzero(key):
        return []
    change = (np.diff(key) != 0).nonzero()[0] + 1
    starts = np.concatenate(([0], change))
    ends = np.concatenate((change, [key.size]))
    periods = key[starts]
    span = ends - starts + N - 1 + periods
    copies = span / np.maximum(periods, 1)
    unit = np.minimum(1.0, 0.25 + 0.05 * periods)
    score = (copies - 1) * unit
    keep = ((periods > 0) & (copies >= 2) & (span >= 6) & (score >= 0.3)).nonzero()[0]
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
    c = np.concatenate(([0], rep.cumsum()))
    dens = (c[w:] - c[:-w]) / w
    best = int(np.argmax(dens))
    d = float(dens[best])
    score = (d - 0.35) / 0.3
    if score < 0.3:
        return []
    # the loop starts where the first dense window's repeated n-grams were first seen
    first = int((dens >= 0.5 * (d + 0.35)).nonzero()[0][0]) if d > 0.35 else best
    idx = rep[first : first + w].nonzero()[0] + first
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
