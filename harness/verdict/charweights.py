"""Learned weights of character n-grams: how much each piece of a text looks like corruption.

The character model (``charmodel.py``) says how improbable a text is under clean text; it
does not know what corruption looks like. This model does: a weight for every hashed
character n-gram (normalized 3-, 4- and 5-grams, and 3-grams of the raw code points, so
that case matters: ``bolE``), fit to tell corrupted texts from clean ones
(``benchmarks/train_detector.py``, on the ``ngram`` split of the corpus: its clean texts and
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

from harness.verdict.charmodel import _MULT

U32 = np.uint32
WINDOW = 32  # characters
#: (n, normalized?) of every column of ``ids``.
GRAMS = ((3, True), (4, True), (5, True), (3, False))
_LONGEST = max(n for n, _ in GRAMS)
_SALT = (U32(0x0), U32(0x5BD1E995), U32(0x27D4EB2D), U32(0x68E31DA4))
_SPREAD = (U32(1), U32(3), U32(5), U32(7))


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


def ids(raw: npt.NDArray[np.uint32], cp: npt.NDArray[np.uint32], bits: int) -> npt.NDArray[np.intp]:
    """The buckets (``bits`` of a hash) of the n-grams of ``GRAMS`` that end at every
    character from the fifth on, runs of spaces read as one (``squeeze``): an array of
    ``len(cp) - 4`` rows (fewer when spaces were squeezed) and ``len(GRAMS)`` columns
    (``raw``: the code points, ``cp``: the same normalized by ``charmodel.codes``)."""
    raw, cp = squeeze(raw, cp)
    n = cp.size - _LONGEST + 1
    if n <= 0:
        return np.zeros((0, len(GRAMS)), dtype=np.intp)
    out = np.empty((n, len(GRAMS)), dtype=np.intp)
    shift = U32(32 - bits)
    prods: dict[bool, list[npt.NDArray[np.uint32]]] = {}
    for col, (k, norm) in enumerate(GRAMS):
        if norm not in prods:
            src = cp if norm else raw
            prods[norm] = [src * m for m in _MULT[:_LONGEST]]
        p = prods[norm]
        first = _LONGEST - k  # the n-gram of k ending at the same character as the longest
        h = p[0][first : first + n].copy()
        for j in range(1, k):
            h ^= p[j][first + j : first + j + n]
        out[:, col] = ((h * _SPREAD[col]) ^ _SALT[col]) >> shift
    return out


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
        b = ids(raw, cp, self.bits)
        out: npt.NDArray[np.float64] = self.weights[b].sum(axis=1, dtype=np.float64)
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
