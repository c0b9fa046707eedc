"""What a variant's answers say about its server: refused, overloaded, or no longer answering.

Three kinds of failure are not transport noise to retry blindly:

- **Refused.** HTTP 400, 401, 403, 404, 405, 422 or 501 before any request of the variant was
  answered: a wrong ``--model`` (404 "model does not exist"), a missing API key (401), an
  endpoint without chat completions (404, 405, 501), a request the server does not take (400,
  422). Retrying cannot change it; the user must. The variant ends at once with one line
  naming the request, the status and the server's message (exit code 2). 401, 403, 404, 405
  and 501 depend on the key, the model name and the API path, the same for every variant: the
  run ends. 400 and 422 may depend on the variant's server flags: the run goes on.
- **Overloaded.** 429 and 503 are retried after the server's ``Retry-After`` (at most
  ``MAX_RETRY_AFTER_S``) when it is longer than the backoff.
- **No longer answering.** When the last ``RECENT_WINDOW`` requests of a variant all failed
  without an answer (connection refused, cut, timed out; an HTTP error status is an answer),
  its server stopped answering (killed, hung, its
  network gone): the variant stops as infrastructure (exit code 3) instead of letting every
  session spend its attempts. A harness out of file descriptors (``EMFILE``, "Too many open
  files") is the harness's own environment, not the server: the variant stops the same way
  with a line that says so.
"""

from __future__ import annotations

import errno
import os
from collections import deque

from harness.client.door import key_advice
from harness.client.output import CANCELLED, Failure
from harness.errors import EndpointRefused, InfrastructureError, ServerUnanswering
from harness.verdict.turn import failure_verdict

#: Statuses that retrying cannot fix, when the variant has had no answer yet.
REFUSED = frozenset({400, 401, 403, 404, 405, 422, 501})
#: ... those of them that every variant would get (key, model name, API path).
REFUSED_EVERYWHERE = frozenset({401, 403, 404, 405, 501})
#: Statuses that ask the client to come back later (with ``Retry-After``).
OVERLOADED = frozenset({429, 503})
MAX_RETRY_AFTER_S = 60.0
RECENT_WINDOW = 20

_HINTS = {
    400: "the server does not take the request the scenario sends",
    404: "check --model (the server's /v1/models lists its models) and the --endpoint URL",
    405: "the URL does not serve chat completions: check the --endpoint URL",
    422: "the server does not take the request the scenario sends",
    501: "the server does not implement chat completions",
}
_EMFILE = os.strerror(errno.EMFILE)  # "Too many open files"


class ServerWatch:
    """One variant's view of its server, fed every answer of every session (in one process)."""

    def __init__(
        self, variant: str, url: str, key_sent: bool = False, window: int = RECENT_WINDOW
    ) -> None:
        self.variant = variant
        self.url = url
        self.key_sent = key_sent  # a 401's advice: give a key, or check the one given
        self.answered = False
        self.recent: deque[Failure | None] = deque(maxlen=window)

    def check(self, failure: Failure | None) -> None:
        """Note one request's outcome; raise when the variant cannot go on."""
        if failure is None:
            self.answered = True
            self.recent.append(None)
            return
        if failure.kind == CANCELLED:
            return
        if failure_verdict(str(failure)).corrupted:  # it answered: bytes that are no text
            self.answered = True
            self.recent.append(None)
            return
        if _EMFILE in failure.message:
            raise InfrastructureError(
                f"variant {self.variant}: the harness ran out of file descriptors "
                f"({failure}); this is the harness's own limit, not the server's: raise "
                "`ulimit -n` or lower --concurrency"
            )
        if failure.kind == "http_status" and failure.status in REFUSED and not self.answered:
            status = failure.status
            raise EndpointRefused(
                f"variant {self.variant}: the first request (POST {self.url}) was refused with "
                f"HTTP {status}: {failure.message.rstrip('. ') or '(no message)'}; "
                f"{self._hint(status)} (retrying cannot fix this)",
                whole_run=status in REFUSED_EVERYWHERE,
            )
        # an HTTP error status is an answer: the server is up (its share of failures is
        # judged at the end); no answer at all (refused, cut, timed out) is what counts here
        self.recent.append(None if failure.status is not None else failure)
        if len(self.recent) == self.recent.maxlen and all(f is not None for f in self.recent):
            raise ServerUnanswering(
                f"the server stopped answering: the last {len(self.recent)} requests all "
                f"failed (the last: {failure})"
            )

    def _hint(self, status: int) -> str:
        return key_advice(status, self.key_sent) if status in (401, 403) else _HINTS[status]


def retry_delay(failure: Failure, backoff_s: float) -> float:
    """How long to wait before sending a failed request again: the backoff, or the server's
    Retry-After (bounded) on 429 and 503 when that is longer."""
    if failure.status in OVERLOADED and failure.retry_after_s is not None:
        return max(backoff_s, min(failure.retry_after_s, MAX_RETRY_AFTER_S))
    return backoff_s
