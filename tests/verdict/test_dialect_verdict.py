"""The verdict and the dialect: markup of any known dialect, think tags in arguments, schemas
that cannot be used (a remote $ref is never fetched, a rejected schema keeps the line)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from harness import labels as L
from harness.dialects import dsml, hermes
from harness.dialects.base import ToolCall
from harness.sim.speaker import speaker, spoken
from harness.verdict import classify_text, classify_turn
from harness.verdict.batch import classify_stream

CALL = ToolCall("list_dir", {"path": "src"})
WRITE = ToolCall("write_file", {"path": "a.py", "content": "x = '<think>'\nprint('</think>')\n"})


def test_hermes_markup_in_content_is_a_leak_when_dsml_was_expected() -> None:
    content = hermes.encode_turn("Let me look.", [CALL], eos=False)
    v = classify_turn(content, dialect="dsml-v4", source="server")
    assert v.label == L.PARSER_LEAK
    assert v.evidence["dialect"] == "hermes"
    assert "hermes" in v.evidence["reason"]
    assert v.tool_calls == [CALL.to_dict()]


def test_a_near_miss_of_another_dialect_is_malformed() -> None:
    content = hermes.encode_turn("Let me look.", [CALL], eos=False)[:-4]  # the closer cut
    v = classify_turn(content, dialect="dsml-v4", source="server")
    assert v.label == L.MALFORMED_TOOL_CALL
    assert v.evidence["dialect"] == "hermes"


def test_dsml_markup_is_a_leak_when_hermes_was_expected() -> None:
    content = dsml.encode_turn("Let me look.", [CALL]).removesuffix(dsml.EOS)
    v = classify_turn(content, dialect="hermes", source="server")
    assert v.label == L.PARSER_LEAK
    assert v.evidence["dialect"].startswith("dsml")


def test_raw_output_in_another_dialect_is_not_a_call_of_the_expected_one() -> None:
    v = classify_turn(hermes.encode_turn("Look.", [CALL]), dialect="dsml-v4", source="raw")
    assert v.label == L.MALFORMED_TOOL_CALL
    assert "where dsml-v4 was expected" in v.evidence["reason"]


def test_no_dialect_leaves_markup_as_content() -> None:
    content = hermes.encode_turn("Let me look.", [CALL], eos=False)
    assert classify_turn(content, dialect="none").label == L.OK_TEXT


@pytest.mark.parametrize("encode", [dsml.encode_turn, hermes.encode_turn])
def test_think_tags_inside_an_argument_are_literals(encode: Any) -> None:
    v = classify_text(encode("Writing the file.", [WRITE]))
    assert v.label == L.OK_TOOL_CALL, v.evidence
    assert v.tool_calls[0]["arguments"]["content"] == WRITE.arguments["content"]


def test_think_tags_in_the_prose_before_the_call_are_still_debris() -> None:
    v = classify_text(hermes.encode_turn("Writing <think> the file.", [WRITE]))
    assert v.label == L.TOKEN_SALAD


class _Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Recorder.hits.append(self.path)
        body = json.dumps({"type": "integer"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def schema_server() -> Iterator[str]:
    """A loopback server that serves a schema and records every request it gets."""
    _Recorder.hits = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _tool(name: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def test_a_remote_ref_is_never_fetched_and_is_reported(schema_server: str) -> None:
    ref = f"{schema_server}/count.json"
    tools = [_tool("count", {"type": "object", "properties": {"n": {"$ref": ref}}})]
    calls = [{"function": {"name": "count", "arguments": '{"n": "not a number"}'}}]
    server = classify_turn("", tool_calls=calls, tools=tools)
    raw = classify_turn(hermes.encode_turn("", [ToolCall("count", {"n": "x"})]), tools=tools,
                        source="raw")  # fmt: skip
    assert _Recorder.hits == []  # the classifier did not go on the network
    for v in (server, raw):
        assert v.label == L.OK_TOOL_CALL  # unchecked, not wrong
        assert any(ref in p and "never fetched" in p for p in v.evidence["schema_problems"])


def test_local_refs_are_resolved() -> None:
    params = {
        "type": "object",
        "$defs": {"count": {"type": "integer"}},
        "properties": {"n": {"$ref": "#/$defs/count"}},
    }
    tools = [_tool("count", params)]
    bad = classify_turn("", tool_calls=[{"name": "count", "arguments": '{"n": "x"}'}], tools=tools)
    good = classify_turn("", tool_calls=[{"name": "count", "arguments": '{"n": 3}'}], tools=tools)
    assert bad.label == L.INVALID_TOOL_CALL
    assert good.label == L.OK_TOOL_CALL
    assert "schema_problems" not in good.evidence


def test_a_schema_the_validator_rejects_keeps_the_line() -> None:
    import io

    tools = [_tool("count", {"type": "objekt"})]
    lines = [
        json.dumps({"id": 1, "text": hermes.encode_turn("", [ToolCall("count", {})]),
                    "tools": tools}),
        json.dumps({"id": 2, "text": "A plain answer."}),
    ]  # fmt: skip
    out = io.StringIO()
    stats = classify_stream(lines, out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert stats.errors == []
    assert [r["id"] for r in rows] == [1, 2]
    assert rows[0]["label"] == L.OK_TOOL_CALL
    assert "not a valid JSON schema" in rows[0]["evidence"]["schema_problems"][0]


def test_classify_dialect_applies_to_lines_without_their_own() -> None:
    import io

    text = dsml.encode_turn("Look.", [CALL])
    lines = [
        json.dumps({"id": "a", "text": text}),
        json.dumps({"id": "b", "text": text, "dialect": "auto"}),
    ]
    out = io.StringIO()
    classify_stream(lines, out, dialect="hermes")
    rows = {r["id"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert rows["a"]["label"] == L.MALFORMED_TOOL_CALL  # DSML where Hermes was expected
    assert rows["b"]["label"] == L.OK_TOOL_CALL


TYPED_TOOLS = [_tool("read_file", {
    "type": "object", "required": ["path"],
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"},
                   "label": {"type": "string"}, "flags": {"type": "array"}}})]  # fmt: skip


@pytest.mark.parametrize("dialect", spoken())
def test_raw_calls_are_typed_by_the_declared_schemas(dialect: str) -> None:
    # a string that looks like a number stays a string where the schema says so
    call = ToolCall("read_file", {"path": "a.py", "limit": 40, "label": "123", "flags": ["x"]})
    text = speaker(dialect).encode("" if speaker(dialect).calls_only else "Reading.", [call])
    v = classify_turn(text, tools=TYPED_TOOLS, source="raw", dialect=dialect)
    assert v.label == L.OK_TOOL_CALL, v.evidence
    assert v.tool_calls == [call.to_dict()]
