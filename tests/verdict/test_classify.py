"""``harness classify``: JSONL in, one verdict line per valid input line, errors by line."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from harness.cli import main as cli
from harness.dialects import dsml, hermes
from harness.dialects.base import ToolCall
from harness.verdict.batch import classify_files, classify_stream

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]
CALL = ToolCall("read_file", {"path": "src/a.py"})


def _lines(*records: Any) -> list[str]:
    return [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]


def _run(*records: Any) -> tuple[list[dict[str, Any]], Any]:
    out = io.StringIO()
    stats = classify_stream(_lines(*records), out)
    return [json.loads(line) for line in out.getvalue().splitlines()], stats


def test_raw_outputs_are_labelled() -> None:
    good = dsml.encode_turn("Reading it.", [CALL])
    broken = good.replace("tool_calls>", "toolcalls>", 1)
    wrong_args = dsml.encode_turn("Reading it.", [ToolCall("read_file", {"file": "x"})])
    rows, stats = _run(
        {"id": "good", "text": good, "tools": TOOLS},
        {"id": "broken", "text": broken, "tools": TOOLS},
        {"id": "schema", "text": wrong_args, "tools": TOOLS},
        {"id": "hermes", "text": hermes.encode_turn("ok", [CALL]), "dialect": "hermes"},
        {"id": "text", "text": "The answer is 4."},
    )
    by_id = {r["id"]: r for r in rows}
    assert [r["id"] for r in rows] == ["good", "broken", "schema", "hermes", "text"]
    assert by_id["good"]["label"] == "ok_tool_call"
    assert by_id["good"]["corrupted"] is False
    assert by_id["good"]["tool_calls"] == [{"name": "read_file", "arguments": {"path": "src/a.py"}}]
    assert by_id["broken"]["label"] == "malformed_tool_call"
    assert by_id["broken"]["corrupted"] is True
    assert by_id["broken"]["evidence"]["offset"] == broken.index("<\uff5cDSML\uff5ctoolcalls>")
    assert by_id["schema"]["label"] == "invalid_tool_call"
    assert by_id["text"]["label"] == "ok_text"
    assert stats.classified == 5
    assert stats.errors == []
    assert stats.labels["ok_tool_call"] >= 1
    for row in rows:
        assert set(row) == {
            "id",
            "label",
            "corrupted",
            "tier",
            "why",
            "threshold",
            "noncanonical",
            "tool_calls",
            "evidence",
        }


def test_server_source_checks_the_server_calls() -> None:
    rows, _ = _run(
        {
            "id": "s1",
            "text": "",
            "source": "server",
            "tools": TOOLS,
            "tool_calls": [{"name": "read_file", "arguments": '{"path": "a"}{"path": "a"}'}],
        },
        {
            "id": "s2",
            "text": "",
            "source": "server",
            "tools": TOOLS,
            "tool_calls": [{"name": "read_file", "arguments": '{"path": "a"}'}],
        },
    )
    assert rows[0]["label"] == "invalid_tool_call"
    assert rows[0]["corrupted"] is True
    assert rows[1]["label"] == "ok_tool_call"


def test_malformed_lines_are_reported_and_the_rest_classified() -> None:
    rows, stats = _run(
        "not json",
        {"text": "no id"},
        {"id": "x", "text": "fine"},
        "",
        {"id": "y", "text": "t", "dialect": "klingon"},
        {"id": "z", "text": "t", "source": "disk"},
        {"id": "w", "text": 5},
        {"id": "v", "text": "t", "tool_calls": "read_file"},
    )
    assert [r["id"] for r in rows] == ["x"]
    assert stats.lines == 7
    assert stats.classified == 1
    assert [e.split(":")[0] for e in stats.errors] == [
        "line 1",
        "line 2",
        "line 5",
        "line 6",
        "line 7",
        "line 8",
    ]
    assert "not valid JSON" in stats.errors[0]
    assert '"id"' in stats.errors[1]
    assert "dialect" in stats.errors[2]


def test_cli_with_files(tmp_path: Path, capsys: Any) -> None:
    src = tmp_path / "in.jsonl"
    dst = tmp_path / "out.jsonl"
    src.write_text("\n".join(_lines({"id": "a", "text": "hi"}, "{broken")) + "\n", encoding="utf-8")
    code = cli.main(["classify", str(src), "-o", str(dst)])
    assert code == 2  # a bad line is bad input
    assert "line 2" in capsys.readouterr().err
    assert [json.loads(x)["id"] for x in dst.read_text(encoding="utf-8").splitlines()] == ["a"]
    stats = classify_files(src, tmp_path / "out2.jsonl")
    assert stats.classified == 1


def test_each_verdict_says_why_with_the_threshold_beside_the_score() -> None:
    lines = [
        {"id": "ok", "text": "Tomorrow in Paris it will be sunny, with a high of 21 degrees."},
        {"id": "salad", "text": "Par 设置 데이터 ->मेंToString()المwrite_through скийする фيщий"},
        {"id": "think", "text": "<think>Let me think it over.</think>Here is the whole answer."},
        {"id": "bad", "text": '<tool_call>\n{"name": "f", "arguments": {"a": 1}\n</tool_call>'},
    ]
    out = io.StringIO()
    classify_stream([json.dumps(x) for x in lines], out)
    got = {d["id"]: d for d in map(json.loads, out.getvalue().splitlines())}
    assert all(d["threshold"] == 0.7 for d in got.values())
    assert got["ok"]["why"].startswith("no sign of corruption: text score ")
    assert "(threshold 0.7)" in got["ok"]["why"]
    assert got["salad"]["tier"] == "suspect"
    assert "token salad" in got["salad"]["why"]
    assert "strongest signals" in got["salad"]["why"]
    assert "reasoning in the content (think) judged apart" in got["think"]["why"]
    assert got["bad"]["tier"] == "structural"
    assert got["bad"]["why"] == got["bad"]["evidence"]["reason"] + (
        f" from character {got['bad']['evidence']['offset']}"
    )
