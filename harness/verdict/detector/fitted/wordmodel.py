"""A hashed model of the words clean text uses, and of which word follows which.

Corruption that keeps every character n-gram plausible still shows at the word level: the
tokens of two outputs interleaved, a span swapped in at the wrong place, a few words
replaced by glued sub-word pieces (``sessnegotiate``) make words, or pairs of neighbouring
words, that clean text does not use. The model is two bit tables, counted on clean text
only (``tools/detector/train.py``): the words used at least twice, and the pairs of
neighbouring words used at least twice, each hashed to one bit.

A word is a maximal run of word characters of the normalized code points
(``charmodel.codes``: ASCII lower-cased, digits as ``0``): ASCII letters, digits and ``_``,
and every code point from U+00C0 on except the punctuation and symbol blocks. Words are
hashed all at once in numpy (a polynomial hash mod 2**32 from prefix sums, the powers of an
odd multiplier and of its inverse).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from harness.verdict.detector.fitted.charmodel import codes

U32 = np.uint32
_M = 0x01000193  # odd: invertible mod 2**32
_MINV = pow(_M, -1, 1 << 32)
_MIX1 = U32(0x9E3779B1)
_MIX2 = U32(0x85EBCA77)
_POW: list[npt.NDArray[np.uint32]] = []  # [M**i, M**-i], grown on demand


def _powers(n: int) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    if not _POW or _POW[0].size < n:
        size = max(n, 4096, 2 * _POW[0].size if _POW else 0)
        up = np.full(size, _M, dtype=U32)
        up[0] = 1
        down = np.full(size, _MINV, dtype=U32)
        down[0] = 1
        _POW[:] = [np.cumprod(up, dtype=U32), np.cumprod(down, dtype=U32)]
    return _POW[0], _POW[1]


_NOT_WORD_RANGES = ((0x80, 0xBF), (0x2000, 0x2BFF), (0x3000, 0x303F), (0xFE30, 0xFE4F))
_ASCII_WORD = np.zeros(128, dtype=bool)
_ASCII_WORD[48:58] = _ASCII_WORD[97:123] = True
_ASCII_WORD[95] = True  # _ (identifiers)


_ASCII_WORD_I8 = _ASCII_WORD.view(np.int8)


def word_chars(cp: npt.NDArray[np.uint32]) -> npt.NDArray[np.bool_]:
    """Which normalized code points are word characters."""
    small = cp < 128
    out = _ASCII_WORD[np.where(small, cp, 0)]
    if not small.all():
        big = ~small
        for a, b in _NOT_WORD_RANGES:
            big &= (cp < a) | (cp > b)
        big &= (cp < 0xFF00) | (cp > 0xFF20)  # fullwidth punctuation and digits
        out |= big
    return out


def words(
    cp: npt.NDArray[np.uint32], wide: bool | None = None
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.intp]]:
    """The hash of every word of ``cp`` (normalized code points) and its length (``wide``:
    whether any code point is 128 or more, when known)."""
    h, _starts, lengths = words_at(cp, wide)
    return h, lengths


def words_at(
    cp: npt.NDArray[np.uint32], wide: bool | None = None
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``words`` with where each word starts: (hashes, starts, lengths)."""
    n = cp.size
    w = np.zeros(n + 2, dtype=np.int8)  # 1 on word characters, between two 0s
    if wide is None:
        wide = bool(n) and bool(cp.max() >= 128)
    if wide:
        w[1:-1] = word_chars(cp)
    else:
        _ASCII_WORD_I8.take(cp, out=w[1:-1])
    edge = np.flatnonzero(w[1:] - w[:-1])  # a word's start, its end (exclusive), ...
    if not edge.size:
        none = np.zeros(0, dtype=np.intp)
        return np.zeros(0, dtype=U32), none, none
    starts, ends = edge[0::2], edge[1::2]
    up, down = _powers(n)
    s = np.zeros(n + 1, dtype=U32)  # s[j]: the sum of c_i * M**-i for i < j
    np.cumsum(cp * down[:n], dtype=U32, out=s[1:])
    h = (s[ends] - s[starts]) * up[ends - 1]  # sum of c_j * M**(end - 1 - j)
    h *= _MIX1
    return h, starts, ends - starts


#: The last text ``text_words`` read, and its words (read-only arrays).
_LAST: list[tuple[str, tuple[npt.NDArray[np.uint32], npt.NDArray[np.intp], npt.NDArray[np.intp]]]]
_LAST = []


def text_words(
    text: str, cp: npt.NDArray[np.uint32] | None = None, wide: bool | None = None
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """``words_at`` of ``text``'s normalized code points (``cp``, when already made), the
    last text's kept: the fitted features and the stray-token reading hash one text's words
    once. The arrays are read-only (they are shared)."""
    if _LAST:
        last, found = _LAST[0]
        if last is text or last == text:
            return found
    found = words_at(codes(text) if cp is None else cp, wide)
    for a in found:
        a.flags.writeable = False
    _LAST[:] = [(text, found)]
    return found


def pairs(h: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
    """The hash of every pair of neighbouring words (of ``words``' hashes)."""
    out: npt.NDArray[np.uint32] = (h[:-1] * _MIX2) ^ (h[1:] >> U32(7)) ^ h[1:]
    return out


@dataclass(frozen=True)
class WordModel:
    """Two bit tables (uint8, 1 if clean text uses it twice or more): words and pairs."""

    w1: npt.NDArray[np.uint8]
    w2: npt.NDArray[np.uint8]

    def unseen(self, h: npt.NDArray[np.uint32]) -> tuple[npt.NDArray[np.uint8], ...]:
        """1 for every word, and every pair of neighbouring words, clean text does not use."""
        (b1, b2), (n1, n2) = self._shifts, self._unseen
        return n1.take(h >> b1), n2.take(pairs(h) >> b2)

    @functools.cached_property
    def _shifts(self) -> tuple[np.uint32, np.uint32]:
        b1, b2 = (U32(32 - (int(t.size).bit_length() - 1)) for t in (self.w1, self.w2))
        return b1, b2

    @functools.cached_property
    def _unseen(self) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint8]]:
        one = np.uint8(1)
        return np.bitwise_xor(self.w1, one), np.bitwise_xor(self.w2, one)


def count(texts: Iterable[str], bits1: int, bits2: int, least: int = 2) -> WordModel:
    """Count the tables on clean ``texts`` (training only)."""
    n1 = np.zeros(1 << bits1, dtype=np.int64)
    n2 = np.zeros(1 << bits2, dtype=np.int64)
    p1: list[npt.NDArray[np.uint32]] = []
    p2: list[npt.NDArray[np.uint32]] = []
    size = 0

    def flush() -> None:
        nonlocal n1, n2
        if p1:
            n1 += np.bincount(np.concatenate(p1) >> U32(32 - bits1), minlength=1 << bits1)
        if p2:
            n2 += np.bincount(np.concatenate(p2) >> U32(32 - bits2), minlength=1 << bits2)
        p1.clear()
        p2.clear()

    for text in texts:
        h, _ = words(codes(text))
        p1.append(h)
        p2.append(pairs(h))
        size += h.size
        if size > 4_000_000:
            flush()
            size = 0
    flush()
    return WordModel((n1 >= least).astype(np.uint8), (n2 >= least).astype(np.uint8))


__all__ = ["WordModel", "count", "pairs", "text_words", "word_chars", "words", "words_at"]
