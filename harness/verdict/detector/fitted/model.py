"""The fitted decision: the detector's model file, loaded once, evaluated in numpy.

``detector_model.npz`` (next to this module) holds the character and word models' tables, the
n-gram weights of ``charweights.py`` (float16) and two
ensembles of gradient-boosted decision trees, both fit by ``tools/detector/train.py``
(scikit-learn's ``HistGradientBoostingClassifier``, a training dependency only: nothing here
imports it) and exported as flat arrays:

* ``corrupted``: the log-odds that a text is corrupted (salad or repetition), monotone
  non-decreasing in the features listed in the file's ``monotone`` array (the rules'
  windowed score: more evidence of the hand-written rules never lowers P);
* ``repetition``: among corrupted texts, the log-odds that it is a loop rather than salad.

and three thresholds on P(corrupted), all chosen on a validation split for the
false-positive goal: one for every text, a lower one for the texts where the hand-written
rules fired (where they are silent only the trees speak), and one for the texts where they
fired strongly (``text.STRONG``).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from harness.errors import ConfigError
from harness.verdict.detector.fitted import features
from harness.verdict.detector.fitted.charmodel import CharModel
from harness.verdict.detector.fitted.charweights import CharWeights
from harness.verdict.detector.fitted.wordmodel import WordModel

MODEL_FILE = Path(__file__).with_name("detector_model.npz")
FORMAT = 3  # the file's layout (1: a small neural network; 2: tree ensembles; 3: + n-gram weights)

F64 = npt.NDArray[np.float64]
IDX = npt.NDArray[np.intp]


@dataclass(frozen=True)
class Levels:
    """An ensemble laid out for a fast walk of one vector: every tree as a complete binary
    tree of ``depth`` levels (a leaf above the last level repeated down to it), level ``L``
    of all trees in one array of ``trees * 2**L`` positions, tree after tree, so that the
    children of position ``p`` are ``2p`` and ``2p + 1`` in the next level. A node does not
    store its test but the index of its (feature, threshold) pair among the ensemble's
    distinct pairs: a walk first decides every pair once, then reads one decision a node."""

    pair_feature: IDX  # the distinct (feature, threshold) pairs of the inner nodes, and
    pair_threshold: F64  # one (0, +inf) that never goes right, for the leaves
    keys: tuple[npt.NDArray[np.signedinteger], ...]  # per level, each position's pair
    leaf: npt.NDArray[np.signedinteger]  # the leaf at each position of the last level
    leaf_value: F64  # the value of each leaf
    start: IDX  # the roots' positions in level 0


def walk_levels(t: Trees) -> Levels:
    """``t`` laid out as ``Levels``: the same leaf for every vector, the leaves summed in
    the same order (tree order), hence the same float sum as ``Trees.raw_many``."""
    inner = t.left != np.arange(t.left.size)
    pairs = np.unique(np.stack([t.feature[inner], t.threshold[inner]]), axis=1)
    n = pairs.shape[1]
    pair_of = np.full(t.feature.size, n, dtype=np.intp)
    keyed = {(int(f), float(v)): k for k, (f, v) in enumerate(zip(*pairs.tolist(), strict=True))}
    pair_of[inner] = [
        keyed[(int(f), float(v))]
        for f, v in zip(t.feature[inner].tolist(), t.threshold[inner].tolist(), strict=True)
    ]
    small = np.int16 if n < 2**15 else np.int32  # (small arrays: fewer cache misses)
    keys: list[npt.NDArray[np.signedinteger]] = []
    node = t.roots.astype(np.intp)
    for _ in range(t.depth):
        keys.append(pair_of[node].astype(small))
        node = np.stack([t.left[node], t.right[node]], axis=1).ravel()
    leaves, leaf = np.unique(node, return_inverse=True)
    return Levels(
        pair_feature=np.append(pairs[0].astype(np.intp), 0),
        pair_threshold=np.append(pairs[1], np.inf),
        keys=tuple(keys),
        leaf=leaf.astype(np.int16 if leaves.size < 2**15 else np.int32),
        leaf_value=t.value[leaves].astype(np.float64),
        start=np.arange(t.roots.size, dtype=np.intp),
    )


@dataclass(frozen=True)
class Trees:
    """An additive ensemble of binary decision trees, every node of every tree in flat
    arrays. An inner node ``i`` sends ``x`` to ``left[i]`` when ``x[feature[i]] <=
    threshold[i]``, else to ``right[i]``; a leaf points at itself on both sides (with an
    infinite threshold), so walking ``depth`` steps from the roots lands every tree on its
    leaf whatever its own depth. The raw score is ``baseline`` plus the sum of the leaves'
    ``value`` (log-odds)."""

    feature: IDX
    threshold: F64
    left: IDX
    right: IDX
    value: F64
    roots: IDX
    baseline: float
    depth: int

    def raw(self, x: F64) -> float:
        """The log-odds of one feature vector (the walk of ``walk_levels``: 4 small numpy
        calls a level, whatever the number of trees)."""
        levels = self.levels
        right = np.less_equal(x.take(levels.pair_feature), levels.pair_threshold)
        np.logical_not(right, out=right)  # (not ``>``: a NaN goes right, as in ``raw_many``)
        pos = levels.start
        for key in levels.keys:
            pos = pos + pos + right.take(key.take(pos))
        return self.baseline + float(levels.leaf_value.take(levels.leaf.take(pos)).sum())

    @functools.cached_property
    def levels(self) -> Levels:
        """The trees laid out level by level as complete binary trees (built on first use)."""
        return walk_levels(self)

    def raw_many(self, x: F64) -> F64:
        """The log-odds of each row of ``x`` (rows: texts)."""
        node = np.broadcast_to(self.roots, (x.shape[0], self.roots.size)).copy()
        rows = np.arange(x.shape[0])[:, None]
        for _ in range(self.depth):
            go = x[rows, self.feature[node]] <= self.threshold[node]
            node = np.where(go, self.left[node], self.right[node])
        out: F64 = self.baseline + self.value[node].sum(axis=1)
        return out


@dataclass(frozen=True)
class DetectorModel:
    version: str
    chars: CharModel
    words: WordModel
    weights: CharWeights
    corrupted: Trees
    repetition: Trees
    monotone: tuple[str, ...]  # features P(corrupted) never decreases in
    threshold: float
    threshold_rules: float  # when the hand-written rules fired
    threshold_strong: float  # when they fired strongly (text.STRONG)

    def p_corrupted(self, x: F64) -> float:
        return _sigmoid(self.corrupted.raw(x))

    def p_repetition(self, x: F64) -> float:
        """P(loop rather than salad), for a text called corrupted."""
        return _sigmoid(self.repetition.raw(x))


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def _trees(z: dict[str, npt.NDArray[np.generic]], name: str) -> Trees:
    return Trees(
        feature=z[f"{name}_feature"].astype(np.intp),
        threshold=z[f"{name}_threshold"].astype(np.float64),
        left=z[f"{name}_left"].astype(np.intp),
        right=z[f"{name}_right"].astype(np.intp),
        value=z[f"{name}_value"].astype(np.float64),
        roots=z[f"{name}_roots"].astype(np.intp),
        baseline=float(z[f"{name}_baseline"]),
        depth=int(z[f"{name}_depth"]),
    )


def read(path: Path) -> DetectorModel:
    rebuild = "rebuild it with python -m tools.detector.train"
    try:
        with np.load(path, allow_pickle=False) as f:
            z = {k: f[k] for k in f.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the detector model {path} ({exc}); {rebuild}") from None
    if "format" not in z or int(z["format"]) != FORMAT:
        raise ConfigError(f"the detector model {path} is of another format; {rebuild}")
    names = tuple(str(n) for n in z["names"])
    if names != features.NAMES:
        raise ConfigError(f"the detector model {path} was fit on other features; {rebuild}")
    return DetectorModel(
        version=str(z["version"]),
        chars=CharModel(z["t2"], z["t3"], z["t4"], np.unpackbits(z["t6"])),
        words=WordModel(np.unpackbits(z["w1"]), np.unpackbits(z["w2"])),
        weights=CharWeights(z["cw"].astype(np.float32), float(z["cw_bias"])),
        corrupted=_trees(z, "corrupted"),
        repetition=_trees(z, "repetition"),
        monotone=tuple(str(n) for n in z["monotone"]),
        threshold=float(z["threshold"]),
        threshold_rules=float(z["threshold_rules"]),
        threshold_strong=float(z["threshold_strong"]),
    )


@functools.cache
def load() -> DetectorModel:
    """The shipped model, read on first use."""
    return read(MODEL_FILE)


__all__ = [
    "FORMAT",
    "MODEL_FILE",
    "DetectorModel",
    "Levels",
    "Trees",
    "load",
    "read",
    "walk_levels",
]
