"""Server tool_calls and parsed calls checked against the declared tools."""

from __future__ import annotations

import pytest

from harness.dialects.base import ToolCall
from harness.verdict import toolcheck as tc

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        },
    },
    {"name": "get_time"},  # bare definition, no schema: any object
]


def _server(name: str, arguments: str) -> dict[str, object]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


@pytest.mark.parametrize(
    ("call", "kind"),
    [
        (_server("read_file", '{"path": "a.py"}'), None),
        ({"name": "read_file", "arguments": '{"path": "a.py", "limit": 3}'}, None),
        (_server("get_time", "{}"), None),
        (_server("get_time", '{"anything": [1]}'), None),
        (_server("delete_all", "{}"), tc.UNKNOWN_TOOL),
        (_server("", "{}"), tc.MISSING_NAME),
        (_server("read_file", '{"path": "a.py"'), tc.INVALID_JSON),
        (_server("read_file", ""), tc.SCHEMA),  # "" is no arguments: this tool needs one
        (_server("read_file", '{"path": NaN}'), tc.INVALID_JSON),
        (_server("read_file", '{"path": "a.py"}{"path": "a.py"}'), tc.CONCATENATED_JSON),
        (_server("read_file", '{"path": "a.py", "path": "b.py"}'), tc.DUPLICATE_KEY),
        (_server("read_file", '["a.py"]'), tc.NOT_AN_OBJECT),
        (_server("read_file", "{}"), tc.SCHEMA),  # the silent zero-argument call
        (_server("read_file", '{"path": 3}'), tc.SCHEMA),
        (_server("read_file", '{"path": "a", "mode": "w"}'), tc.SCHEMA),
    ],
)
def test_check_server_calls(call: dict[str, object], kind: str | None) -> None:
    problems = tc.check_server_calls([call], TOOLS)
    assert [p.kind for p in problems][:1] == ([kind] if kind else [])
    for p in problems:
        assert p.index == 0
        assert p.message


def test_no_tools_declared_checks_json_only() -> None:
    assert tc.check_server_calls([_server("anything", '{"x": 1}')], None) == []
    assert tc.check_server_calls([_server("anything", "{x}")], None)[0].kind == tc.INVALID_JSON
    assert tc.check_server_calls([_server("anything", "{}")], [])[0].kind == tc.UNKNOWN_TOOL


def test_check_calls_parsed_from_text() -> None:
    calls = [ToolCall("read_file", {"path": "a"}), ToolCall("read_file", {"limit": "x"})]
    problems = tc.check_calls(calls, TOOLS)
    assert {p.index for p in problems} == {1}
    assert all(p.kind == tc.SCHEMA for p in problems)
    assert tc.check_calls([ToolCall("nope", {})], TOOLS)[0].kind == tc.UNKNOWN_TOOL


def test_an_invalid_schema_is_reported_not_raised() -> None:
    # the call cannot be judged against it: no problem with the call, the schema is named
    bad = [{"name": "f", "parameters": {"type": "objekt"}}]
    assert tc.check_calls([ToolCall("f", {})], bad) == []
    assert "'f' is not a valid JSON schema" in tc.schema_problems(bad)[0]


def test_validators_are_cached() -> None:
    tc.check_calls([ToolCall("read_file", {"path": "a"})], TOOLS)
    n = len(tc._VALIDATORS)
    tc.check_calls([ToolCall("read_file", {"path": "b"})], TOOLS)
    assert len(tc._VALIDATORS) == n


def test_an_empty_arguments_string_is_no_arguments_checked_against_the_schema() -> None:
    # a tool without parameters: several servers send "" for its arguments; nothing is wrong
    assert tc.check_server_calls([_server("get_time", "")], TOOLS) == []
    assert tc.check_server_calls([_server("get_time", "  ")], None) == []
    # a tool that requires an argument: "" is a call that lost it
    problems = tc.check_server_calls([_server("read_file", "")], TOOLS)
    assert [p.kind for p in problems] == [tc.SCHEMA]
    assert "'path' is a required property" in problems[0].message
