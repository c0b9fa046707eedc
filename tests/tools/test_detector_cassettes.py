"""The held-out set's builder (tools.detector.cassettes): recorded responses of each provider's
shape put back together as turns, made-up and unrecorded ones left out, duplicates dropped."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import yaml

from tools.detector import cassettes

OK = {"code": 200, "message": "OK"}


def _sse(events: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def _chat_stream() -> str:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m"}
    call = {"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": ""}}
    return _sse([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let me "}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "check."}}]},
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
        {**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": '{"city": "Lyon"}'}}]}}]},
        {**base, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 7}},
    ])  # fmt: skip


def _anthropic() -> str:
    return json.dumps({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "thinking", "thinking": "The user wants a country."},
                    {"type": "text", "text": "Here is one."},
                    {"type": "tool_use", "id": "tu_1", "name": "return_country",
                     "input": {"name": "France"}}],
        "usage": {"input_tokens": 5, "output_tokens": 9},
    })  # fmt: skip


def _gemini_gz() -> bytes:
    body = {"candidates": [{"content": {"parts": [
        {"text": "Weighing the options.", "thought": True},
        {"text": "Paris is the capital of France."}]}, "index": 0}],
        "usageMetadata": {"totalTokenCount": 12}, "responseId": "r-1",
        "modelVersion": "g-2"}  # fmt: skip
    return gzip.compress(json.dumps(body).encode())


def _responses_api() -> str:
    return json.dumps({
        "id": "resp_1", "object": "response", "model": "gpt-x", "usage": {"total_tokens": 3},
        "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Short."}]},
                   {"type": "message", "content": [{"type": "output_text", "text": "Done."}]}],
    })  # fmt: skip


def _interaction(uri: str, body: Any, status: dict[str, Any] = OK) -> dict[str, Any]:
    return {"request": {"uri": uri, "method": "POST", "body": "{}"},
            "response": {"status": status, "headers": {}, "body": {"string": body}}}  # fmt: skip


def _sdist(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    path = tmp_path / f"{name}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(f"{name}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _cassettes() -> dict[str, bytes]:
    answer = {"index": 0, "message": {"content": "No id, no usage."}}
    unrecorded = json.dumps({"object": "chat.completion", "choices": [answer]})
    one = {"interactions": [
        _interaction("https://api.openai.com/v1/chat/completions", _chat_stream()),
        _interaction("https://api.anthropic.com/v1/messages", _anthropic()),
        _interaction("https://generativelanguage.googleapis.com/v1beta/x", _gemini_gz()),
        _interaction("https://api.openai.com/v1/chat/completions", unrecorded),
        _interaction("https://fake-host.example/v1/messages", _anthropic().replace("one", "two")),
        _interaction("https://api.anthropic.com/v1/messages", '{"type": "error"}',
                     {"code": 500, "message": "Internal"}),
    ]}  # fmt: skip
    # langchain's layout: requests and responses side by side, gzipped, the body as bytes
    two = {"requests": [{"uri": "https://api.openai.com/v1/responses"}] * 2,
           "responses": [{"status": OK, "body": {"string": _responses_api().encode()}},
                         {"status": OK, "body": {"string": _anthropic().encode()}}]}  # fmt: skip
    return {
        "tests/cassettes/test_one.yaml": yaml.safe_dump(one).encode(),
        "tests/cassettes/test_two.yaml.gz": gzip.compress(yaml.safe_dump(two).encode()),
        "tests/data/fixture.yaml": yaml.safe_dump(one).encode(),
    }


def test_each_shape_becomes_a_turn_and_the_rest_is_left_out(tmp_path: Path) -> None:
    _sdist(tmp_path, "pkg_a-1.0", _cassettes())
    rows, stats = cassettes.build({"pkg-a": ("1.0", "proj")}, tmp_path)
    by = {(r["provider"], r["text"]): r for r in rows}
    chat = by[("openai-chat", "Let me check.")]
    assert chat["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Lyon"}'}]
    claude = by[("anthropic", "Here is one.")]
    assert claude["reasoning"] == "The user wants a country."
    assert claude["tool_calls"] == [{"name": "return_country", "arguments": {"name": "France"}}]
    gem = by[("gemini", "Paris is the capital of France.")]
    assert (gem["reasoning"], gem["model"]) == ("Weighing the options.", "g-2")
    assert by[("openai-responses", "Done.")]["reasoning"] == "Short."
    assert len(rows) == 4  # unrecorded, made-up, failed and the second Anthropic copy: out
    c = stats["pkg-a"]
    assert (c["cassettes"], c["fake_endpoint"], c["duplicates"], c["kept"]) == (2, 1, 1, 4)
    assert all(r["source"].startswith("proj:pkg-a/tests/cassettes/") for r in rows)
    assert len({r["id"] for r in rows}) == 4


def test_a_vcr_folder_is_read_and_turns_of_another_set_are_left_out(tmp_path: Path) -> None:
    files = {n.replace("cassettes/", "_vcr/"): b for n, b in _cassettes().items()}
    _sdist(tmp_path, "pkg_b-1.0", files)
    rows, _ = cassettes.build({"pkg-b": ("1.0", "proj")}, tmp_path)
    assert len(rows) == 4
    first = {cassettes._key(rows[0])}
    again, stats = cassettes.build({"pkg-b": ("1.0", "proj")}, tmp_path, first)
    assert len(again) == 3
    assert stats["pkg-b"]["duplicates"] == 2


def test_calls_of_a_whole_message_stay_apart_without_an_index() -> None:
    calls = [{"index": None, "id": f"c{i}", "type": "function",
              "function": {"name": "get_weather", "arguments": f'{{"city": "{city}"}}'}}
             for i, city in enumerate(("Lyon", "Oslo"))]  # fmt: skip
    message = {"content": None, "tool_calls": calls}
    body = {"id": "x", "object": "chat.completion", "usage": {"total_tokens": 1},
            "choices": [{"index": 0, "message": message}]}  # fmt: skip
    (turn,) = cassettes.turns_of(json.dumps(body))
    row = turn.row()
    assert row is not None
    assert row["text"] == ""
    assert [c["arguments"] for c in row["tool_calls"]] == ['{"city": "Lyon"}', '{"city": "Oslo"}']


def test_a_chunk_is_read_by_its_delta_even_with_a_message_beside_it() -> None:
    base = {"id": "x", "object": "chat.completion.chunk"}

    def chunk(index: int, tid: str | None, name: str | None, args: str) -> dict[str, Any]:
        delta = {"tool_calls": [{"index": index, "id": tid,
                                 "function": {"name": name, "arguments": args}}]}  # fmt: skip
        return {**base, "choices": [{"index": 0, "delta": delta, "message": delta}]}

    events = [chunk(0, "a", "f", ""), chunk(0, None, None, "{}"), chunk(1, "b", "g", "{}")]
    (turn,) = cassettes.turns_of(_sse([*events, {**base, "choices": [], "usage": {"n": 1}}]))
    row = turn.row()
    assert row is not None
    assert row["tool_calls"] == [{"name": "f", "arguments": "{}"}, {"name": "g", "arguments": "{}"}]


def test_streamed_calls_without_an_index_stay_apart() -> None:
    plus = {"id": "p", "function": {"name": "plus", "arguments": "{}"}}
    minus = {"id": "m", "function": {"name": "minus", "arguments": "{"}}
    rest = {"function": {"arguments": "}"}}
    base = {"id": "x", "object": "chat.completion.chunk"}
    events = [{**base, "choices": [{"index": 0, "delta": {"tool_calls": calls}}]}
              for calls in ([plus, minus], [rest])]  # fmt: skip
    (turn,) = cassettes.turns_of(_sse([*events, {**base, "choices": [], "usage": {"n": 1}}]))
    row = turn.row()
    assert row is not None
    assert [(c["name"], c["arguments"]) for c in row["tool_calls"]] == [
        ("plus", "{}"), ("minus", "{}")]  # fmt: skip


def test_two_messages_of_one_response_are_two_paragraphs() -> None:
    msg = {"type": "message", "content": [{"type": "output_text", "text": "{}"}]}
    body = {"id": "r", "object": "response", "usage": {}, "output": [msg, msg]}
    (turn,) = cassettes.turns_of(json.dumps(body))
    assert "".join(turn.text) == "{}\n\n{}"


def test_the_command_writes_jsonl_the_benchmark_reads(tmp_path: Path) -> None:
    _sdist(tmp_path, "magentic-" + cassettes.SDISTS["magentic"][0], _cassettes())
    out = tmp_path / "turns.jsonl"
    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, "-m", "tools.detector.cassettes", str(out), "--cache", str(tmp_path),
           "--only", "magentic"]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["source"].split(":")[0] for r in rows} == {"magentic"}
    bench = [sys.executable, "benchmarks/agent_turns.py", str(out), "--corrupt", "0",
             "--out", str(tmp_path / "r.json")]  # fmt: skip
    done = subprocess.run(bench, cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["healthy"]["magentic"]["turns"] == len(rows) == 4
    assert result["healthy"]["all"]["suspect"]["k"] == 0


def test_an_unknown_package_is_a_one_line_error(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tools.detector.cassettes", str(tmp_path / "o.jsonl"),
           "--only", "nosuch"]  # fmt: skip
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "not in set 1: nosuch" in done.stderr.strip().splitlines()[-1]
