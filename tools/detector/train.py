"""Fit the text detector and write its model file
(``harness/verdict/detector/fitted/detector_model.npz``).

    python -m tools.detector.train corpus/corpus.jsonl [--out PATH] [--fpr 0.0025]

Needs the ``[train]`` extra (scikit-learn) and a corpus from ``corpus.py``. The modules
named below are those of ``harness.verdict.detector.fitted``. Steps:

1. count the character model (``charmodel``) and the word model (``wordmodel``) on the clean
   texts of the ``ngram`` split only (its chunks and its whole files, ``ngram_full.jsonl``),
   so that the classifier learns what surprisal looks like on text the model has not seen,
   which is what it meets at run time; fit the n-gram weights (``charweights``) on the
   ``ngram`` split's clean chunks and the corruption ``augment.jsonl`` made of them (written
   by ``corpus.py``);
2. compute every feature (``features``) of the ``train`` rows (with the ``train``
   corruption of ``augment.jsonl``) and the ``val`` rows;
3. fit two ensembles of gradient-boosted trees (scikit-learn's
   HistGradientBoostingClassifier) on ``train``, each source and class weighted alike: corrupted
   against clean, monotone non-decreasing in the rules' windowed score (more evidence of the
   rules never lowers P), and repetition against salad on the corrupted rows;
4. choose two thresholds on P(corrupted) on ``val``: one for every text, a lower one for the
   texts where the hand-written rules fired (``text.rules`` reached ``THRESHOLD``), the pair
   with the best recall whose false-positive rate on clean texts is at most ``--fpr``
   overall and at most ``2 * --fpr`` on every source of ``1 / --fpr`` clean texts or more;
   then a third, the lowest that keeps that goal, for the texts where the rules fired
   strongly (``text.STRONG``, the cap of the rules' score as a feature: past it the trees
   see no more evidence, and a loop of 30 copies looks to them like one of 8);
5. write the tables, the trees (as flat arrays, ``model.Trees``) and the thresholds
   to one ``.npz``.

The ``test`` split and the operating system's documentation (``osdoc``) are never read here.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from harness.verdict.detector import masking
from harness.verdict.detector import text as text_mod
from harness.verdict.detector.fitted import charmodel, charweights, features, wordmodel
from harness.verdict.detector.fitted.model import FORMAT, MODEL_FILE, read
from tools.detector.decision import as_trees, export, pick_strong, pick_thresholds

ROOT = Path(__file__).resolve().parents[2]
BITS = (16, 20, 21)
BITS6 = 23
MIN6 = 2  # a 6-gram seen once is as likely a typo as usage
WORD_BITS = (22, 23)  # the word and word-pair bit tables
CW_BITS = 20  # the n-gram weights (charweights)
CW_EPOCHS = 3
#: Features P(corrupted) is monotone non-decreasing in.
MONOTONE = ("rule_score",)
TREES = {"max_iter": 600, "max_leaf_nodes": 63, "max_depth": 8, "min_samples_leaf": 40}


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


def featurize(
    rows: list[dict[str, Any]],
    chars: charmodel.CharModel,
    words: wordmodel.WordModel,
    weights: charweights.CharWeights,
) -> np.ndarray:
    out = np.zeros((len(rows), len(features.NAMES)))
    for i, r in enumerate(rows):
        work = text_mod._unescape(r["text"])
        f = text_mod.rules(work, r.get("context"), unescaped=True)
        out[i], _ = features.vector(
            work, f.score, f.signals, chars, words, weights, r.get("context")
        )
    return out


def weight_ids(text: str, bits: int, cap: int = 2048) -> np.ndarray:
    """The n-gram buckets of ``charweights`` of a text's last ``cap`` characters, read as
    ``features.vector`` reads them (unescaped, without tool-call markup)."""
    t, _ = masking.without_markup(text_mod._unescape(text))
    raw = np.frombuffer(t.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)[-cap:]
    return charweights.ids(raw, charmodel.codes(raw), bits)


def fit_charweights(
    rows: list[dict[str, Any]], bits: int, epochs: int, seed: int, lr: float = 0.02
) -> charweights.CharWeights:
    """Fit the n-gram weights of ``charweights`` on labelled ``rows``: the logistic loss of
    the worst window's mean weight (plus a bias), corrupted texts weighted to weigh as much
    as the clean ones in all, by Adam on the subgradient (only the worst window of a text
    moves), in batches of texts of similar length, ``epochs`` passes."""
    data = [weight_ids(r["text"], bits) for r in rows]
    y = np.array([r["label"] != "clean" for r in rows], dtype=np.float64)
    cls_w = np.where(y > 0, (y == 0).sum() / max(y.sum(), 1), 1.0)
    size = 1 << bits
    w = np.zeros(size)
    bias = -2.0
    m, v = np.zeros(size), np.zeros(size)
    mb = vb = 0.0
    b1, b2, eps = 0.9, 0.999, 1e-8
    rng = np.random.default_rng(seed)
    by_len = sorted(range(len(data)), key=lambda i: data[i].shape[0])
    batches = [by_len[k : k + 64] for k in range(0, len(by_len), 64)]
    win = charweights.WINDOW
    t = 0
    for _ in range(epochs):
        for bi in rng.permutation(len(batches)):
            idx, val = [], []
            gb = 0.0
            batch = batches[bi]
            for i in batch:
                b = data[i]
                if not b.shape[0]:
                    continue
                s = w[b].sum(axis=1)
                if s.size > win:
                    c = np.concatenate(([0.0], s.cumsum()))
                    j = int((c[win:] - c[:-win]).argmax())
                    b = b[j : j + win]
                    pooled = float(c[j + win] - c[j]) / win
                else:
                    pooled = float(s.mean())
                p = 1.0 / (1.0 + np.exp(-(pooled + bias)))
                g = (p - y[i]) * cls_w[i] / len(batch)
                idx.append(b.ravel())
                val.append(np.full(b.size, g / b.shape[0]))
                gb += g
            if not idx:
                continue
            grad = np.bincount(np.concatenate(idx), np.concatenate(val), minlength=size)
            t += 1
            m = b1 * m + (1 - b1) * grad
            v = b2 * v + (1 - b2) * grad * grad
            step = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
            w -= step * m / (np.sqrt(v) + eps)
            mb = b1 * mb + (1 - b1) * gb
            vb = b2 * vb + (1 - b2) * gb * gb
            bias -= step * mb / (np.sqrt(vb) + eps)
    return charweights.CharWeights(w.astype(np.float32), float(bias))


def balanced(rows: list[dict[str, Any]], floor: int = 200) -> np.ndarray:
    """Sample weights under which every (source, label) cell weighs alike (a cell of fewer
    than ``floor`` rows weighs less: a few rows must not dominate), mean 1."""
    cells = Counter((r["source"], r["label"]) for r in rows)
    w = np.array([1.0 / max(cells[(r["source"], r["label"])], floor) for r in rows])
    out: np.ndarray = w * len(w) / w.sum()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--out", type=Path, default=MODEL_FILE)
    ap.add_argument("--fpr", type=float, default=0.0025, help="false-positive goal on val")
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
    ap.add_argument(
        "--chars-from",
        type=Path,
        default=None,
        help="take the character model's tables from this model file instead of counting "
        "them again (they depend on the corpus's ngram split only)",
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    project = [
        ROOT / "tests" / "data" / "eval" / n for n in ("handwritten.jsonl", "generated.jsonl")
    ]
    if a.extra_train is None:
        a.extra_train = project + sorted(a.corpus.parent.glob("gen*.jsonl"))
    if a.keep is None:
        a.keep = project
    from sklearn.ensemble import HistGradientBoostingClassifier

    t0 = time.process_time()
    ngram = [r["text"] for r in load(a.corpus, {"ngram"}) if r["label"] == "clean"]
    full = a.corpus.with_name("ngram_full.jsonl")
    if full.exists():
        with full.open(encoding="utf-8") as f:
            ngram += [json.loads(line)["text"] for line in f]
    if a.chars_from is not None:
        with np.load(a.chars_from) as z:
            chars = charmodel.CharModel(z["t2"], z["t3"], z["t4"], np.unpackbits(z["t6"]))
        print(f"character model: the tables of {a.chars_from}")
    else:
        chars = charmodel.count(ngram, BITS, BITS6, MIN6)
    words = wordmodel.count(ngram, *WORD_BITS)
    print(
        f"character and word models: {len(ngram)} texts, {sum(map(len, ngram)) / 1e6:.1f} M "
        f"chars, {time.process_time() - t0:.0f} s; words used {words.w1.mean():.3f}, "
        f"pairs used {words.w2.mean():.3f} of the buckets"
    )
    augmented = a.corpus.with_name("augment.jsonl")
    if not augmented.exists():
        raise SystemExit(
            f"{augmented} is missing: write it with python -m tools.detector.corpus "
            f"{a.corpus.parent} --augment-only"
        )
    with augmented.open(encoding="utf-8") as f:
        extra = [json.loads(line) for line in f]
    taught = [r for r in load(a.corpus, {"ngram"}) if r["label"] == "clean"]
    taught += [r for r in extra if r["split"] == "ngram"]
    cw = fit_charweights(taught, CW_BITS, CW_EPOCHS, a.seed)
    # as shipped (float16), so that the trees learn the values the package computes
    weights = charweights.CharWeights(cw.weights.astype(np.float16).astype(np.float32), cw.bias)
    print(
        f"n-gram weights: {len(taught)} texts of the ngram split "
        f"({sum(r['label'] != 'clean' for r in taught)} corrupted), "
        f"{time.process_time() - t0:.0f} s"
    )
    train = load(a.corpus, {"train"}) + [r for r in extra if r["split"] == "train"]
    val = load(a.corpus, {"val"})
    for more, rows in ((a.extra_train, train), (a.extra_val, val)):
        for p in more:
            rows.extend(load_jsonl(p))
    xt = featurize(train, chars, words, weights)
    xv = featurize(val, chars, words, weights)
    print(f"features: {len(train)} train, {len(val)} val, {time.process_time() - t0:.0f} s")
    y = np.array([r["label"] != "clean" for r in train])
    monotone = [1 if n in MONOTONE else 0 for n in features.NAMES]
    clf = HistGradientBoostingClassifier(
        monotonic_cst=monotone,
        l2_regularization=1.0,
        early_stopping=False,
        random_state=a.seed,
        **TREES,
    )
    clf.fit(xt, y, sample_weight=balanced(train))
    bad_rows = np.flatnonzero(y)
    rep = HistGradientBoostingClassifier(
        max_iter=200, max_leaf_nodes=31, max_depth=6, random_state=a.seed, early_stopping=False
    )
    yr = np.array([train[i]["label"] == "repetition" for i in bad_rows])
    rep.fit(xt[bad_rows], yr, sample_weight=balanced([train[i] for i in bad_rows]))
    arrays: dict[str, Any] = {**export(clf, "corrupted"), **export(rep, "repetition")}
    trees = as_trees(arrays, "corrupted")
    if not np.allclose(trees.raw_many(xv), clf.decision_function(xv), atol=1e-6):
        raise SystemExit("the exported trees do not reproduce scikit-learn's decision")
    pv = 1 / (1 + np.exp(-trees.raw_many(xv)))
    fired = xv[:, 0] >= text_mod.THRESHOLD
    keep = None
    if a.keep:
        kept = [r for p in a.keep for r in load_jsonl(p)]
        xk = featurize(kept, chars, words, weights)
        pk = 1 / (1 + np.exp(-trees.raw_many(xk)))
        yk = np.array([r["label"] != "clean" for r in kept])
        keep = (pk, xk[:, 0] >= text_mod.THRESHOLD, yk, a.keep_recall)
    thr, thr_rules = pick_thresholds(pv, fired, val, a.fpr, keep)
    bad = (pv >= thr) | (fired & (pv >= thr_rules))
    strong = xv[:, 0] >= text_mod.STRONG
    thr_strong = pick_strong(pv, strong, bad, val, a.fpr, thr_rules)
    bad |= strong & (pv >= thr_strong)
    yv = np.array([r["label"] != "clean" for r in val])
    print(
        f"thresholds {thr:.4f} / {thr_rules:.4f} (rules fired) / {thr_strong:.4f} (fired "
        f"strongly): val recall "
        f"{bad[yv].mean():.4f}, FPR {bad[~yv].mean():.4f} ({(~yv).sum()} clean)"
    )
    for s, n in sorted(Counter(r["source"] for r in val).items()):
        sel = np.array([r["source"] == s for r in val])
        rec = bad[sel & yv].mean() if (sel & yv).any() else float("nan")
        fp = bad[sel & ~yv].mean() if (sel & ~yv).any() else float("nan")
        print(f"  {s:12s} n={n:5d} recall {rec:.3f} FPR {fp:.4f}")
    digest = hashlib.sha1(a.corpus.read_bytes()[: 1 << 24]).hexdigest()[:10]
    arrays.update(
        {
            "format": np.array(FORMAT),
            "version": np.array(f"{FORMAT}:{digest}:{time.strftime('%Y-%m-%d')}"),
            "names": np.array(features.NAMES),
            "monotone": np.array(MONOTONE),
            "t2": chars.t2,
            "t3": chars.t3,
            "t4": chars.t4,
            "t6": np.packbits(chars.t6),
            "w1": np.packbits(words.w1),
            "w2": np.packbits(words.w2),
            "cw": weights.weights.astype(np.float16),
            "cw_bias": np.array(weights.bias),
            "threshold": np.array(thr),
            "threshold_rules": np.array(thr_rules),
            "threshold_strong": np.array(thr_strong),
        }
    )
    np.savez_compressed(a.out, **arrays)
    read(a.out)  # the file loads as the package will load it
    print(
        f"wrote {a.out} ({a.out.stat().st_size / 1e6:.2f} MB) in "
        f"{time.process_time() - t0:.0f} s of CPU"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
