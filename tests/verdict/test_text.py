"""score_text: labels, offsets of late corruption, hard clean cases, context mirroring."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.dialects import dsml
from harness.verdict.detector.text import THRESHOLD, TextFinding, score_text

EVAL = Path(__file__).resolve().parent.parent / "data" / "eval"
PREFIX = (
    "Distributed systems fail in partial and surprising ways. A request can succeed on one "
    "replica and time out on another; a network partition can make two halves of a cluster "
    "both believe they are the leader; a clock can jump backwards after a correction. Good "
    "designs accept these failures as normal. They make operations idempotent so that "
    "retries are safe, they use fencing tokens so that a deposed leader cannot corrupt shared "
    "state, and they measure latency in percentiles rather than averages, because the tail is "
    "where users feel pain. Testing such systems is hard because the interesting bugs only "
    "appear under concurrency. Deterministic simulation helps: run the whole cluster in one "
    "process with a seeded scheduler, inject faults, and check invariants after every step. "
    "When a seed fails, it fails the same way every time, which turns a heisenbug into an "
    "ordinary one. Finally, observability matters: structured logs, metrics and traces let an "
    "engineer reconstruct what happened after the fact. "
)


def test_api_shape() -> None:
    f = score_text("Hello there. How can I help you today?")
    assert isinstance(f, TextFinding)
    assert f.label is None
    assert f.offset is None
    assert f.score < THRESHOLD
    assert score_text("") == score_text("   ")


def test_late_salad_is_found_with_its_offset() -> None:
    salad = "вывод_handlerULATE 性能zá strSQLат廣 buildersкой ConfigManagerINGS выполнtörü 数据Row"
    f = score_text(PREFIX + salad)
    assert f.label == "token_salad"
    assert f.score >= THRESHOLD
    assert f.offset is not None
    assert len(PREFIX) - 5 <= f.offset < len(PREFIX) + 40


def test_late_loop_is_found_with_its_offset() -> None:
    loop = " ".join(["The copy job runs in batches of one thousand rows."] * 8)
    f = score_text(PREFIX + loop)
    assert f.label == "repetition"
    assert f.offset is not None
    assert len(PREFIX) - 5 <= f.offset <= len(PREFIX) + 60


def test_long_clean_prefix_does_not_dilute_a_stray_debris() -> None:
    f = score_text(PREFIX + "<|im_start|>assistant\nThat is the summary of the design.")
    assert f.label == "token_salad"
    assert f.offset == len(PREFIX)
    assert "special_token" in f.signals


@pytest.mark.parametrize(
    ("text", "label"),
    [
        ("!" * 40, "repetition"),
        ("The The The The The The The The The", "repetition"),
        ("<\uff5cbegin\u2581of\u2581sentence\uff5c>" * 10, "repetition"),
        ("这个模型的输出\ufffd\ufffd常不稳定", "token_salad"),
        ("Этот методworks только если параметрvalue задан", "token_salad"),
    ],
)
def test_typical_corruption(text: str, label: str) -> None:
    assert score_text(text).label == label


def _hard_clean() -> list[dict[str, str]]:
    rows = [json.loads(x) for x in (EVAL / "handwritten.jsonl").read_text("utf-8").splitlines()]
    return [r for r in rows if r["label"] == "clean"]


@pytest.mark.parametrize("row", _hard_clean(), ids=lambda r: r["id"])
def test_hard_clean_cases_stay_clean(row: dict[str, str]) -> None:
    f = score_text(row["text"], row.get("context"))
    assert f.label is None, f


def test_near_identical_tool_calls_are_clean() -> None:
    calls = [{"name": "read_file", "arguments": {"path": "src/a.py"}}] * 4
    assert score_text(dsml.encode_turn("Reading.", calls)).label is None
    hermes = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n' * 4
    assert score_text(hermes).label is None


def test_loop_inside_a_long_tool_argument_is_found() -> None:
    value = "The summary of the meeting follows. " + "We agreed to ship on Friday. " * 12
    turn = dsml.encode_turn("Saving.", [{"name": "write", "arguments": {"text": value}}])
    assert score_text(turn).label == "repetition"


def test_repetition_that_mirrors_the_context_is_not_a_loop() -> None:
    text = "\n".join(["I will not talk in class."] * 10)
    assert score_text(text).label == "repetition"
    ctx = "Write 'I will not talk in class.' 10 times, one per line."
    assert score_text(text, context=ctx).label is None


def test_context_allows_only_the_count_it_asked_for() -> None:
    text = "\n".join(["I will not talk in class."] * 60)
    ctx = "Write 'I will not talk in class.' 10 times, one per line."
    assert score_text(text, context=ctx).label == "repetition"


def test_a_common_word_in_the_context_does_not_excuse_a_word_loop() -> None:
    text = "the " * 20
    assert score_text(text, context="Explain the theorem in the book.").label == "repetition"


def test_quoted_loops_and_tokens_are_clean() -> None:
    text = "Loops look like `the the the the the the` or `<unk><unk><unk>`; stop them early."
    assert score_text(text).label is None


def test_escaped_newlines_are_read_as_line_breaks() -> None:
    text = "\\n".join(["the"] * 16)
    f = score_text(text)
    assert f.label == "repetition"
    assert f.offset == 0


def test_offset_is_the_onset_not_a_weak_note_before_it() -> None:
    clean = "I went through the tool results; the relevant code lives in `src/pool.py`, with "
    salad = "supporting pieces in של ებიверправ assertEqualفيات\nութ缓存 useStateهذاالم__init__ "
    finding = score_text(clean + salad * 2)
    assert finding.label == "token_salad"
    assert finding.offset is not None
    assert finding.offset >= len(clean)
