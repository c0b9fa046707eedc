"""What the headline counts, by tier: structural + confirmed where suspects were judged,
structural + suspect where none could be."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.analysis.summary import summarize


def _turn(variant: str, session: int, label: str, tier: str = "", **extra: Any) -> dict[str, Any]:
    bad = label in ("token_salad", "repetition", "malformed_tool_call", "invalid_tool_call")
    return {"variant": variant, "session": session, "turn": 0, "label": label,
            "corrupted": bad, "tier": tier, "content": f"text of {session}", **extra}  # fmt: skip


def test_the_headline_counts_structural_and_confirmed_where_the_judge_ran() -> None:
    rows = [
        _turn("a", 0, "ok_text"),
        _turn("a", 1, "malformed_tool_call", "structural"),
        _turn("a", 2, "token_salad", "suspect", judge_confirmed=True),
        _turn("a", 3, "token_salad", "suspect", judge_confirmed=False),
        _turn("a", 4, "repetition", "suspect"),  # the judge could not score it
        _turn("a", 5, "repetition", "confirmed"),  # an earlier version's loop to the end
        _turn("b", 0, "token_salad", "suspect"),  # no judge in b: the detector alone
        _turn("b", 1, "ok_text"),
        _turn("b", 2, "invalid_tool_call", "structural"),
    ]
    s = summarize(pd.DataFrame(rows), "r")
    a, b = s["variants"]
    assert a["headline_basis"] == "structural+confirmed"
    assert (a["structural_turns"], a["confirmed_turns"], a["suspect_turns"]) == (1, 2, 4)
    assert a["corrupted_turns"] == 3
    assert a["tiers"]["suspect_acquitted"] == 1
    assert a["tiers"]["suspect_not_judged"] == 1
    assert {e["session"] for e in a["suspect_examples"]} == {3, 4}
    assert b["headline_basis"] == "structural+suspect"
    assert b["corrupted_turns"] == 2
    assert s["headline"]["counts"] == "structural+suspect"
    assert s["headline"]["text_detector_alone"] == ["b"]


def test_a_suspect_sent_again_is_one_example_with_its_attempts() -> None:
    rows = [_turn("a", 7, "repetition", "suspect", judge_confirmed=False, attempt=i)
            for i in range(3)]  # fmt: skip
    rows.append(_turn("a", 8, "token_salad", "suspect", judge_confirmed=False, attempt=0))
    [v] = summarize(pd.DataFrame(rows), "r")["variants"]
    assert v["tiers"]["suspect_acquitted"] == 4  # every row counts
    examples = v["suspect_examples"]
    assert [(e["session"], e["attempts"]) for e in examples] == [(7, 3), (8, 1)]


def test_records_from_before_the_tiers_get_them_from_their_label() -> None:
    rows = [_turn("a", 0, "token_salad"), _turn("a", 1, "malformed_tool_call")]
    for r in rows:
        del r["tier"]
    [v] = summarize(pd.DataFrame(rows), "r")["variants"]
    assert (v["structural_turns"], v["suspect_turns"], v["corrupted_turns"]) == (1, 1, 2)
    assert v["headline_basis"] == "structural+suspect"


def test_an_exact_oracle_confirms_a_suspect() -> None:
    from harness.analysis.tiers import merge_oracles

    rows = [
        _turn("a", 0, "token_salad", "suspect"),  # the replay says it diverged
        _turn("a", 1, "token_salad", "suspect", judge_confirmed=False),
        _turn("a", 2, "ok_text"),  # an oracle's finding on a turn the detector passed
    ]
    frame = pd.DataFrame(rows).assign(repeat=0, attempt=0)
    evidence = {("a", 0, 0, 0, 0): ["replay"], ("a", 0, 2, 0, 0): ["passkey"]}
    [v] = summarize(merge_oracles(frame, evidence), "r")["variants"]
    assert v["headline_basis"] == "structural+confirmed"
    assert (v["confirmed_turns"], v["corrupted_turns"], v["suspect_turns"]) == (1, 1, 2)
    assert v["tiers"]["suspect_acquitted"] == 1


def test_the_same_request_alone_and_on_another_variant() -> None:
    """A suspect flagged again when re-sent alone (or written byte for byte by another
    variant) is the model's own answer: acquitted; one clean alone is confirmed; an answer
    the detector passed that was cut short against another variant's is confirmed."""
    from harness.analysis import crossvariant
    from harness.analysis.tiers import merge_alone, merge_reference

    loop = "It handles the stream pages. " * 12
    rows = [
        _turn("a", 0, "repetition", "suspect", content=loop),  # b wrote the same: acquitted
        _turn("b", 0, "repetition", "suspect", content=loop),
        _turn("a", 1, "repetition", "confirmed", content="x " * 30),  # the same loop alone
        _turn("a", 2, "token_salad", "suspect", content="wisinggesmol"),  # clean alone
        _turn("a", 3, "ok_text", content="Explain:", finish_reason="stop"),  # cut short
        _turn("b", 3, "ok_text", content=loop, finish_reason="stop"),
    ]
    frame = merge_reference(pd.DataFrame(rows), crossvariant.evidence(rows))
    confirm = [
        {"variant": "a", "repeat": 0, "session": 1, "turn": 0, "attempt": 0,
         "status": "reproduces_alone", "label": "repetition", "recorded_label": "repetition",
         "same_as_recorded": True},
        {"variant": "a", "repeat": 0, "session": 2, "turn": 0, "attempt": 0,
         "status": "confirmed_under_load"},
    ]  # fmt: skip
    frame = merge_alone(frame.assign(repeat=0, attempt=0), confirm)
    a, b = summarize(frame, "r")["variants"]
    assert a["corrupted_sessions"] == 2  # session 2 (clean alone) and 3 (cut short)
    assert a["tiers"]["suspect_acquitted"] == 2
    assert a["reference"] == {"acquitted": 1, "cut_short": 1}
    assert a["alone"] == {"acquitted": 1, "confirmed": 1}
    assert b["corrupted_turns"] == 0
    assert b["headline_basis"] == "structural+confirmed"


def test_sends_cut_by_the_servers_death_are_that_finding_not_transport_errors() -> None:
    from harness.analysis.summary import lost_to_deaths

    rows = [
        _turn("a", 0, "ok_text", sent_at=100.0, latency_s=2.0),
        _turn("a", 1, "transport_error", transport_error="timeout: 120s", sent_at=100.0,
              latency_s=1.0),  # failed long before the server died: a transport error
        _turn("a", 2, "transport_error", transport_error="cut: Server disconnected",
              sent_at=150.0, latency_s=8.0),  # in flight when it died
        _turn("a", 3, "transport_error", transport_error="connect: refused", sent_at=159.0),
        _turn("b", 0, "transport_error", transport_error="connect: refused", sent_at=159.0),
    ]  # fmt: skip
    death = {"variant": "a", "repeat": 0, "at": 158.5}
    frame = lost_to_deaths(pd.DataFrame(rows).assign(repeat=0), [death])
    a, b = summarize(frame, "r")["variants"]
    assert (a["lost_to_server_death"], a["transport_errors"]) == (2, 1)
    assert (b["lost_to_server_death"], b["transport_errors"]) == (0, 1)
