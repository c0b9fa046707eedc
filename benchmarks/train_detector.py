"""Fit the text detector and write its model file (``harness/verdict/detector_model.npz``).

    python benchmarks/train_detector.py corpus/corpus.jsonl [--out PATH] [--fpr 0.005]

Needs the ``[train]`` extra (scikit-learn) and a corpus from ``corpus_build.py``. Steps:

1. count the character model (``harness.verdict.charmodel``) on the clean texts of the
   ``ngram`` split only (its chunks and its whole files, ``ngram_full.jsonl``), so that the
   classifier learns what surprisal looks like on text the model has not seen, which is
   what it meets at run time;
2. compute every feature (``harness.verdict.features``) of the ``train`` and ``val`` rows;
3. fit a small neural network (scikit-learn's MLPClassifier, clean / salad / repetition) on
   ``train``, each source and class weighted alike (by resampling);
4. choose two thresholds on P(corrupted) on ``val``: one for every text, a lower one for the
   texts where the hand-written rules fired (``text.rules`` reached ``THRESHOLD``), the pair
   with the best recall whose false-positive rate on clean texts is at most ``--fpr``
   overall and at most ``2 * --fpr`` on every source;
5. write the tables, the scaler, the weights and the threshold to one ``.npz``.

The ``test`` split and the operating system's documentation (``osdoc``) are never read here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.verdict import charmodel, features  # noqa: E402
from harness.verdict import text as text_mod  # noqa: E402
from harness.verdict.model import CLASSES, CLIP, MODEL_FILE  # noqa: E402

BITS = (16, 20, 21)
BITS6 = 23
MIN6 = 2  # a 6-gram seen once is as likely a typo as usage
HIDDEN = (32, 16)


def load(path: Path, splits: set[str]) -> list[dict[str, Any]]:
    rows = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r["split"] in splits and r["source"] != "osdoc":
                rows.append(r)
    return rows


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    """The clean / salad / repetition rows of a labelled JSONL file (source: its name)."""
    rows = []
    for line in path.read_text(encoding="utf-8").split("\n"):  # (not splitlines: U+2028)
        if line.strip():
            r = json.loads(line)
            if r["label"] in ("clean", "salad", "repetition"):
                rows.append({**r, "source": path.stem})
    return rows


def featurize(rows: list[dict[str, Any]], chars: charmodel.CharModel) -> np.ndarray:
    out = np.zeros((len(rows), len(features.NAMES)))
    for i, r in enumerate(rows):
        work = text_mod._unescape(r["text"])
        f = text_mod.rules(work, r.get("context"), unescaped=True)
        out[i], _ = features.vector(work, f.score, f.signals, chars, r.get("context"))
    return out


def balanced(rows: list[dict[str, Any]], rng: np.random.Generator, per: int) -> np.ndarray:
    """Indices resampled so that every (source, label) cell weighs alike: ``per`` draws from
    each (a cell of fewer than ``per // 4`` rows gets fewer: a few rows must not dominate)."""
    cells: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        cells.setdefault((r["source"], r["label"]), []).append(i)
    idx = []
    for ids in cells.values():
        n = min(per, max(len(ids), per // 4))
        idx.extend(rng.choice(ids, size=n, replace=len(ids) < n).tolist())
    return np.array(idx)


def _fpr_ok(bad: np.ndarray, clean: np.ndarray, src: np.ndarray, fpr: float) -> bool:
    if bad[clean].mean() > fpr:
        return False
    return all(bad[clean & (src == s)].mean() <= 2 * fpr for s in set(src[clean]))


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
    grid = np.unique(np.concatenate((qs, np.linspace(0.01, 0.5, 50), [1.0])))
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--out", type=Path, default=MODEL_FILE)
    ap.add_argument("--fpr", type=float, default=0.005, help="false-positive goal on val")
    ap.add_argument(
        "--extra-val",
        type=Path,
        nargs="*",
        default=[],
        help="labelled JSONL files added to the validation split (source: file)",
    )
    ap.add_argument(
        "--extra-train",
        type=Path,
        nargs="*",
        default=None,
        help="labelled JSONL files added to the training split (source: file; default: the "
        "project's hand-written and generated sets and the gen*.jsonl beside the corpus)",
    )
    ap.add_argument(
        "--keep",
        type=Path,
        nargs="*",
        default=None,
        help="labelled JSONL files on which the thresholds must do no worse than the rules "
        "(default: the project's hand-written and generated sets)",
    )
    ap.add_argument(
        "--keep-recall",
        type=float,
        default=1.0,
        help="recall to keep on --keep (at most the rules' own there)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=("mlp", "logistic"), default="mlp")
    ap.add_argument("--alpha", type=float, default=1e-3, help="the network's L2 penalty")
    a = ap.parse_args(argv)
    project = [
        ROOT / "tests" / "data" / "eval" / n for n in ("handwritten.jsonl", "generated.jsonl")
    ]
    if a.extra_train is None:
        a.extra_train = project + sorted(a.corpus.parent.glob("gen*.jsonl"))
    if a.keep is None:
        a.keep = project
    from sklearn.linear_model import LogisticRegression
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    t0 = time.process_time()
    ngram = [r["text"] for r in load(a.corpus, {"ngram"}) if r["label"] == "clean"]
    full = a.corpus.with_name("ngram_full.jsonl")
    if full.exists():
        with full.open(encoding="utf-8") as f:
            ngram += [json.loads(line)["text"] for line in f]
    chars = charmodel.count(ngram, BITS, BITS6, MIN6)
    print(
        f"character model: {len(ngram)} texts, {sum(map(len, ngram)) / 1e6:.1f} M chars, "
        f"{time.process_time() - t0:.0f} s"
    )
    train = load(a.corpus, {"train"})
    val = load(a.corpus, {"val"})
    for extra, rows in ((a.extra_train, train), (a.extra_val, val)):
        for p in extra:
            rows.extend(load_jsonl(p))
    xt = featurize(train, chars)
    xv = featurize(val, chars)
    print(f"features: {len(train)} train, {len(val)} val, {time.process_time() - t0:.0f} s")
    rng = np.random.default_rng(a.seed)
    idx = balanced(train, rng, per=8000)
    y = np.array([CLASSES.index(r["label"]) for r in train])
    scaler = StandardScaler().fit(xt)
    scale = np.where(scaler.scale_ > 1e-9, scaler.scale_, 1.0)
    clf: Any
    if a.model == "mlp":
        clf = MLPClassifier(
            HIDDEN, alpha=a.alpha, max_iter=400, early_stopping=True, random_state=a.seed
        )
    else:
        clf = LogisticRegression(C=1.0, max_iter=2000)

    def z(x: np.ndarray) -> np.ndarray:
        return np.clip((x - scaler.mean_) / scale, -CLIP, CLIP)

    clf.fit(z(xt[idx]), y[idx])
    pv = 1 - clf.predict_proba(z(xv))[:, 0]
    fired = xv[:, 0] >= text_mod.THRESHOLD
    keep = None
    if a.keep:
        kept = [r for p in a.keep for r in load_jsonl(p)]
        xk = featurize(kept, chars)
        pk = 1 - clf.predict_proba(z(xk))[:, 0]
        yk = np.array([r["label"] != "clean" for r in kept])
        keep = (pk, xk[:, 0] >= text_mod.THRESHOLD, yk, a.keep_recall)
    thr, thr_rules = pick_thresholds(pv, fired, val, a.fpr, keep)
    bad = (pv >= thr) | (fired & (pv >= thr_rules))
    yv = np.array([r["label"] != "clean" for r in val])
    print(
        f"thresholds {thr:.4f} / {thr_rules:.4f} (rules fired): val recall "
        f"{bad[yv].mean():.4f}, FPR {bad[~yv].mean():.4f} ({(~yv).sum()} clean)"
    )
    for s, n in sorted(Counter(r["source"] for r in val).items()):
        sel = np.array([r["source"] == s for r in val])
        rec = bad[sel & yv].mean() if (sel & yv).any() else float("nan")
        fp = bad[sel & ~yv].mean() if (sel & ~yv).any() else float("nan")
        print(f"  {s:12s} n={n:5d} recall {rec:.3f} FPR {fp:.4f}")
    digest = hashlib.sha1(a.corpus.read_bytes()[: 1 << 24]).hexdigest()[:10]
    arrays: dict[str, Any] = {
        "version": np.array(f"1:{digest}:{time.strftime('%Y-%m-%d')}"),
        "names": np.array(features.NAMES),
        "t2": chars.t2,
        "t3": chars.t3,
        "t4": chars.t4,
        "t6": np.packbits(chars.t6),
        "mean": scaler.mean_.astype(np.float32),
        "scale": scale.astype(np.float32),
        "threshold": np.array(thr),
        "threshold_rules": np.array(thr_rules),
    }
    coefs = clf.coefs_ if a.model == "mlp" else [clf.coef_.T]
    intercepts = clf.intercepts_ if a.model == "mlp" else [clf.intercept_]
    arrays["layers"] = np.array(len(coefs))
    for i, (w, b) in enumerate(zip(coefs, intercepts, strict=True)):
        arrays[f"w{i}"] = w.astype(np.float32)
        arrays[f"b{i}"] = b.astype(np.float32)
    np.savez_compressed(a.out, **arrays)
    print(
        f"wrote {a.out} ({a.out.stat().st_size / 1e6:.2f} MB) in "
        f"{time.process_time() - t0:.0f} s of CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
