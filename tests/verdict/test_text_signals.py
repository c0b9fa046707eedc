"""One test pair (fires / stays quiet) per signal of the text detector."""

from __future__ import annotations

import pytest

from harness.verdict.detector import repeat, salad, scripts
from harness.verdict.detector.text import THRESHOLD, rules, score_text

PROSE = (
    "The migration has three steps. First, we add the new column with a default value so "
    "that existing rows stay valid. Second, a background job copies the old values into the "
    "new column in small batches, which keeps the table available. "
)


def _signals(text: str) -> set[str]:
    return {s for _, _, s in salad.events(text, text.isascii())}


# ------------------------------------------------------------------ script switches


def test_script_switch_inside_a_word_is_an_event() -> None:
    pos, w = scripts.switch_events(scripts.script_ids("для\u30b3\u30f3\u30c6\u30f3\u30c4а"))
    assert pos.size == 2  # Cyrillic -> Katakana and back
    assert float(w.min()) >= 0.6


@pytest.mark.parametrize(
    "text",
    [
        "用Python写一个爬虫",  # Chinese glued to Latin names
        "このライブラリはPythonで書かれています",  # Japanese
        "API를 통해 Python으로",  # Korean particles on Latin words
        "ระบบนี้ใช้Pythonในการ",  # Thai has no spaces either
        "Привет, world: مرحبا שלום",  # switches at word boundaries
    ],
)
def test_normal_mixed_script_has_no_switch_event(text: str) -> None:
    pos, _ = scripts.switch_events(scripts.script_ids(text))
    assert pos.size == 0


def test_greek_letters_in_formulas_are_weak() -> None:
    _, w = scripts.switch_events(scripts.script_ids("2πfC and 4.7kΩ"))
    assert float(w.sum()) < THRESHOLD


def test_combining_marks_take_the_script_of_their_letter() -> None:
    # Devanagari vowel signs and a Latin letter with a combining accent: no switch
    pos, _ = scripts.switch_events(scripts.script_ids("हिंदी cafe\u0301"))
    assert pos.size == 0


def test_many_scripts_close_together_is_variety() -> None:
    pos, _ = scripts.variety_events(scripts.script_ids("abc где 数据 ありがとう κυ"))
    assert pos.size >= 1
    pos, _ = scripts.variety_events(scripts.script_ids("plain English words only here"))
    assert pos.size == 0


# ------------------------------------------------------------------ regex / numpy events


def test_special_tokens_found() -> None:
    found = [t for _, _, t in salad.special_tokens("a<|im_start|>b</think>c<unk>d")]
    assert found == ["<|im_start|>", "</think>", "<unk>"]


def test_end_of_turn_at_the_end_is_not_debris() -> None:
    eos = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    assert list(salad.special_tokens("done." + eos)) == []
    assert len(list(salad.special_tokens("done." + eos + " more"))) == 1


def test_replacement_characters() -> None:
    assert "replacement_char" in _signals("걸\ufffd\ufffd야")
    assert "replacement_char" not in _signals("걸러야 하니까")


def test_char_run_fires_on_punctuation_not_on_rules() -> None:
    assert "char_run" in _signals("Great" + "!" * 12)
    assert "char_run" not in _signals("Title\n=========\n----------\n**********")


def test_symbol_soup_fires_on_punctuation_soup_not_on_json() -> None:
    assert "symbol_soup" in _signals('.5"5.F9(CB;6@FC9!DC:$B$D60G5",3B+2;1-*,@%=876E0')
    assert "symbol_soup" not in _signals('{"a": [1, 2], "b": {"c": "d"}, "e": null}')


def test_glued_punctuation_between_letters() -> None:
    assert "glued_punctuation" in _signals("word?other")
    assert "glued_punctuation" not in _signals("Really? Yes! Fine; go.")


def test_identifier_soup_and_camel_case() -> None:
    assert "identifier_soup" in _signals("call setUpMANAGER now")
    assert "identifier_soup" not in _signals("On iPhone, open YouTube and PowerPoint.")


def test_stutter_inside_a_word() -> None:
    assert "stutter" in _signals("overwardwardwards")
    assert "stutter" not in _signals("straightforward towards")


def test_doubled_spaceless_characters() -> None:
    assert "stutter_run" in _signals("的的是是在在了了")
    assert "stutter_run" not in _signals("高高兴兴地回家")


# ------------------------------------------------------------------ loops


def test_exact_loop_has_period_and_copies() -> None:
    tokens = repeat.tokens_of("intro words here " + "the cat sat down " * 6)
    loops = repeat.find_loops(tokens)
    assert loops
    assert loops[0].kind == "loop"
    assert loops[0].period == 4
    assert loops[0].copies >= 5


def test_drifting_loop_is_found_without_exact_period() -> None:
    subjects = ["old", "new", "old", "next", "old", "remaining", "old", "new", "old", "next"]
    text = " ".join(f"Then the job copies the {w} values into the column." for w in subjects)
    loops = repeat.find_loops(repeat.tokens_of(text))
    assert loops
    assert loops[0].score >= THRESHOLD


def test_prose_has_no_loop() -> None:
    assert not [lp for lp in repeat.find_loops(repeat.tokens_of(PROSE * 1)) if lp.score >= 1]


MATRIX = "\n".join(["[0. 0. 0. 0. 0. 0.]"] * 6)


def test_rows_of_numbers_are_not_loops() -> None:
    assert rules(MATRIX).label is None


@pytest.mark.xfail(
    strict=True,
    reason="known regression of the fitted decision: a printed matrix of zeros reads like "
    "the corpus's digit loops (docs/detector.md)",
)
def test_the_fitted_decision_keeps_rows_of_numbers_clean() -> None:
    assert score_text(MATRIX).label is None


def test_tokens_split_spaceless_scripts_into_characters() -> None:
    assert repeat.tokens_of("数据Row ok") == ["数", "据", "row", "ok"]
