"""Strict JSON for tool-call arguments: nesting is bounded, said as invalid JSON."""

from __future__ import annotations

import pytest

from harness.dialects.jsonstrict import (
    INVALID,
    MAX_DEPTH,
    StrictJSONError,
    loads_strict,
    raw_decode_strict,
)
from harness.verdict.toolcheck import check_server_calls


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_nesting_up_to_the_limit_is_taken() -> None:
    assert loads_strict(nested(MAX_DEPTH)) == loads_strict(nested(MAX_DEPTH))
    # brackets inside strings are text, not nesting
    assert loads_strict('{"a": "' + "[" * 10_000 + '"}') == {"a": "[" * 10_000}


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 10_000, 100_000])
def test_nesting_deeper_than_the_limit_is_invalid_json(depth: int) -> None:
    with pytest.raises(StrictJSONError) as caught:
        loads_strict('{"path": ' + nested(depth) + "}")
    assert caught.value.kind == INVALID
    assert caught.value.message == f"nested deeper than {MAX_DEPTH} levels"
    with pytest.raises(StrictJSONError, match="nested deeper"):
        raw_decode_strict(nested(depth), 0)


def test_a_server_call_nested_10000_deep_is_a_problem_not_an_exception() -> None:
    call = {"function": {"name": "read_file", "arguments": '{"path": ' + nested(10_000) + "}"}}
    (problem,) = check_server_calls([call], None)
    assert "nested deeper than" in problem.message
