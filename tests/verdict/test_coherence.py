"""The second look at the text detector's findings on agent text: ordinary prose of one
writing system that only the character model doubts is acquitted; salad is not."""

from __future__ import annotations

import json
import random
from pathlib import Path

from harness.sim import salad as simsalad
from harness.verdict import classify_text, classify_turn
from harness.verdict.detector import coherence

EVAL = Path(__file__).resolve().parent.parent / "data" / "eval"
MODEL_ONLY = {"char_surprisal": 5.5, "p_corrupted": 0.999}
PROSE = (
    "Absolutely! Capturing a user’s “taste for novelty” is a good way to tune the "
    "recommendations. Here’s how I’d change **`agent/prompts.md`** and the config:"
)
SOUP = "Thenessrekafter uplacingtion vorbenditz, quarmelling stroffed blikant wennoshtep."


def test_ordinary_prose_of_one_script_with_no_rule_signal_is_acquitted() -> None:
    why = coherence.second_look(PROSE, "token_salad", MODEL_ONLY)
    assert why is not None
    assert why.startswith("ordinary words")


def test_what_the_acquittal_leaves_alone() -> None:
    cases = [
        (SOUP, MODEL_ONLY),  # words no text uses, several in eight
        (PROSE, {**MODEL_ONLY, "identifier_soup": 0.6}),  # a rule saw something
        (PROSE + " Это 它们 foo.py.", MODEL_ONLY),  # two other writing systems
        ("^(?:25[0-5]|2[0-4]\\d)\\.{3}$ [!#$%&'*+/U4/e~7L3QX;95", MODEL_ONLY),  # not prose
    ]
    for text, signals in cases:
        assert coherence.second_look(text, "token_salad", signals) is None, text


def test_short_cross_script_soup_after_prose_is_still_found() -> None:
    rng = random.Random(3)
    found = 0
    for _ in range(40):
        text = PROSE[: rng.randint(40, len(PROSE))] + simsalad.salad(rng, rng.randint(20, 120))
        v = classify_turn(text, source="server")
        found += v.corrupted
        assert not str(v.evidence.get("acquitted", "")).startswith("ordinary"), text
    assert found >= 30


def test_no_corrupted_example_of_the_project_set_is_acquitted_as_ordinary_words() -> None:
    for name in ("handwritten.jsonl", "generated.jsonl", "holdout.jsonl"):
        for line in (EVAL / name).read_text("utf-8").splitlines():
            row = json.loads(line)
            if row["label"] not in ("salad", "repetition"):
                continue
            why = str(classify_text(row["text"]).evidence.get("acquitted", ""))
            assert not why.startswith("ordinary"), row["id"]
