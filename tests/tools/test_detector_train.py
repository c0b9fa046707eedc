"""The training command's own fits (tools.detector.train, .decision), on data made here."""

from __future__ import annotations

import random

import numpy as np

from harness.verdict.detector.fitted import charmodel
from tools.detector import decision
from tools.detector import train as td

NOUNS = "river garden letter window market teacher engine harbour meadow lantern".split()  # noqa: SIM905
VERBS = "opened closed painted carried followed watched cleaned measured".split()  # noqa: SIM905


def _sentence(rng: random.Random) -> str:
    a, b = rng.sample(NOUNS, 2)
    return f"The {a} {rng.choice(VERBS)} the old {b} before the evening came."


def _junk(rng: random.Random) -> str:
    return "".join(rng.choice("qxzjkvw0123456789") for _ in range(rng.randint(20, 40)))


def _rows(rng: random.Random, n: int) -> list[dict[str, str]]:
    rows = []
    for _ in range(n):
        clean = " ".join(_sentence(rng) for _ in range(4))
        rows.append({"label": "clean", "text": clean})
        cut = rng.randrange(20, len(clean))
        rows.append({"label": "salad", "text": clean[:cut] + _junk(rng) + clean[cut:]})
    return rows


def test_fitted_weights_score_the_corrupted_window() -> None:
    rng = random.Random(3)
    w = td.fit_charweights(_rows(rng, 60), bits=16, epochs=30, seed=0)
    assert w.weights.dtype == np.float32
    assert w.weights.size == 1 << 16
    held = _rows(random.Random(99), 20)

    def score(text: str) -> float:
        raw = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return w.scores(raw, charmodel.codes(raw))[0]

    clean = [score(r["text"]) for r in held if r["label"] == "clean"]
    bad = [score(r["text"]) for r in held if r["label"] != "clean"]
    assert max(clean) < min(bad)  # every held-out corrupted text above every clean one
    again = td.fit_charweights(_rows(random.Random(3), 60), bits=16, epochs=30, seed=0)
    assert np.array_equal(again.weights, w.weights)  # reproducible


def test_thresholds_keep_the_false_positive_goal_per_source() -> None:
    """The pair of thresholds with the best recall within the goal (overall and per source),
    and the strong threshold no higher than the one when the rules fired."""
    rng = np.random.default_rng(1)
    n = 300
    y = rng.random(n) < 0.4
    p = np.where(y, rng.beta(6, 2, n), rng.beta(2, 6, n))
    fired = np.where(y, rng.random(n) < 0.7, rng.random(n) < 0.1)
    rows = [
        {"label": "salad" if bad else "clean", "source": "ab"[i % 2]} for i, bad in enumerate(y)
    ]
    fpr = 0.02
    hi, lo = decision.pick_thresholds(p, fired, rows, fpr)
    assert lo <= hi
    flagged = (p >= hi) | (fired & (p >= lo))
    assert flagged[~y].mean() <= fpr
    assert flagged[y].mean() > 0.5
    strong = fired & (p > 0.5)
    t = decision.pick_strong(p, strong, flagged, rows, fpr, lo)
    assert t <= lo
    assert (flagged | (strong & (p >= t)))[~y].mean() <= fpr
