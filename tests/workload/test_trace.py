from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import ConfigError
from harness.workload.trace import convert_log, load_trace

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "List the files."}
CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
}
RESULT = {"role": "tool", "tool_call_id": "c1", "content": "a.py b.py"}
ANSWER = {"role": "assistant", "content": "Two files: a.py and b.py."}


def _write(tmp_path: Path, *docs: object) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def test_turns_are_the_history_before_each_assistant_message(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        {"id": "x", "messages": [SYSTEM, USER, CALL, RESULT, ANSWER], "offsets_s": [0, 3.5]},
    )
    (conv,) = load_trace(path)
    turns = conv.turns()
    assert [t.index for t in turns] == [2, 4]
    assert list(turns[0].history) == [SYSTEM, USER]
    assert list(turns[1].history) == [SYSTEM, USER, CALL, RESULT]
    assert turns[1].recorded == ANSWER
    assert [t.offset_s for t in turns] == [0.0, 3.5]


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "needs a 'role'"),
        ({"messages": [USER]}, "no assistant turn"),
        ({"messages": [USER, {"role": "tool", "content": "x"}, ANSWER]}, "without 'tool_call_id'"),
        ({"messages": [USER, ANSWER], "offsets_s": ["soon"]}, "list of numbers"),
    ],
)
def test_bad_trace_lines_name_the_line(tmp_path: Path, doc: object, message: str) -> None:
    path = _write(tmp_path, {"messages": [USER, ANSWER]}, doc)
    with pytest.raises(ConfigError, match=message) as exc:
        load_trace(path)
    assert f"{path}:2" in str(exc.value)


def test_request_log_is_grouped_into_conversations() -> None:
    other = {"role": "user", "content": "Unrelated question"}
    log = [
        {"request": {"messages": [SYSTEM, USER]}, "time": 100.0},
        {
            "request": {"messages": [other]},
            "response": {"choices": [{"message": ANSWER}]},
            "time": 101.0,
        },
        {
            "request": {"messages": [SYSTEM, USER, CALL, RESULT]},
            "time": 104.0,
            "response": {"choices": [{"message": ANSWER}]},
        },
    ]
    traces = list(convert_log(json.dumps(d) for d in log))
    assert len(traces) == 2
    first = next(t for t in traces if t["messages"][0] == SYSTEM)
    assert first["messages"] == [SYSTEM, USER, CALL, RESULT, ANSWER]
    assert first["offsets_s"] == [0.0, 4.0]
    second = next(t for t in traces if t["messages"][0] == other)
    assert second["messages"] == [other, ANSWER]
