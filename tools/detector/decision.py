"""The fitted decision's last steps: scikit-learn's trees as the flat arrays the package
evaluates (``harness.verdict.detector.fitted.model.Trees``), and the thresholds on
P(corrupted) chosen for a false-positive goal."""

from __future__ import annotations

from typing import Any

import numpy as np

from harness.verdict.detector.fitted.model import Trees


def export(clf: Any, name: str) -> dict[str, np.ndarray]:
    """A fitted binary HistGradientBoostingClassifier as the flat arrays of ``Trees``."""
    feat, thr, left, right, value, roots = [], [], [], [], [], []
    depth = 0
    base = 0
    for (pred,) in clf._predictors:
        nodes = pred.nodes
        n = len(nodes)
        idx = np.arange(base, base + n)
        leaf = nodes["is_leaf"].astype(bool)
        feat.append(np.where(leaf, 0, nodes["feature_idx"]))
        thr.append(np.where(leaf, np.inf, nodes["num_threshold"]))
        left.append(np.where(leaf, idx, base + nodes["left"]))
        right.append(np.where(leaf, idx, base + nodes["right"]))
        value.append(np.where(leaf, nodes["value"], 0.0))
        roots.append(base)
        depth = max(depth, int(nodes["depth"].max()))
        base += n
    return {
        f"{name}_feature": np.concatenate(feat).astype(np.int16),
        f"{name}_threshold": np.concatenate(thr).astype(np.float64),
        f"{name}_left": np.concatenate(left).astype(np.int32),
        f"{name}_right": np.concatenate(right).astype(np.int32),
        f"{name}_value": np.concatenate(value).astype(np.float64),
        f"{name}_roots": np.array(roots, dtype=np.int32),
        f"{name}_baseline": np.array(float(np.ravel(clf._baseline_prediction)[0])),
        f"{name}_depth": np.array(depth),
    }


def as_trees(arrays: dict[str, np.ndarray], name: str) -> Trees:
    return Trees(
        feature=arrays[f"{name}_feature"].astype(np.intp),
        threshold=arrays[f"{name}_threshold"],
        left=arrays[f"{name}_left"].astype(np.intp),
        right=arrays[f"{name}_right"].astype(np.intp),
        value=arrays[f"{name}_value"],
        roots=arrays[f"{name}_roots"].astype(np.intp),
        baseline=float(arrays[f"{name}_baseline"]),
        depth=int(arrays[f"{name}_depth"]),
    )


def _fpr_ok(bad: np.ndarray, clean: np.ndarray, src: np.ndarray, fpr: float) -> bool:
    """At most ``fpr`` overall and ``2 * fpr`` on every source of at least ``1 / fpr`` clean
    texts (on fewer, one false positive is already more than twice the goal)."""
    if bad[clean].mean() > fpr:
        return False
    for s in set(src[clean]):
        sel = clean & (src == s)
        if sel.sum() >= 1 / fpr and bad[sel].mean() > 2 * fpr:
            return False
    return True


def pick_thresholds(
    p: np.ndarray,
    fired: np.ndarray,
    rows: list[dict[str, Any]],
    fpr: float,
    keep: tuple[np.ndarray, np.ndarray, np.ndarray, float] | None = None,
) -> tuple[float, float]:
    """(threshold, threshold when the rules fired): a text is corrupted when P >= the first,
    or when the rules fired and P >= the second. The pair with the best recall on ``rows``
    whose false-positive rate is at most ``fpr`` overall and ``2 * fpr`` per source; with
    ``keep`` = (P, fired, corrupted, recall) of another labelled set, only pairs that keep
    that recall on it count, and the one with the fewest false positives on ``rows`` wins
    when none meets ``fpr``."""
    clean = np.array([r["label"] == "clean" for r in rows])
    src = np.array([r["source"] for r in rows])
    qs = np.quantile(p[clean], np.linspace(0.5, 1, 201))
    qb = np.quantile(p[~clean], np.linspace(0, 1, 201)) if (~clean).any() else qs
    grid = np.unique(np.concatenate((qs, qb, np.linspace(0.01, 0.5, 50), [1.0])))
    best = (-1.0, 1.0, 1.0)
    fallback = (2.0, 1.0, 1.0)
    for hi in grid:
        for lo in grid:
            if lo > hi:
                break
            if keep is not None:  # no worse than the rules alone on the kept set
                kp, kf, ky, rec = keep
                kbad = (kp >= hi) | (kf & (kp >= lo))
                if kbad[ky].mean() < min(rec, kf[ky].mean()) or kbad[~ky].sum() > kf[~ky].sum():
                    continue
            bad = (p >= hi) | (fired & (p >= lo))
            if _fpr_ok(bad, clean, src, fpr):
                r = float(bad[~clean].mean())
                if r > best[0]:
                    best = (r, float(hi), float(lo))
            elif bad[clean].mean() < fallback[0]:
                fallback = (float(bad[clean].mean()), float(hi), float(lo))
    if best[0] >= 0:
        return best[1], best[2]
    return fallback[1], fallback[2]


def pick_strong(
    p: np.ndarray,
    strong: np.ndarray,
    bad: np.ndarray,
    rows: list[dict[str, Any]],
    fpr: float,
    ceiling: float,
) -> float:
    """The threshold on P for the texts where the rules fired strongly (their score reached
    ``text.STRONG``): the lowest, at most ``ceiling`` (the threshold when they fired), that
    keeps the false-positive rate of ``bad`` (the decision so far) within ``fpr`` overall and
    ``2 * fpr`` per source, as ``pick_thresholds`` counts it."""
    clean = np.array([r["label"] == "clean" for r in rows])
    src = np.array([r["source"] for r in rows])
    for t in np.unique(np.concatenate(([0.0], p[strong], [ceiling]))):
        if t > ceiling:
            break
        if _fpr_ok(bad | (strong & (p >= t)), clean, src, fpr):
            return float(t)
    return ceiling
