"""A send the server failed because it could not encode its own output is corruption."""

from __future__ import annotations

from harness import labels as L
from harness.verdict.turn import STRUCTURAL, failure_verdict


def test_the_engines_utf8_complaint_is_corruption() -> None:
    msg = "http_status: [json.exception.type_error.316] invalid UTF-8 byte at index 161: 0x20"
    v = failure_verdict(msg)
    assert v.label == L.TOKEN_SALAD
    assert v.corrupted
    assert v.tier == STRUCTURAL
    assert v.evidence["kind"] == "unencodable_output"
    py = failure_verdict("http_status: 'utf-8' codec can't decode byte 0x9e in position 3")
    assert py.corrupted
    streamed = "stream_error: [json.exception.type_error.316] invalid UTF-8 byte at index 0: 0xA"
    assert failure_verdict(streamed).corrupted  # the error event of a streamed answer


def test_other_failures_stay_transport_errors() -> None:
    for failure in (
        "http_status: 503 Service Unavailable",
        "connect: connection refused",
        "protocol: invalid UTF-8 in the SSE stream",  # not the server's encoder speaking
    ):
        v = failure_verdict(failure)
        assert v.label == L.TRANSPORT_ERROR
        assert not v.corrupted
