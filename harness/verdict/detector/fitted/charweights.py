"""Learned weights of character n-grams: how much each piece of a text looks like corruption.

The character model (``charmodel.py``) says how improbable a text is under clean text; it
does not know what corruption looks like. This model does: a weight for every hashed
character n-gram (normalized 3-, 4- and 5-grams, and 3-grams of the raw code points, so
that case matters: ``bolE``), fit to tell corrupted texts from clean ones
(``tools/detector/train.py``, on the ``ngram`` split of the corpus: its clean texts and
corruption made from them, never the texts the trees are fit on). A text's score is its
worst window: the largest mean of the weights of the n-grams ending in any ``WINDOW``
consecutive characters, the whole text when it is shorter. The weights are fit for exactly
that score (a logistic loss on the worst window, the multiple-instance reading: one corrupted
window makes a corrupted text), so a long clean prefix does not dilute a corrupted tail.

Glued sub-word pieces (``frenSTStudyccyr``), digits inside words (``blo3ck``), words cut
mid-way (``call93er``) and letters of two scripts touching are n-grams clean text does not
write; the weights learn which of the unseen ones matter and which (hashes, identifiers,
version strings) do not.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

U32 = np.uint32
WINDOW = 32  # characters
#: (n, normalized?) of every column of ``ids``.
GRAMS = ((3, True), (4, True), (5, True), (3, False))
_LONGEST = max(n for n, _ in GRAMS)
_M = U32(0x01000193)  # the polynomial hash's base (odd)
#: Odd multipliers that spread each column's hashes over the table (multiplicative
#: hashing: the bucket is the top bits of the product).
_SPREAD = (U32(0x9E3779B1), U32(0x85EBCA77), U32(0xC2B2AE3D), U32(0x27D4EB2F))
_RAW = U32(0x5BD1E995)  # sets the raw 3-grams apart from the normalized ones


def squeeze(
    raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32]
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.uint32]]:
    """Both without the second and later spaces of every run of spaces (or tabs): justified
    text, columns and aligned tables put runs of spaces anywhere in a line, and they say
    nothing about corruption that the other n-grams do not."""
    sp = cp == 32
    if not sp.any():
        return raw, cp
    keep = ~(sp[1:] & sp[:-1])
    if keep.all():
        return raw, cp
    keep = np.concatenate(([True], keep))
    return raw[keep], cp[keep]


def _buckets(
    raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32], bits: int
) -> list[npt.NDArray[np.uint32]]:
    """The columns of ``ids``, one array each (see there)."""
    raw, cp = squeeze(raw, cp)
    if cp.size < _LONGEST:
        return [np.zeros(0, dtype=U32) for _ in GRAMS]
    shift = U32(32 - bits)
    # polynomial hashes of every n-gram, one length from the one before: h[k][i] is the
    # hash of the k + 1 code points from i on (mod 2**32)
    h2 = cp[:-1] * _M + cp[1:]
    h3 = h2[:-1] * _M + cp[2:]
    h4 = h3[:-1] * _M + cp[3:]
    h5 = h4[:-1] * _M + cp[4:]
    r3 = (raw[:-2] * _M + raw[1:-1]) * _M + raw[2:]
    return [  # aligned on the character each n-gram ends at, from the fifth on
        (h3[2:] * _SPREAD[0]) >> shift,
        (h4[1:] * _SPREAD[1]) >> shift,
        (h5 * _SPREAD[2]) >> shift,
        ((r3[2:] ^ _RAW) * _SPREAD[3]) >> shift,
    ]


def ids(raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32], bits: int) -> npt.NDArray[np.intp]:
    """The buckets (``bits`` of a hash) of the n-grams of ``GRAMS`` that end at every
    character from the fifth on, runs of spaces read as one (``squeeze``): an array of
    ``len(cp) - 4`` rows (fewer when spaces were squeezed) and ``len(GRAMS)`` columns
    (``raw``: the code points, ``cp``: the same normalized by ``charmodel.codes``)."""
    return np.stack(_buckets(raw, cp, bits), axis=1).astype(np.intp)


def worst(values: npt.NDArray[np.float64], w: int) -> float:
    """The largest mean of ``w`` consecutive ``values`` (the mean of all when fewer)."""
    if values.size <= w:
        return float(values.mean())
    c = np.concatenate(([0.0], values.cumsum()))
    return float((c[w:] - c[:-w]).max()) / w


@dataclass(frozen=True)
class CharWeights:
    """The weight of every bucket (float32) and the offset of the score."""

    weights: npt.NDArray[np.float32]
    bias: float

    @property
    def bits(self) -> int:
        return int(self.weights.size).bit_length() - 1

    def per_char(
        self, raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32]
    ) -> npt.NDArray[np.float64]:
        """The summed weight of the n-grams ending at every character from the fifth on."""
        cols = _buckets(raw, cp, self.bits)
        out: npt.NDArray[np.float64] = self.weights.take(cols[0]).astype(np.float64)
        for c in cols[1:]:
            out += self.weights.take(c)
        return out

    def scores(
        self, raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32]
    ) -> tuple[float, float, float]:
        """(worst window of ``WINDOW``, worst window of 12, the whole text's mean), plus the
        bias: the model's log-odds of corruption for each reading (0s for texts of fewer
        than five characters)."""
        s = self.per_char(raw, cp)
        if not s.size:
            return 0.0, 0.0, 0.0
        return (
            worst(s, WINDOW) + self.bias,
            worst(s, 12) + self.bias,
            float(s.mean()) + self.bias,
        )


__all__ = ["GRAMS", "WINDOW", "CharWeights", "ids", "squeeze", "worst"]
