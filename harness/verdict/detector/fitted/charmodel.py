"""A character n-gram model of clean text: how surprising each character of a text is.

Clean text of any language or format (prose, code, tables, catalogs) is made of character
4-grams that clean text uses; token salad, glued sub-word pieces, mojibake and digit noise
are not. The model is three hashed count tables (2-, 3- and 4-grams of normalized code
points: ASCII lower-cased, digits as ``0``, tabs as spaces), each stored as
``round(8 * log2(count + 1))`` in one byte per bucket. The surprisal of a character after
its three predecessors is::

    s = log2(n3 + 1) - log2(n4 + 1)      (bits; n4 = 0 costs 8 bits more)

with ``n3`` the count of the 3-gram context and ``n4`` the count of the 4-gram; the same
one level down gives ``s3``. A fourth table marks the 6-grams clean text uses (which word
follows which, across a space). The tables are counted by ``tools/detector/train.py`` on
clean text only and ship in the detector's model file (``detector_model.npz``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U32 = np.uint32
#: Odd multipliers of the n-gram hash, one per position in the n-gram (arithmetic mod 2**32;
#: the bucket is the top bits of the XOR of the products).
_MULT = (
    U32(0x9E3779B1),
    U32(0x85EBCA77),
    U32(0xC2B2AE3D),
    U32(0x27D4EB2F),
    U32(0x165667B1),
    U32(0xD3A2646D),
)
_MULT_COL = np.array(_MULT, dtype=U32)[:, None]  # (for all the products in one call)
UNSEEN_BITS = 8.0  # the extra cost of an n-gram clean text never used
_UNSEEN8 = int(8 * UNSEEN_BITS)
#: Normalization of the first 128 code points: ASCII lower case, digits -> "0", tab -> " ".
_ASCII = np.arange(128, dtype=np.uint32)
_ASCII[65:91] += 32
_ASCII[48:58] = 48
_ASCII[9] = 32
_ASCII[13] = 10
#: What a 4-gram (3-gram) of each log-count byte ``v`` adds to the surprisal of its last
#: character: ``-v``, and ``UNSEEN_BITS`` more when clean text never used it (``v == 0``).
_COST = -np.arange(256, dtype=np.int16)
_COST[0] = _UNSEEN8


def codes(text: str | npt.NDArray[np.uint32], wide: bool | None = None) -> npt.NDArray[np.uint32]:
    """The normalized code points of ``text`` (a string, or its code points; ``wide``: whether
    any is 128 or more, when known)."""
    cp = (
        np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        if isinstance(text, str)
        else text
    )
    if wide is None:
        wide = bool(cp.size) and bool(cp.max() >= 128)
    if not wide:
        return _ASCII.take(cp)
    small = cp < 128
    out = cp.copy()
    out[small] = _ASCII[cp[small]]
    return out


def grams(
    cp: npt.NDArray[np.uint32], bits: tuple[int, int, int]
) -> tuple[
    npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint32], npt.NDArray[np.uint32]
]:
    """For every 4-gram ``abcd`` of ``cp`` (``len(cp) - 3`` of them), the buckets of the
    3-gram ``abc`` (its context), of ``abcd``, of ``bc`` and of ``bcd`` (the same one level
    down), in tables of ``bits`` = (2-gram, 3-gram, 4-gram) bits."""
    p0, p1, p2, p3 = (cp * m for m in _MULT[:4])
    ctx3 = p0[:-3] ^ p1[1:-2] ^ p2[2:-1]
    four = ctx3 ^ p3[3:]
    ctx2 = p0[1:-2] ^ p1[2:-1]
    three = ctx2 ^ p2[3:]
    b2, b3, b4 = (U32(32 - b) for b in bits)
    return ctx3 >> b3, four >> b4, ctx2 >> b2, three >> b3


def sixes(cp: npt.NDArray[np.uint32], bits: int) -> npt.NDArray[np.uint32]:
    """The bucket of every 6-gram of ``cp``: across word boundaries, which word follows
    which (random words glued into salad are each fine, their neighbours are not)."""
    n = cp.size - 5
    h = cp[:n] * _MULT[0]
    for k in range(1, 6):
        h ^= cp[k : k + n] * _MULT[k]
    return h >> U32(32 - bits)


@dataclass(frozen=True)
class CharModel:
    """The three log-count tables (uint8, ``8 * log2(count + 1)``): 2-, 3- and 4-grams."""

    t2: npt.NDArray[np.uint8]
    t3: npt.NDArray[np.uint8]
    t4: npt.NDArray[np.uint8]
    t6: npt.NDArray[np.uint8]  # 6-grams: 1 if clean text uses it, else 0

    @property
    def bits(self) -> tuple[int, int, int]:
        b2, b3, b4 = (int(t.size).bit_length() - 1 for t in (self.t2, self.t3, self.t4))
        return b2, b3, b4

    def surprisal(
        self, cp: npt.NDArray[np.uint32]
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], npt.NDArray[np.int32]]:
        """Per character from the fourth on, in eighths of a bit: the 4-gram surprisal
        ``s4``, the 3-gram one ``s3`` (aligned on the same characters), and 1 where the
        4-gram is one clean text never used (else 0)."""
        ctx3, four, ctx2, three = grams(cp, self.bits)
        l4 = self.t4[four].astype(np.int32)
        l3 = self.t3[three].astype(np.int32)
        unseen = (l4 == 0).view(np.int8).astype(np.int32)
        s4 = self.t3[ctx3] - l4 + unseen * _UNSEEN8
        s3 = self.t2[ctx2] - l3 + (l3 == 0) * _UNSEEN8
        return s4, s3, unseen

    def sixes(self, cp: npt.NDArray[np.uint32]) -> npt.NDArray[np.uint32]:
        """The 6-gram buckets of ``cp`` in this model's 6-gram table."""
        return sixes(cp, int(self.t6.size).bit_length() - 1)

    def unseen6(self, buckets: npt.NDArray[np.uint32]) -> npt.NDArray[np.int32]:
        """1 for every 6-gram (``sixes``) clean text never used, else 0."""
        return (self.t6[buckets] ^ 1).astype(np.int32)

    def read(self, cp: npt.NDArray[np.uint32]) -> Reading:
        """``surprisal``, ``sixes`` and ``unseen6`` of ``cp`` (5 code points or more) in one
        pass: the products of the n-gram hash computed once for all of them (a 6-gram's
        hash is its first 4-gram's, two more products XORed in), the tables read with
        ``take``, and each byte's share of the surprisal from one small table."""
        b2, b3, b4 = self._shifts
        n = cp.size
        p = cp * _MULT_COL[: 6 if n >= 8 else 4]
        m = n - 3
        ctx = np.empty((2, m), dtype=U32)  # the 3-grams: contexts of the 4-grams, and last
        ctx3 = np.bitwise_xor(p[0, :-3], p[1, 1:-2], out=ctx[0])
        ctx3 ^= p[2, 2:-1]
        four = ctx3 ^ p[3, 3:]
        ctx2 = p[0, 1:-2] ^ p[1, 2:-1]
        np.bitwise_xor(ctx2, p[2, 3:], out=ctx[1])
        ctx >>= b3
        l3 = self.t3.take(ctx)
        l4 = self.t4.take(four >> b4)
        s4 = l3[0] + _COST.take(l4)  # (uint8 + int16: int16)
        s3 = self.t2.take(ctx2 >> b2) + _COST.take(l3[1])
        six = unseen6 = None
        if n >= 8:
            k = n - 5
            h = four[:k] ^ p[4, 4 : 4 + k]
            h ^= p[5, 5:]
            six = h >> self._shift6
            unseen6 = self._unseen6.take(six)
        return Reading(s4, int(s3.sum()), l4 == 0, six, unseen6)

    @functools.cached_property
    def _shifts(self) -> tuple[np.uint32, np.uint32, np.uint32]:
        b2, b3, b4 = (U32(32 - b) for b in self.bits)
        return b2, b3, b4

    @functools.cached_property
    def _shift6(self) -> np.uint32:
        return U32(32 - (int(self.t6.size).bit_length() - 1))

    @functools.cached_property
    def _unseen6(self) -> npt.NDArray[np.uint8]:
        return np.bitwise_xor(self.t6, np.uint8(1))


@dataclass(frozen=True)
class Reading:
    """What ``CharModel.read`` finds in a text (per character from the fourth on, and per
    6-gram): the same values as ``surprisal``, ``sixes`` and ``unseen6``, other dtypes."""

    s4: npt.NDArray[np.int16]  # 4-gram surprisal, eighths of a bit
    s3_sum: int  # the sum of the 3-gram surprisal
    unseen4: npt.NDArray[np.bool_]  # the 4-gram is one clean text never used
    sixes: npt.NDArray[np.uint32] | None  # the 6-gram buckets (None under 8 code points)
    unseen6: npt.NDArray[np.uint8] | None  # 1 where clean text never used the 6-gram


def count(
    texts: Iterable[str], bits: tuple[int, int, int], bits6: int = 16, min6: int = 1
) -> CharModel:
    """Count the tables on clean ``texts`` (training only); a 6-gram counts as used when it
    occurs ``min6`` times or more."""
    texts = list(texts)
    tabs = [np.zeros(1 << b, dtype=np.int64) for b in bits]
    n6 = np.zeros(1 << bits6, dtype=np.int64)
    batch: list[npt.NDArray[np.uint32]] = []
    size = 0
    for i, text in enumerate(texts):
        cp = codes(text)
        if cp.size >= 6:
            batch.append(sixes(cp, bits6))
            size += cp.size
        if batch and (size > 8_000_000 or i == len(texts) - 1):
            n6 += np.bincount(np.concatenate(batch), minlength=1 << bits6)
            batch.clear()
            size = 0
    seen6 = (n6 >= min6).astype(np.uint8)
    pending: list[list[npt.NDArray[np.uint32]]] = [[], [], []]
    size = 0
    for i, text in enumerate(texts):
        cp = codes(text)
        if cp.size >= 4:
            ctx3, four, ctx2, _ = grams(cp, bits)
            pending[0].append(ctx2)
            pending[1].append(ctx3)
            pending[2].append(four)
            size += cp.size
        if pending[0] and (size > 4_000_000 or i == len(texts) - 1):
            for k, b in enumerate(bits):
                tabs[k] += np.bincount(np.concatenate(pending[k]), minlength=1 << b)
                pending[k].clear()
            size = 0
    q = [np.minimum(np.rint(8 * np.log2(t + 1.0)), 255).astype(np.uint8) for t in tabs]
    return CharModel(q[0], q[1], q[2], seen6)


__all__ = ["CharModel", "Reading", "codes", "count", "grams", "sixes"]
