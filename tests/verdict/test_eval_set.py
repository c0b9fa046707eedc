"""The detector on the project's own labelled set meets the quality bar.

Runs the evaluation of benchmarks/eval_detector.py (its self-contained classifier: the DSML
parser for tool-call markup, then score_text) on the hand-written and generated examples.
The hold-out split is reported in docs/detector.md, not asserted here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent.parent
EVAL = ROOT / "tests" / "data" / "eval"


def _eval_module() -> ModuleType:
    path = ROOT / "benchmarks" / "eval_detector.py"
    spec = importlib.util.spec_from_file_location("eval_detector", path)
    assert spec is not None
    assert spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eval_detector"] = mod
    spec.loader.exec_module(mod)
    return mod


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
    ev = _eval_module()
    rows = ev.load([EVAL / "handwritten.jsonl", EVAL / "generated.jsonl"])
    metrics, _ = ev.evaluate(rows, ev.fallback_classify)
    garbled = metrics["garbled"]
    assert garbled["recall"] >= 0.9, metrics
    assert garbled["fpr"] <= 0.03, metrics
    assert metrics["clean"] >= 100


def test_evaluate_counts_by_class() -> None:
    ev = _eval_module()
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
