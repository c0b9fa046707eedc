"""The fitted detector's parts: character model, features, model file, and its decisions on
the failure categories the hand-tuned detector had (written here, not copied from any set)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from harness.errors import ConfigError
from harness.verdict.detector.fitted import charmodel, charweights, features, model, wordmodel
from harness.verdict.detector.text import THRESHOLD, rules, score_fitted, score_text

PROSE = (
    "The committee met on Tuesday to review the budget for the coming year. After a long "
    "discussion, the members agreed to postpone the decision until the next meeting, when "
    "the final figures from the finance office would be available."
)


def test_codes_fold_case_and_digits() -> None:
    assert charmodel.codes("Ab9\tZ").tolist() == [ord(c) for c in "ab0 z"]
    assert charmodel.codes("Été 7").tolist() == [ord(c) for c in "Été 0"]


def test_counted_text_is_less_surprising_than_unseen_text() -> None:
    cm = charmodel.count([PROSE * 3], (12, 14, 16), bits6=16, min6=2)
    seen, _, unseen = cm.surprisal(charmodel.codes(PROSE))
    other, _, unseen_other = cm.surprisal(charmodel.codes("xqzv wkpj qqhx vvzk jxqw"))
    assert float(seen.mean()) / 8 < 2.0 < float(other.mean()) / 8  # eighths of a bit
    assert float(other.mean()) / 8 >= charmodel.UNSEEN_BITS
    assert unseen.sum() == 0
    assert unseen_other.all()
    assert cm.unseen6(cm.sixes(charmodel.codes(PROSE))).sum() == 0
    assert cm.unseen6(cm.sixes(charmodel.codes("xqzv wkpj qqhx"))).all()


def test_feature_vector_shape_and_tail_period() -> None:
    cm, wm, cw = model.load().chars, model.load().words, model.load().weights
    x, _ = features.vector(PROSE, 0.0, {}, cm, wm, cw)
    assert x.shape == (len(features.NAMES),)
    loop = "Spices:\n" + "\n".join(f"{k}. Anise" for k in range(4, 40))
    y, _ = features.vector(loop, 0.0, {}, cm, wm, cw)
    i = features.NAMES.index("tail_period_match")
    assert y[i] >= 0.95  # rising list numbers do not hide the period
    assert x[i] == 0.0


def test_mojibake_and_doubled_word_features() -> None:
    cm, wm, cw = model.load().chars, model.load().words, model.load().weights
    text = "Köln und München sind schön."
    broken = text.encode("utf-8").decode("cp1252")
    i = features.NAMES.index("mojibake")
    assert features.vector(text, 0.0, {}, cm, wm, cw)[0][i] == 0
    assert features.vector(broken, 0.0, {}, cm, wm, cw)[0][i] >= 2
    j = features.NAMES.index("doubled_word")
    assert features.vector("call read_configread_config now", 0.0, {}, cm, wm, cw)[0][j] == 1


def test_model_file_is_checked(tmp_path: Path) -> None:
    bad = tmp_path / "m.npz"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="tools.detector.train"):
        model.read(bad)
    z = dict(np.load(model.MODEL_FILE))
    z["format"] = np.array(1)
    old = tmp_path / "old.npz"
    np.savez(old, **z)
    with pytest.raises(ConfigError, match="another format"):
        model.read(old)
    z["format"] = np.array(model.FORMAT)
    z["names"] = np.array(features.NAMES[:-1])
    other = tmp_path / "other.npz"
    np.savez(other, **z)
    with pytest.raises(ConfigError, match="other features"):
        model.read(other)


def test_shipped_model_is_small_and_its_trees_are_sound() -> None:
    assert model.MODEL_FILE.stat().st_size < 6_000_000
    m = model.load()
    assert 0.0 <= m.threshold_strong <= m.threshold_rules <= m.threshold < 1.0
    x, _ = features.vector(PROSE, 0.0, {}, m.chars, m.words, m.weights)
    assert 0.0 <= m.p_corrupted(x) < m.threshold
    # one walk per vector and the batched walk agree, and every walk ends on a leaf
    t = m.corrupted
    rows = np.stack([x, features.vector(GLUED_PIECES, 0.0, {}, m.chars, m.words, m.weights)[0]])
    assert np.allclose(t.raw_many(rows), [t.raw(rows[0]), t.raw(rows[1])])
    leaves = t.left == np.arange(t.left.size)
    assert (leaves == (t.right == np.arange(t.right.size))).all()
    assert np.isinf(t.threshold[leaves]).all()
    assert (t.value[~leaves] == 0).all()


def test_trees_walk_to_the_leaf_each_vector_belongs_to() -> None:
    # two stumps written by hand: x0 <= 1 -> -1 else +2; x1 <= 0.5 -> 0.5 else -0.5
    inf = np.inf
    trees = model.Trees(
        feature=np.array([0, 0, 0, 1, 0, 0]),
        threshold=np.array([1.0, inf, inf, 0.5, inf, inf]),
        left=np.array([1, 1, 2, 4, 4, 5]),
        right=np.array([2, 1, 2, 5, 4, 5]),
        value=np.array([0.0, -1.0, 2.0, 0.0, 0.5, -0.5]),
        roots=np.array([0, 3]),
        baseline=0.25,
        depth=1,
    )
    for x0, x1, want in ((0.0, 0.0, -0.25), (1.0, 1.0, -1.25), (3.0, 0.0, 2.75), (3.0, 9.0, 1.75)):
        assert trees.raw(np.array([x0, x1])) == pytest.approx(want)
    batch = np.array([[0.0, 0.0], [3.0, 9.0]])
    assert trees.raw_many(batch).tolist() == pytest.approx([-0.25, 1.75])


TEXTS = (
    "The committee met on Tuesday to review the budget for the coming year.",
    "kitrelStarunder manyquerbolt ramsOLDhurstinkle fenwoodgrin plastorsTeaber",
    "Spices:\n" + "\n".join(f"{k}. Anise" for k in range(4, 30)),
    "def f(x):\n    return x + 1\n\n| a | b |\n|---|---|\n| 1 | 2 |",
    "Die Universität München liegt in Bayern.".encode().decode("cp1252"),
    "!" * 40,
)


def test_more_rule_evidence_never_lowers_p_corrupted() -> None:
    m = model.load()
    assert "rule_score" in m.monotone
    for name in m.monotone:
        i = features.NAMES.index(name)
        for t in TEXTS:
            f = rules(t)
            x, _ = features.vector(t, f.score, f.signals, m.chars, m.words, m.weights)
            ps = []
            for v in np.linspace(0.0, 5.0, 26):
                x[i] = v
                ps.append(m.p_corrupted(x))
            assert all(b >= a for a, b in zip(ps, ps[1:], strict=False)), (name, t[:30])


# ---------------------------------------------------------------- the fitted decision
# (failure categories of the rules; texts written here, not taken from any evaluation set)

README_RST = """\
ExampleLib
==========

.. |PyPI| image:: https://img.shields.io/pypi/v/examplelib.svg
   :target: https://pypi.org/project/examplelib/

.. code-block:: python

    import examplelib
    examplelib.run(config="prod.toml")

Changelog
^^^^^^^^^

- 2.1.0: faster start-up, fewer dependencies.
- 2.0.3: fixed a crash when the cache folder is missing.
- 2.0.2: fixed a crash when the log folder is missing.
"""

GLUED_PIECES = "kitrelStarunder manyquerbolt ramsOLDhurstinkle fenwoodgrin plastorsTeaber"


def test_fitted_finds_salad_of_glued_subword_pieces() -> None:
    assert rules(GLUED_PIECES).label is None  # no script mixing: the rules miss it
    f = score_fitted(GLUED_PIECES)
    assert f.label == "token_salad"
    assert f.score >= THRESHOLD
    assert f.offset is not None


def test_fitted_finds_mojibake() -> None:
    text = "Die Universität München liegt in Bayern, nördlich der Alpen, am Ufer der Isar."
    broken = text.encode("utf-8").decode("cp1252")
    assert score_fitted(text).label is None
    assert score_fitted(broken).label == "token_salad"


def test_fitted_finds_a_loop_behind_rising_list_numbers() -> None:
    loop = "Here are the spices:\n" + "\n".join(f"{k}. Cardamom" for k in range(1, 40))
    assert score_fitted(loop).label == "repetition"


def test_fitted_keeps_restructuredtext_clean() -> None:
    assert score_fitted(README_RST).label is None
    assert score_fitted(PROSE).label is None


def test_score_text_is_the_fitted_decision() -> None:
    # the default decision: the fitted one (it beats the rules on every held-out source,
    # docs/detector.md); the rules miss the glued pieces the fitted decision finds
    for t in (GLUED_PIECES, README_RST, "The The The The The The The The The"):
        assert score_text(t) == score_fitted(t)
    assert score_text(GLUED_PIECES).label == "token_salad"
    assert rules(GLUED_PIECES).label is None


def test_words_hash_alike_wherever_they_stand() -> None:
    h, n = wordmodel.words(charmodel.codes("The cat, the CAT! read_config 42 München; 東京は"))
    assert n.tolist() == [3, 3, 3, 3, 11, 2, 7, 3]
    assert h[0] == h[2]  # case folded, punctuation between
    assert h[1] == h[3]
    assert len(set(h.tolist())) == 6
    assert wordmodel.words(charmodel.codes(" ,;  ")).__getitem__(0).size == 0


WORDS_AT = [
    ("The cat, the CAT! read_config 42 München; 東京は",
     ["The", "cat", "the", "CAT", "read_config", "42", "München", "東京は"]),
    ("  a b", ["a", "b"]),
    (" ,;  ", []),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), WORDS_AT)
def test_words_at_says_where_each_word_starts(text: str, expected: list[str]) -> None:
    cp = charmodel.codes(text)
    h, starts, n = wordmodel.words_at(cp)
    assert [text[s : s + k] for s, k in zip(starts.tolist(), n.tolist(), strict=True)] == expected
    h2, n2 = wordmodel.words(cp)
    assert h.tolist() == h2.tolist()
    assert n.tolist() == n2.tolist()


def test_word_model_marks_unused_words_and_pairs() -> None:
    wm = wordmodel.count([PROSE, PROSE], 12, 14)
    h, _ = wordmodel.words(charmodel.codes("the committee met on Tuesday"))
    u1, u2 = wm.unseen(h)
    assert u1.sum() == 0
    assert u2.sum() == 0
    h, _ = wordmodel.words(charmodel.codes("the sessnegotiate met Tuesday on"))
    u1, u2 = wm.unseen(h)
    assert u1.tolist() == [0, 1, 0, 0, 0]
    assert u2.tolist() == [1, 1, 1, 1]  # every pair but none of them clean text's


def test_word_features_rise_on_glued_words() -> None:
    m = model.load()
    i = features.NAMES.index("unseen_wchars_w8")
    clean, _ = features.vector(PROSE, 0.0, {}, m.chars, m.words, m.weights)
    words = PROSE.split()
    glued = " ".join(
        words[:8] + ["postponeannualwhendiscuss", "finaldecisionofficemet"] + words[8:]
    )
    bad, _ = features.vector(glued, 0.0, {}, m.chars, m.words, m.weights)
    assert bad[i] > clean[i] + 0.2


CALLS = "I'll check each city.\n" + "\n".join(
    f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city": "{c}"}}}}\n</tool_call>'
    for c in ("Paris", "Lyon", "Nice", "Lille", "Brest")
)


def test_loops_are_looked_for_without_well_formed_calls() -> None:
    from harness.verdict.detector.masking import without_markup

    assert without_markup(PROSE)[0] is PROSE
    left, _ = without_markup(CALLS)
    assert "tool_call" not in left
    assert left.startswith("I'll check each city.")
    broken = CALLS.replace('"Nice"}}', '"Nice"}')  # not JSON: kept, the dialect reports it
    left, _ = without_markup(broken)
    assert left.count('"Nice"') == 1
    assert "Paris" not in left
    assert "tool_call" not in left  # its tags are markup all the same
    glued = CALLS.split("\n", 1)[0] + "\n" + '{"name": "f", "arguments": {"q": "a"}}' * 3
    left, _ = without_markup(glued)
    assert left.count('"name"') == 1  # the first of calls glued together is read
    m = model.load()
    i = features.NAMES.index("dup_lines")
    assert features.vector(CALLS, 0.0, {}, m.chars, m.words, m.weights)[0][i] == 0.0
    assert score_fitted(CALLS).label is None


def test_one_end_of_turn_token_at_the_very_end_is_clean() -> None:
    assert score_fitted("All three files are updated.<|im_end|>").label is None


def test_offsets_past_removed_markup_map_back() -> None:
    from harness.verdict.detector.masking import original_offset, without_markup

    text = "Use <\uff5cDSML\uff5ctool_calls> x </\uff5cDSML\uff5ctool_calls> then write here."
    left, removed = without_markup(text)
    assert "DSML" not in left
    assert original_offset(left.index("then"), removed) == text.index("then")
    assert original_offset(2, removed) == 2


def test_quoted_tool_call_markup_is_not_salad() -> None:
    block = (
        '<\uff5cDSML\uff5ctool_calls>\n<\uff5cDSML\uff5cinvoke name="get_weather">\n'
        '<\uff5cDSML\uff5cparameter name="city" string="true">Paris'
        "</\uff5cDSML\uff5cparameter>\n</\uff5cDSML\uff5cinvoke>\n</\uff5cDSML\uff5ctool_calls>"
    )
    assert score_fitted(f"The model writes:\n```\n{block}\n```\nThat is the format.").label is None


def test_identifiers_marked_as_inline_code_are_not_words_of_the_prose() -> None:
    from harness.verdict.detector.masking import without_markup

    text = "Next I will open `qzx_flushv2` and compare it with `wbk_evictlru` before editing."
    left, removed = without_markup(text)
    assert "qzx" not in left
    assert "wbk" not in left
    assert len(removed) == 2
    assert score_fitted(text).label is None


# ---------------------------------------------------------------- n-gram weights and local features


def _cp(text: str) -> tuple[np.ndarray, np.ndarray]:
    raw = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    return raw, charmodel.codes(raw)


def test_weight_ids_name_the_ngrams_ending_at_each_character() -> None:
    text = "abcde xx abcde"  # row r: the n-grams ending at character r + 4
    b = charweights.ids(*_cp(text), 20)
    assert b.shape == (len(text) - 4, len(charweights.GRAMS))
    assert (b[0] == b[9]).all()  # "abcde" again: the same buckets
    assert (b[0] != b[1]).all()
    lower, upper = charweights.ids(*_cp("xx cat"), 20), charweights.ids(*_cp("xx cAt"), 20)
    raw = [k for k, (_, norm) in enumerate(charweights.GRAMS) if not norm]
    norm = [k for k, (_, n) in enumerate(charweights.GRAMS) if n]
    assert (lower[:, norm] == upper[:, norm]).all()  # case folded
    assert (lower[:, raw] != upper[:, raw]).any()  # case kept
    assert charweights.ids(*_cp("abcd"), 20).shape == (0, len(charweights.GRAMS))


def test_worst_window_is_the_largest_mean() -> None:
    v = np.array([0.0] * 50 + [1.0] * 32 + [0.0] * 10)
    assert charweights.worst(v, 32) == pytest.approx(1.0)
    assert charweights.worst(v, 64) == pytest.approx(0.5)
    assert charweights.worst(np.array([1.0, 3.0]), 32) == pytest.approx(2.0)


def test_shipped_weights_read_glued_pieces_as_corruption() -> None:
    m = model.load()
    clean = m.weights.scores(*_cp(PROSE))
    bad = m.weights.scores(*_cp(PROSE + " " + GLUED_PIECES))
    assert bad[0] > clean[0] + 1.0  # log-odds of the worst window
    assert m.weights.scores(*_cp("abc")) == (0.0, 0.0, 0.0)


def test_local_features_see_digit_noise_and_a_loop_compressing() -> None:
    m = model.load()
    i = features.NAMES.index("digit_in_word")
    j = features.NAMES.index("compressed")
    text = "first_uri = block.column(self._uri_column_name)[0].as_py()"
    noisy = "first_uri = blo3ck.colum3n(sel3f._u5ri_column_name)[0].as_py()"
    x, _ = features.vector(text, 0.0, {}, m.chars, m.words, m.weights)
    y, _ = features.vector(noisy, 0.0, {}, m.chars, m.words, m.weights)
    assert x[i] == 0.0
    assert y[i] > 0.3
    loop, _ = features.vector(PROSE + " again" * 60, 0.0, {}, m.chars, m.words, m.weights)
    z, _ = features.vector(PROSE, 0.0, {}, m.chars, m.words, m.weights)
    assert loop[j] < 0.5 < z[j]
    k = features.NAMES.index("unseen_w_contrast")
    spot, _ = features.vector(
        PROSE + " " + GLUED_PIECES + " " + PROSE, 0.0, {}, m.chars, m.words, m.weights
    )
    assert spot[k] > z[k]


def test_runs_of_spaces_read_as_one_space() -> None:
    justified = "An  interactive   Python shell   with automatic history"
    single = "An interactive Python shell with automatic history"
    a, b = charweights.ids(*_cp(justified), 20), charweights.ids(*_cp(single), 20)
    assert np.array_equal(a, b)
    raw, cp = _cp("a\t\tb  c d")
    r, c = charweights.squeeze(raw, cp)
    assert "".join(map(chr, r)) == "a\tb c d"
    assert c.size == r.size


def test_a_raw_call_turn_shown_in_a_code_block_is_content_not_salad() -> None:
    from harness import labels as L
    from harness.verdict import classify_turn
    from harness.verdict.detector.masking import quoted_calls

    turn = (
        '<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Tokyo'
        "</parameter>\n</invoke>\n</minimax:tool_call>[e~["
    )
    text = f"The model writes:\n```\n{turn}\n```\nThat is the format."
    (span,) = quoted_calls(text)
    assert text[span[0] : span[1]] == turn
    assert classify_turn(text, source="server").label == L.OK_TEXT
    broken = text.replace("</invoke>", "")  # not a well-formed turn: read as it is
    assert quoted_calls(broken) == []


def test_text_words_reads_one_text_once() -> None:
    text = "the committee met on Tuesday"
    found = wordmodel.text_words(text)
    expected = wordmodel.words_at(charmodel.codes(text))
    assert [a.tolist() for a in found] == [a.tolist() for a in expected]
    assert wordmodel.text_words("".join(list(text))) is found  # an equal text: kept
    assert not found[0].flags.writeable  # shared: nobody writes into them
    other = wordmodel.text_words("another text")
    assert other is not found
    assert other[2].tolist() == [7, 4]
