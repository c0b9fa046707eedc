"""The history encoder: the very bytes of the whole-body encoder, each message encoded once."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.record import safejson
from harness.record.payload import HistoryEncoder
from harness.record.transcripts import chat_payload
from harness.workload.scenario import load_scenario
from harness.workload.tools import run_tool

TOOLS = load_scenario().openai_tools()

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
message = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": text}),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.one_of(st.none(), text),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": text,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": text, "arguments": text}),
                    }
                ),
                max_size=3,
            ),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": text, "content": text}),
)


def old(body: dict[str, Any], stream: bool) -> bytes:
    """The encoder before the history cache: the whole payload at once."""
    payload = dict(body, model=body.get("model", "m"), stream=stream)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return safejson.dumps(payload)


def body_of(messages: list[dict[str, Any]], seed: int, tools: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": messages, "temperature": 0.6, "max_tokens": 512}
    body["seed"] = seed
    if tools:
        body["tools"] = TOOLS
    return body


@settings(max_examples=150, deadline=None)
@given(
    turns=st.lists(st.lists(message, min_size=1, max_size=4), min_size=1, max_size=6),
    stream=st.booleans(),
    tools=st.booleans(),
)
def test_a_growing_history_is_encoded_to_the_same_bytes(
    turns: list[list[dict[str, Any]]], stream: bool, tools: bool
) -> None:
    encoder = HistoryEncoder()
    history: list[dict[str, Any]] = []
    for i, added in enumerate(turns):
        history.extend(added)
        body = body_of(history, i, tools)
        assert chat_payload(body, "m", stream, encoder) == old(body, stream)
        assert chat_payload(body, "m", stream) == old(body, stream)


def test_a_coding_session_history_with_tool_results() -> None:
    """Realistic turns: the fake tools' code and listings, non-ASCII, escapes."""
    encoder = HistoryEncoder()
    history: list[dict[str, Any]] = [
        {"role": "system", "content": 'You are a coding agent.\n\tTabs, "quotes", ünïcödé 🐍'},
        {"role": "user", "content": "Fix the cache eviction race."},
    ]
    for turn, kind in enumerate(["read_file", "search", "run_tests", "list_dir", "read_file"]):
        call = {"id": f"call_0_{turn}_0", "type": "function",
                "function": {"name": kind, "arguments": '{"path": "src/ü.py"}'}}  # fmt: skip
        history.append({"role": "assistant", "content": None, "tool_calls": [call]})
        args = {"path": "src/a.py", "query": "evict"}
        result = run_tool(kind, args, seed=turn, budget_tokens=800)
        history.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        body = body_of(history, 7)
        assert chat_payload(body, "m", True, encoder) == old(body, True)


def test_a_history_that_is_not_the_one_before_is_encoded_again() -> None:
    """A replaced or shortened history (a fork takes a copy, a slot is handed on) is not
    served from the cache of the old one."""
    encoder = HistoryEncoder()
    a = [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}]
    assert chat_payload(body_of(a, 1), "m", True, encoder) == old(body_of(a, 1), True)
    b = copy.deepcopy(a)
    b[1]["content"] = "deux"  # an equal-looking history of other objects
    assert chat_payload(body_of(b, 1), "m", True, encoder) == old(body_of(b, 1), True)
    c = b[:1]
    assert chat_payload(body_of(c, 1), "m", False, encoder) == old(body_of(c, 1), False)
    assert chat_payload(body_of([], 1), "m", False, encoder) == old(body_of([], 1), False)


def test_a_message_orjson_cannot_encode_falls_back_to_the_whole_body_encoder() -> None:
    """A lone surrogate in a model's arguments: the whole body goes escaped, as before."""
    encoder = HistoryEncoder()
    history = [
        {"role": "user", "content": "caf\u00e9"},
        {"role": "assistant", "content": "bad \ud800 half"},
    ]
    body = body_of(history, 1)
    assert encoder.encode(dict(body, model="m", stream=True)) is None
    sent = chat_payload(body, "m", True, encoder)
    assert sent == old(body, True)
    assert b"\\u00e9" in sent  # all ASCII, as the fallback writes it
    history.append({"role": "user", "content": "next"})
    assert chat_payload(body, "m", True, encoder) == old(body, True)


def test_a_payload_without_leading_messages_is_left_to_the_whole_body_encoder() -> None:
    encoder = HistoryEncoder()
    assert encoder.encode({"model": "m", "messages": []}) is None
    assert encoder.encode({"prompt": "x"}) is None
    assert encoder.encode({"messages": ["not a dict"]}) is None
