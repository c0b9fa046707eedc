"""The turn-label vocabulary, shared by the verdict, the records and the report."""

from __future__ import annotations

OK_TOOL_CALL = "ok_tool_call"
OK_TEXT = "ok_text"
PARSER_LEAK = "parser_leak"
MALFORMED_TOOL_CALL = "malformed_tool_call"
INVALID_TOOL_CALL = "invalid_tool_call"
TOKEN_SALAD = "token_salad"
REPETITION = "repetition"
EMPTY = "empty"
TRUNCATED = "truncated"
TRANSPORT_ERROR = "transport_error"

ALL_LABELS = (
    OK_TOOL_CALL,
    OK_TEXT,
    PARSER_LEAK,
    MALFORMED_TOOL_CALL,
    INVALID_TOOL_CALL,
    TOKEN_SALAD,
    REPETITION,
    EMPTY,
    TRUNCATED,
    TRANSPORT_ERROR,
)

#: Labels that count as corruption of the model's output.
CORRUPTED_LABELS = frozenset({MALFORMED_TOOL_CALL, INVALID_TOOL_CALL, TOKEN_SALAD, REPETITION})


def is_corrupted(label: str) -> bool:
    return label in CORRUPTED_LABELS


#: The failure kind of a request the harness itself stopped (Ctrl-C, a signal, the run timeout,
#: a variant stopped): the server is not to blame, so it is not a transport error.
CANCELLED = "cancelled"


def server_failure(transport_error: str | None) -> bool:
    """Whether a record's ``transport_error`` text is a failure of the server's (not a
    request the harness cancelled)."""
    return bool(transport_error) and not str(transport_error).startswith(CANCELLED + ":")
