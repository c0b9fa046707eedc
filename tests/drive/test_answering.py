"""The rules of harness.drive.answering on their own: Retry-After, refusals, the recent window."""

from __future__ import annotations

import email.utils
import time

import pytest

from harness.client.chat import retry_after
from harness.client.output import Failure
from harness.drive.answering import ServerWatch, retry_delay
from harness.errors import EndpointRefused, InfrastructureError, ServerUnanswering


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after("7") == 7.0
    assert retry_after(" 1.5 ") == 1.5
    assert retry_after(None) is None
    assert retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 < (retry_after(later) or 0) <= 30


def test_retry_after_is_honoured_on_429_and_503_only_and_bounded() -> None:
    busy = Failure("http_status", "slow down", 429, retry_after_s=5.0)
    assert retry_delay(busy, 0.5) == 5.0
    assert retry_delay(Failure("http_status", "x", 503, retry_after_s=600.0), 0.5) == 60.0
    assert retry_delay(Failure("http_status", "x", 503, retry_after_s=0.1), 2.0) == 2.0
    assert retry_delay(Failure("http_status", "x", 500, retry_after_s=9.0), 0.5) == 0.5


def test_a_refusal_counts_only_before_the_first_answer() -> None:
    watch = ServerWatch("v", "http://h/v1/chat/completions")
    with pytest.raises(EndpointRefused) as refused:
        watch.check(Failure("http_status", "no such model", 404))
    assert refused.value.whole_run
    assert refused.value.exit_code == 2
    with pytest.raises(EndpointRefused) as one:
        watch.check(Failure("http_status", "bad field", 422))
    assert not one.value.whole_run  # may depend on the variant's server
    watch.check(None)
    watch.check(Failure("http_status", "context too long", 400))  # after an answer: a row


def test_the_recent_window_of_failures_stops_the_variant() -> None:
    watch = ServerWatch("v", "u", window=4)
    for _ in range(3):
        watch.check(Failure("connect", "refused"))
    watch.check(None)  # an answer in between: the server still answers
    for _ in range(3):
        watch.check(Failure("connect", "refused"))
        watch.check(Failure("cancelled", "the run was stopped"))  # not the server's
    with pytest.raises(ServerUnanswering):
        watch.check(Failure("cut", "reset"))


def test_out_of_file_descriptors_is_the_harness_not_the_server() -> None:
    watch = ServerWatch("v", "u")
    with pytest.raises(InfrastructureError, match="the harness ran out of file descriptors"):
        watch.check(Failure("connect", "Cannot connect: [Errno 24] Too many open files"))


def test_http_errors_are_answers_for_the_window() -> None:
    watch = ServerWatch("v", "u", window=3)
    watch.check(None)
    for _ in range(10):
        watch.check(Failure("http_status", "overloaded", 503))  # up, if unwell
    watch.check(Failure("timeout", "no byte"))
    watch.check(Failure("timeout", "no byte"))
    with pytest.raises(ServerUnanswering):
        watch.check(Failure("timeout", "no byte"))
