"""Raw mode: prompts rendered by the harness, raw DSML parsed by the harness, the sim's raw
endpoints answering like its chat endpoint, and the chat-vs-raw comparison."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from harness import labels as L
from harness.analysis.rawcompare import compare_records, judge_pair
from harness.client.chat import ChatClient
from harness.client.output import TurnOutput
from harness.client.raw import (
    PATHS,
    RawClient,
    check_api,
    check_rendering,
    finish_raw,
    raw_payload,
)
from harness.dialects import dsml
from harness.dialects.prompt_v4 import render_v4
from harness.drive.raw_session import visible
from harness.errors import UsageError
from harness.sim.cache import hash_prompt
from harness.sim.raw import decode_v4
from harness.verdict import classify_turn
from tests.sim.common import TOOLS


def _call(cid: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
    fn = {"name": name, "arguments": json.dumps(args)}
    return {"id": cid, "type": "function", "function": fn}


CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Look around the repository in 4 steps."},
    {
        "role": "assistant",
        "content": "I'll look.",
        "tool_calls": [_call("a", "list_dir", {"path": "."})],
    },
    {"role": "tool", "tool_call_id": "a", "content": "src/\nREADME.md"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            _call("b", "read_file", {"path": "README.md", "max_lines": 20}),
            _call("c", "list_dir", {"path": "src"}),
        ],
    },
    {"role": "tool", "tool_call_id": "b", "content": "# Project\nA tool."},
    {"role": "tool", "tool_call_id": "c", "content": "main.py"},
]


def test_decode_v4_gives_back_what_the_sim_hashes() -> None:
    prompt = render_v4(CONVERSATION, TOOLS)
    messages, tools = decode_v4(prompt)
    assert [m["role"] for m in messages] == [m["role"] for m in CONVERSATION]
    want = hash_prompt(CONVERSATION, orjson.dumps(TOOLS))
    got = hash_prompt(messages, orjson.dumps(tools))
    assert got.chain == want.chain
    # a tool result followed by a user turn (folded into one V4 user turn) splits back
    more = [
        *CONVERSATION,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Again"},
    ]
    messages, _ = decode_v4(render_v4(more, TOOLS))
    assert [m["role"] for m in messages[-2:]] == ["assistant", "user"]
    assert messages[-1]["content"] == "Again"


def test_payloads_and_api_checks() -> None:
    body = {"messages": [], "temperature": 0.0, "max_tokens": 64, "seed": 5}
    assert raw_payload("completions", "P", body) == {
        "prompt": "P",
        "temperature": 0.0,
        "max_tokens": 64,
        "seed": 5,
        "skip_special_tokens": False,  # the DSML and think marks kept in the text
    }
    assert raw_payload("generate", "P", body) == {
        "text": "P",
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": 64,
            "sampling_seed": 5,
            "skip_special_tokens": False,
        },
    }
    check_api("generate", "dsml-v32")
    with pytest.raises(UsageError, match="dsml-v4"):
        check_api("completions", "hermes")
    with pytest.raises(UsageError, match="--api"):
        check_api("responses", "dsml-v4")


def test_finish_raw_puts_back_the_trimmed_end_token_and_splits_reasoning() -> None:
    block = dsml.encode_turn("", [{"name": "list_dir", "arguments": {"path": "."}}], eos=False)
    out = finish_raw(
        TurnOutput(content="thinking...</think>" + block, finish_reason="stop"), "x<think>"
    )
    assert out.reasoning == "thinking..."
    assert out.content == block + dsml.EOS
    verdict = classify_turn(out.content, tools=TOOLS, dialect="dsml-v4", source="raw")
    assert verdict.label == L.OK_TOOL_CALL
    assert not verdict.noncanonical
    cut = finish_raw(TurnOutput(content=block[:40], finish_reason="length"), "x</think>")
    assert not cut.content.endswith(dsml.EOS)
    shown = visible(TurnOutput(content="Let me see." + block + dsml.EOS, source="raw"))
    assert shown.content == "Let me see."


@pytest.mark.parametrize("api", ["completions", "generate"])
@pytest.mark.parametrize("stream", [False, True])
async def test_sim_raw_endpoint_answers_like_chat(
    make_sim: Callable[..., str], api: str, stream: bool
) -> None:
    url = make_sim(fault_scale=0.0)
    client = ChatClient(url, model="sim")
    try:
        body = {"messages": CONVERSATION, "tools": TOOLS, "max_tokens": 512, "seed": 11}
        chat = await client.chat(body, stream=stream)
        raw = await RawClient(client, api, "dsml-v4").chat(body, stream=stream)
    finally:
        await client.aclose()
    assert chat.failure is None, chat.failure
    assert raw.failure is None, raw.failure
    assert raw.source == "raw"
    assert raw.tool_calls == []
    assert dsml.MARK in raw.content  # the raw DSML, not parsed by the server
    verdict = classify_turn(raw.content, tools=TOOLS, dialect="dsml-v4", source="raw")
    assert verdict.label == L.OK_TOOL_CALL
    server = [{"name": c["name"], "arguments": json.loads(c["arguments"])} for c in chat.tool_calls]
    assert verdict.tool_calls == server
    assert raw.prompt_tokens == chat.prompt_tokens
    assert raw.prompt_tokens
    assert raw.completion_tokens


async def test_sim_raw_endpoint_rejects_a_missing_prompt(make_sim: Callable[..., str]) -> None:
    client = ChatClient(make_sim(), model="sim")
    try:
        out = await client.raw("/generate", {"sampling_params": {}}, stream=False)
    finally:
        await client.aclose()
    assert out.failure is not None
    assert out.status == 400
    assert "'text'" in out.failure.message


def _rec(turn: int, label: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "variant": "v",
        "repeat": 0,
        "session": 0,
        "turn": turn,
        "attempt": 0,
        "label": label,
        "tool_calls": calls,
    }


def test_compare_tells_server_parser_from_model() -> None:
    good = [{"name": "read_file", "arguments": {"path": "a"}}]
    assert judge_pair(_rec(0, L.PARSER_LEAK, []), _rec(0, L.OK_TOOL_CALL, good)) == "server_parser"
    empty = [{"name": "read_file", "arguments": "{}"}]
    assert (
        judge_pair(_rec(0, L.OK_TOOL_CALL, empty), _rec(0, L.OK_TOOL_CALL, good)) == "server_parser"
    )
    assert judge_pair(_rec(0, L.OK_TOOL_CALL, []), _rec(0, L.OK_TOOL_CALL, good)) == "server_parser"
    assert judge_pair(_rec(0, L.TOKEN_SALAD, []), _rec(0, L.TOKEN_SALAD, [])) == "model"
    assert judge_pair(_rec(0, L.OK_TOOL_CALL, good), _rec(0, L.OK_TOOL_CALL, good)) == "same"
    chat = [_rec(0, L.OK_TOOL_CALL, good), _rec(1, L.PARSER_LEAK, []), _rec(2, L.OK_TEXT, [])]
    raw = [_rec(0, L.OK_TOOL_CALL, good), _rec(1, L.OK_TOOL_CALL, good)]
    summary = compare_records(chat, raw)  # type: ignore[arg-type]
    assert summary["paired"] == 2
    assert summary["unpaired"] == 1
    assert summary["verdicts"] == {"same": 1, "server_parser": 1}
    assert summary["verdict"].startswith("the server's tool-call parser: 1 of 2 paired turns")
    assert summary["examples"][0]["turn"] == 1
    both = compare_records(
        [*chat, _rec(3, L.TOKEN_SALAD, [])],
        [*raw, _rec(3, L.TOKEN_SALAD, [])],  # type: ignore[list-item]
    )
    assert "parser: 1 of 3" in both["verdict"]
    assert "and the model: 1 of 3" in both["verdict"]
    assert compare_records([], [])["verdict"].startswith("nothing to compare")


@pytest.mark.parametrize("api", ["completions", "generate"])
async def test_the_sim_strips_special_tokens_unless_asked_not_to(
    make_sim: Callable[..., str], api: str
) -> None:
    """As upstream servers: a raw request without ``skip_special_tokens: false`` gets its
    DSML and think marks stripped; the harness's raw client asks for them."""
    url = make_sim(fault_scale=0.0)
    client = ChatClient(url, model="sim")
    raw = RawClient(client, api, "dsml-v4")
    body = {"messages": CONVERSATION, "tools": TOOLS, "max_tokens": 512, "seed": 11}
    try:
        kept = await raw.chat(body, stream=False)
        payload = raw_payload(api, render_v4(CONVERSATION, TOOLS), body)
        payload.pop("skip_special_tokens", None)
        payload.get("sampling_params", {}).pop("skip_special_tokens", None)
        stripped = await client.raw(PATHS[api], payload, stream=False)
    finally:
        await client.aclose()
    assert dsml.MARK in kept.content
    ok = classify_turn(kept.content, tools=TOOLS, dialect="dsml-v4", source="raw")
    assert ok.label == L.OK_TOOL_CALL
    assert stripped.failure is None
    assert dsml.MARK not in stripped.content
    assert "invoke" in stripped.content  # the same answer, its marks gone
    bad = classify_turn(stripped.content, tools=TOOLS, dialect="dsml-v4", source="raw")
    assert bad.label != L.OK_TOOL_CALL


@pytest.mark.parametrize("bos", ["keep", "add"])
async def test_the_rendering_is_checked_against_the_chat_path(
    make_sim: Callable[..., str], bos: str
) -> None:
    """Same prompt_tokens both ways; a server that adds its own BOS makes one token more,
    and the raw client then leaves the rendered BOS out."""
    url = make_sim(fault_scale=0.0, raw_add_bos=bos == "add")
    client = ChatClient(url, model="sim")
    raw = RawClient(client, "generate", "dsml-v4")
    body = {"messages": CONVERSATION, "tools": TOOLS, "max_tokens": 1}
    try:
        result = await check_rendering(raw, body)
        after = await raw.chat({**body, "max_tokens": 64}, stream=False)
        chat = await client.chat({**body, "max_tokens": 64}, stream=False)
    finally:
        await client.aclose()
    assert result["ok"] is True, result
    assert result["drop_bos"] is (bos == "add")
    assert raw.drop_bos is (bos == "add")
    assert "double BOS" in result["message"] if bos == "add" else "agree" in result["message"]
    assert after.prompt_tokens == chat.prompt_tokens


async def test_a_rendering_that_differs_is_said_plainly(make_sim: Callable[..., str]) -> None:
    url = make_sim(fault_scale=0.0)
    client = ChatClient(url, model="sim")
    raw = RawClient(client, "completions", "dsml-v4")
    raw.prompt = lambda body: render_v4(body["messages"], None)  # type: ignore[method-assign]
    try:  # (a rendering that forgets the tools)
        result = await check_rendering(raw, {"messages": CONVERSATION, "tools": TOOLS})
    finally:
        await client.aclose()
    assert result["ok"] is False
    assert result["raw_prompt_tokens"] < result["chat_prompt_tokens"]
    assert "the prompt the harness renders is" in result["message"]
