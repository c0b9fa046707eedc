"""Loops: exact periodic repetition of tokens, and drifting loops with no exact period.

Tokens are words of any script, or single characters of scripts written without spaces
(Chinese, Japanese, Thai, ...), case-folded; punctuation and markup are not tokens. Each
token is hashed once, each n-gram of tokens gets a combined hash, and numpy finds, for every
n-gram, the distance to its previous occurrence. Then:

* an exact loop is a stretch where that distance stays the same (the period), so the number
  of copies is known without comparing strings;
* a drifting loop is a window where most n-grams were already seen a little earlier: the
  ratio of distinct n-grams in the window is low even though no period is exact.

Repetition that mirrors the context (the prompt repeated it, or asked for N copies) is not a
loop: the unit is looked up in the context and the number of copies allowed is taken from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import islice

import numpy as np
import numpy.typing as npt

_SPACELESS = (
    "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3100-\u312f"
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
)
TOKEN = re.compile(f"[{_SPACELESS}]|[^\\W_{_SPACELESS}]+")
_ASCII_TOKEN = re.compile(r"[A-Za-z0-9]+")
_NUMBER = re.compile(r"\b\d{1,5}\b")
N = 4  # n-gram length for exact loops
N_DRIFT = 3  # n-gram length for drifting loops
_NEAR = 320  # a drifting loop repeats n-grams seen within this many tokens
_WINDOW = 64  # tokens per drift window
_M1 = np.int64(0x9E3779B97F4A7C15 - (1 << 64))
_M2 = np.int64(0xC2B2AE3D27D4EB4F - (1 << 64))


@dataclass(frozen=True)
class Loop:
    start: int  # token index where the repeated stretch starts (first copy)
    end: int  # token index after it
    period: int  # tokens per copy (0 for a drifting loop)
    copies: float
    score: float
    kind: str  # "loop" or "drift"


def _ids(tokens: list[str]) -> npt.NDArray[np.int64]:
    return np.fromiter(map(hash, tokens), dtype=np.int64, count=len(tokens))


def _hashes(ids: npt.NDArray[np.int64], n: int = 4) -> npt.NDArray[np.int64]:
    n = min(n, ids.size)
    if n == 0:
        return ids
    g = ids[: ids.size - n + 1].copy()
    with np.errstate(over="ignore"):
        for k in range(1, n):
            g = g * _M1 + ids[k : ids.size - n + 1 + k] * _M2 + np.int64(k)
    return g


def _prev_distance(g: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each n-gram, distance (in tokens) to its previous occurrence; huge if none."""
    order = np.argsort(g, kind="stable")
    sg = g[order]
    same = np.empty(g.size, dtype=bool)
    if g.size:
        same[0] = False
        same[1:] = sg[1:] == sg[:-1]
    dist = np.full(g.size, 1 << 40, dtype=np.int64)
    prev = np.empty(g.size, dtype=np.int64)
    prev[1:] = order[:-1]
    if g.size:
        prev[0] = 0
    dist[order[same]] = order[same] - prev[same]
    return dist


_ASCII_SEP = bytes(
    c if (48 <= c <= 57 or 97 <= c <= 122 or 65 <= c <= 90) else 32 for c in range(256)
)


def tokens_of(text: str) -> list[str]:
    low = text.lower()
    if len(low) != len(text):
        low = text
    if low.isascii():  # fast path: bytes.translate + split, both in C
        return low.encode("ascii").translate(_ASCII_SEP).decode("ascii").split()
    return TOKEN.findall(low)


def token_starts(text: str, count: int) -> list[int]:
    """Character offsets of the first ``count`` tokens (as ``tokens_of`` splits them)."""
    low = text.lower()
    if len(low) != len(text):
        low = text
    pat = _ASCII_TOKEN if low.isascii() else TOKEN
    return [m.start() for m in islice(pat.finditer(low), count)]


def find_loops(tokens: list[str], context_tokens: list[str] | None = None) -> list[Loop]:
    """Exact and drifting loops in a token list (highest score first)."""
    if len(tokens) < N + 2:
        return []
    ids = _ids(tokens)
    loops = _exact(tokens, _prev_distance(_hashes(ids, N)))
    g3 = _hashes(ids, N_DRIFT)
    digits = np.fromiter(map(str.isdigit, tokens), dtype=bool, count=len(tokens))
    numeric = digits[: g3.size].copy()
    for k in range(1, min(N_DRIFT, len(tokens))):
        numeric &= digits[k : k + g3.size]
    loops.extend(_drift(g3, _prev_distance(g3), context_tokens, numeric))
    if context_tokens is not None and loops:
        loops = [_mirror(tokens, lp, context_tokens) for lp in loops]
    loops.sort(key=lambda lp: -lp.score)
    return loops


def _exact(tokens: list[str], dist: npt.NDArray[np.int64]) -> list[Loop]:
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
        unit_tokens = tokens[s : s + p]
        if all(t.isdigit() for t in unit_tokens):
            if copies[i] < 64:
                continue  # rows of numbers (a matrix of zeros) are data, not a loop
            sc *= 0.5
        elif all((len(t) == 1 and t.isascii()) or t.isdigit() for t in unit_tokens):
            sc *= 0.4  # one-letter variables and numbers: formulas, weak evidence
        first = max(0, s - p)
        out.append(Loop(first, first + int(span[i]), p, float(copies[i]), sc, "loop"))
    return out


def _drift(
    g: npt.NDArray[np.int64],
    dist: npt.NDArray[np.int64],
    context_tokens: list[str] | None,
    numeric: npt.NDArray[np.bool_],
) -> list[Loop]:
    if g.size < 24:
        return []
    rep = (dist <= _NEAR) & ~numeric  # rows of numbers (data, matrices) are not loops
    if context_tokens is not None and len(context_tokens) >= N:
        rep &= ~np.isin(g, _hashes(_ids(context_tokens), N_DRIFT))
    w = min(_WINDOW, g.size)
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


def _mirror(tokens: list[str], lp: Loop, ctx: list[str]) -> Loop:
    """Discount a loop whose unit the context already holds, up to the count it allows."""
    if lp.kind != "loop":
        return lp
    unit = " ".join(tokens[lp.start : lp.start + lp.period])
    joined = " " + " ".join(ctx) + " "
    reps = joined.count(" " + unit + " ")
    if reps == 0 or (reps == 1 and lp.period < 3):
        return lp  # a short unit (a common word) seen once in the context proves nothing
    numbers = [int(x) for x in _NUMBER.findall(" ".join(ctx))]
    allowed = max([reps, *numbers]) * 1.25 + 2
    if lp.copies <= allowed:
        return Loop(lp.start, lp.end, lp.period, lp.copies, lp.score * 0.1, lp.kind)
    return lp
