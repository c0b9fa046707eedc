"""The V4 and V3.2 prompt encoders against DeepSeek's reference outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.dialects.prompt_v4 import render_v4, render_v32
from harness.errors import UsageError

GOLDEN = Path(__file__).parent.parent / "data" / "dsv4_encoding"
V32_REFERENCE = Path(__file__).parent / "data" / "v32_reference.json"


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_v4_matches_golden_files_byte_for_byte(n: int) -> None:
    inp = json.loads((GOLDEN / f"test_input_{n}.json").read_text(encoding="utf-8"))
    expected = (GOLDEN / f"test_output_{n}.txt").read_text(encoding="utf-8")
    got = render_v4(inp["messages"], inp["tools"]) if isinstance(inp, dict) else render_v4(inp)
    assert got == expected


@pytest.mark.parametrize("mode", ["thinking", "chat"])
def test_v32_matches_reference_encoder(mode: str) -> None:
    # Output of DeepSeek's V3.2 reference encoder (encode_messages) for this conversation:
    # tools on the system message, two calls with tricky values, two tool results.
    ref = json.loads(V32_REFERENCE.read_text(encoding="utf-8"))
    assert render_v32(ref["messages"], thinking=mode == "thinking") == ref[mode]


def test_v4_generation_prompt_after_tool_results() -> None:
    calls = [
        {"id": "a", "function": {"name": "f", "arguments": "{}"}},
        {"id": "b", "function": {"name": "g", "arguments": '{"x": 1}'}},
    ]
    msgs = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "tool", "tool_call_id": "a", "content": "A"},
    ]
    prompt = render_v4(msgs)
    assert prompt.endswith(
        "<｜User｜><tool_result>A</tool_result>\n\n<tool_result>B</tool_result>"
        "<｜Assistant｜><think>"
    )
    assert render_v4(msgs, thinking=False).endswith("<｜Assistant｜></think>")


def test_unknown_role_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="role"):
        render_v4([{"role": "narrator", "content": "x"}])
