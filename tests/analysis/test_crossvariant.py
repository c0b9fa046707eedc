"""An answer cut short against another variant's answer to the same request."""

from __future__ import annotations

from typing import Any

from harness.analysis import crossvariant as cv

LONG = "The cache holds the keys and values of every token a session has seen so far. " * 5


def _row(variant: str, session: int, turn: int, content: str, **extra: Any) -> dict[str, Any]:
    row = {"variant": variant, "repeat": 0, "session": session, "turn": turn, "attempt": 0,
           "content": content, "finish_reason": "stop", "transport_error": None,
           "label": "ok_text"}  # fmt: skip
    row.update(extra)
    return row


def test_short_junk_is_cut_short_against_a_long_answer() -> None:
    junk = _row("a", 0, 0, "This wisinggesmol found its prime minister.")
    assert cv.cut_short(junk, _row("b", 0, 0, LONG))
    assert not cv.cut_short(_row("b", 0, 0, LONG), junk)  # the long one is not


def test_what_is_not_cut_short() -> None:
    ref = _row("b", 0, 0, LONG)
    # against a flagged answer (a damaged build's long loop): no yardstick
    assert not cv.cut_short(_row("a", 0, 0, "Yes."), _row("b", 0, 0, LONG, label="repetition"))
    # the same answer, a length cap (the request's max_tokens), a short reference
    assert not cv.cut_short(_row("a", 0, 0, LONG), ref)
    assert not cv.cut_short(_row("a", 0, 0, "Short.", finish_reason="length"), ref)
    assert not cv.cut_short(_row("a", 0, 0, "Yes."), _row("b", 0, 0, "Yes, it does so."))
    # two healthy answers that part somewhere and go on at their own lengths
    other = LONG[:120] + " It evicts the oldest entries first when memory runs short." * 2
    assert not cv.cut_short(_row("a", 0, 0, other), ref)


def test_evidence_compares_while_the_requests_are_the_same() -> None:
    rows = [
        # session 0: the same first answer, then variant a cut short at turn 1
        _row("a", 0, 0, LONG), _row("b", 0, 0, LONG),
        _row("a", 0, 1, "Explain:"), _row("b", 0, 1, LONG + " More."),
        # session 1: the first answers differ (both long): the later requests differ, and a
        # short answer at turn 1 is not compared
        _row("a", 1, 0, LONG + " A."), _row("b", 1, 0, LONG + " B."),
        _row("a", 1, 1, "Done."), _row("b", 1, 1, LONG),
        # session 2: b's send failed: nothing to compare with
        _row("a", 2, 0, "Hm."), _row("b", 2, 0, "", transport_error="http_status: 500"),
    ]  # fmt: skip
    found = cv.evidence(rows)
    assert found[("a", 0, 0, 1, 0)] == (cv.CUT_SHORT, "b")
    # the same first answer in both: each is the other's reference
    assert found[("a", 0, 0, 0, 0)] == (cv.SAME, "b")
    assert found[("b", 0, 0, 0, 0)] == (cv.SAME, "a")
    assert set(found) == {("a", 0, 0, 1, 0), ("a", 0, 0, 0, 0), ("b", 0, 0, 0, 0)}


def test_the_last_send_of_a_turn_is_compared() -> None:
    rows = [
        _row("a", 0, 0, "Oops.", attempt=0),
        _row("a", 0, 0, LONG, attempt=1),
        _row("b", 0, 0, LONG),
    ]
    assert cv.evidence(rows) == {
        ("a", 0, 0, 0, 1): (cv.SAME, "b"),
        ("b", 0, 0, 0, 0): (cv.SAME, "a"),
    }


def test_rows_read_by_pandas_compare_too() -> None:
    """A frame's records have NaN where a field is empty: no failure, no content."""
    import pandas as pd

    rows = [
        _row("a", 0, 0, "Explain:"),
        _row("b", 0, 0, LONG),
        _row("a", 1, 0, "x", transport_error="timeout: 120s"),
        _row("b", 1, 0, LONG),
    ]
    records = pd.DataFrame(rows).to_dict("records")
    assert any(isinstance(r["transport_error"], float) for r in records)  # NaN
    assert cv.evidence(records) == {("a", 0, 0, 0, 0): (cv.CUT_SHORT, "b")}
