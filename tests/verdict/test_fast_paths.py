"""The fitted detector's fast paths against the straightforward computations they replace,
on the texts of the corpus sample (and slices of them: short, long, cut anywhere)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from harness.verdict.detector import masking, text
from harness.verdict.detector.fitted import charmodel, features, model, wordmodel

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "corpus_sample.jsonl"


def _texts() -> list[str]:
    rows = [json.loads(x) for x in SAMPLE.read_text(encoding="utf-8").split("\n") if x.strip()]
    out = [r["text"] for r in rows]
    rng = random.Random(0)
    for _ in range(150):
        t = rng.choice(out)
        n = min(len(t), rng.randint(1, 400))
        s = rng.randint(0, len(t) - n)
        out.append(t[s : s + n])
    return out + ["abcde", "abcdefg", "abcdefgh", "Été 7 東京", "x" * 300]


TEXTS = _texts()


def _walk(t: model.Trees, x: npt.NDArray[np.float64]) -> float:
    """The plain walk: every tree at once, node by node, ``depth`` steps."""
    node = t.roots
    for _ in range(t.depth):
        node = np.where(x[t.feature[node]] <= t.threshold[node], t.left[node], t.right[node])
    return t.baseline + float(t.value[node].sum())


def test_the_level_walk_lands_on_the_same_leaves_as_the_plain_walk() -> None:
    m = model.load()
    xs = []
    for s in TEXTS[:120]:
        found = text.rules(s)
        xs.append(features.vector(s, found.score, found.signals, m.chars, m.words, m.weights)[0])
    rng = np.random.default_rng(0)
    for trees in (m.corrupted, m.repetition):
        # vectors exactly on the thresholds too (``<=`` must go left), and a NaN (right)
        inner = trees.left != np.arange(trees.left.size)
        on = np.zeros(len(features.NAMES))
        picks = rng.choice(inner.nonzero()[0], size=len(on))
        on[trees.feature[picks]] = trees.threshold[picks]
        nan = xs[0].copy()
        nan[features.NAMES.index("s4_w32")] = np.nan
        for x in [*xs, on, nan]:
            assert trees.raw(x) == _walk(trees, x)  # exactly: same leaves, same sum order
        assert np.array_equal(trees.raw_many(np.stack(xs)), [_walk(trees, x) for x in xs])


@pytest.mark.parametrize("lo", [0, 40, 80])
def test_one_pass_of_the_character_model_equals_its_three_reads(lo: int) -> None:
    cm = model.load().chars
    for s in TEXTS[lo : lo + 80]:
        cp = charmodel.codes(s)
        if cp.size < 5:
            continue
        r = cm.read(cp)
        s4, s3, unseen = cm.surprisal(cp)
        assert r.s4.tolist() == s4.tolist()
        assert r.s3_sum == int(s3.sum())
        assert r.unseen4.tolist() == unseen.astype(bool).tolist()
        if cp.size < 8:
            assert r.sixes is None
            assert r.unseen6 is None
        else:
            assert r.sixes is not None
            assert r.unseen6 is not None
            assert r.sixes.tolist() == cm.sixes(cp).tolist()
            assert r.unseen6.tolist() == cm.unseen6(cm.sixes(cp)).tolist()


def _word_hashes(cp: npt.NDArray[np.uint32]) -> tuple[list[int], list[int]]:
    """The polynomial hash of every word, one character at a time in Python."""
    wc = wordmodel.word_chars(cp).tolist()
    hashes, lengths, h, n = [], [], 0, 0
    for c, is_word in zip([*cp.tolist(), 0], [*wc, False], strict=True):
        if is_word:
            h, n = (h * 0x01000193 + c) % (1 << 32), n + 1
        elif n:
            hashes.append(h * 0x9E3779B1 % (1 << 32))
            lengths.append(n)
            h = n = 0
    return hashes, lengths


def test_words_are_hashed_as_one_character_at_a_time() -> None:
    for s in [*TEXTS, "", " ,; ", "a", "東京は", "read_config 42 München"]:
        cp = charmodel.codes(s)
        want = _word_hashes(cp)
        for wide in (None, bool(cp.size) and bool(cp.max() >= 128)):
            h, n = wordmodel.words(cp, wide)
            assert (h.tolist(), n.tolist()) == want
            assert h.dtype == np.uint32


def test_the_rules_and_the_features_find_a_texts_markup_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    call = (
        "I will look it up.\n<tool_call>\n"
        '{"name": "search", "arguments": {"q": "`x` [1]"}}\n</tool_call>\n'
        '<|im_start|>assistant\n[TOOL_CALLS]search[ARGS]{"q": 1}'
    )
    want_mask, want_plain = masking.mask(call), masking.without_markup(call)
    want = text.score_fitted(call)
    calls: list[str] = []
    real = masking.markup_spans

    def counted(s: str) -> list[tuple[int, int]]:
        calls.append(s)
        return real(s)

    monkeypatch.setattr(masking, "markup_spans", counted)
    assert text.score_fitted(call) == want
    assert calls.count(call) == 1  # the rules' mask, then the features: one parse
    with masking.shared_markup():
        assert masking.mask(call) == want_mask
        assert masking.without_markup(call) == want_plain
        assert masking.mask(call) == want_mask  # (a list of its own each time)
    assert calls.count(call) == 2
    masking.without_markup(call)  # outside: nothing kept
    assert calls.count(call) == 3
