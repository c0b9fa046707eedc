"""The detector on the project's own labelled set meets the quality bar.

Runs the evaluation of tools/detector/evaluate.py (its self-contained classifier: the DSML
parser for tool-call markup, then score_text) on the hand-written and generated examples.
The hold-out split is reported in docs/detector.md, not asserted here.
"""

from __future__ import annotations

import json
from pathlib import Path

from tools.detector import evaluate as ev

ROOT = Path(__file__).resolve().parent.parent.parent
EVAL = ROOT / "tests" / "data" / "eval"


def test_eval_files_are_well_formed() -> None:
    labels = {"salad", "repetition", "malformed_tool_call", "clean", "ambiguous"}
    ids = set()
    for name in ("handwritten.jsonl", "generated.jsonl", "holdout.jsonl"):
        for line in (EVAL / name).read_text("utf-8").splitlines():
            row = json.loads(line)
            assert row["label"] in labels
            assert isinstance(row["text"], str)
            assert row["text"]
            assert row["id"] not in ids
            ids.add(row["id"])
    assert len(ids) >= 300


def test_quality_bar_on_the_project_set() -> None:
    rows = ev.load([EVAL / "handwritten.jsonl", EVAL / "generated.jsonl"])
    metrics, _ = ev.evaluate(rows, ev.fallback_classify)
    garbled = metrics["garbled"]
    assert garbled["recall"] >= 0.9, metrics
    assert garbled["fpr"] <= 0.03, metrics
    assert metrics["clean"] >= 100


def test_evaluate_counts_by_class() -> None:
    rows = [
        {"id": "a", "text": "x", "label": "salad"},
        {"id": "b", "text": "y", "label": "clean"},
        {"id": "c", "text": "z", "label": "ambiguous"},
    ]
    answers = {"x": "token_salad", "y": "repetition", "z": "ok_text"}
    metrics, errors = ev.evaluate(rows, lambda t, c: answers[t])
    assert metrics["classes"]["salad"]["recall"] == 1.0
    assert metrics["garbled"]["fpr"] == 1.0
    assert metrics["ambiguous"] == {"clean": 1}
    assert errors == [("b", "clean", "repetition")]
