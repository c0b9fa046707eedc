"""Classify one turn: envelope checks, argument checks, reasoning apart, salad and repetition
-> ``Verdict`` (``turn.py``). Its parts: ``toolcheck`` (the calls against the declared tools),
``reasoning`` (reasoning split off) and the text detector (``detector``: the hand-written
rules and the fitted decision); ``batch`` is ``harness classify``. It never reads the
simulator's ground truth."""

from __future__ import annotations

from harness.verdict.turn import (
    CONFIRMED,
    SCORE_MAX_CHARS,
    STRUCTURAL,
    SUSPECT,
    Verdict,
    classify_text,
    classify_turn,
    score_bounded,
)

__all__ = [
    "CONFIRMED",
    "SCORE_MAX_CHARS",
    "STRUCTURAL",
    "SUSPECT",
    "Verdict",
    "classify_text",
    "classify_turn",
    "score_bounded",
]
