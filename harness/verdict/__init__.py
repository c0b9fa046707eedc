"""Classify one turn: envelope checks, argument checks, reasoning apart, salad and repetition
-> ``Verdict`` (``turn.py``). The text detector (``text.py`` and the modules it reads) is one
of its parts; it never reads the simulator's ground truth."""

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
