"""The stream reader: the same output whatever the reads, and its stops."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from typing import Any

import msgspec
import pytest

from harness.client.output import TurnOutput
from harness.client.sse import ChatEvents


def _event(delta: dict[str, Any] | None = None, **top: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    return b"data: " + json.dumps({"id": "x", "choices": choices, **top}).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
STREAM = [
    _event({"role": "assistant", "content": ""}),
    *(_event({"reasoning_content": w}) for w in ("Look ", "first", "\n")),
    *(_event({"content": w}) for w in ("Reading ", "the \u00e9 file.")),
    _event(
        {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "read", "arguments": ""}}]}
    ),
    *(
        _event({"tool_calls": [{"index": 0, "function": {"arguments": a}}]})
        for a in ('{"p"', ":1}")
    ),
    b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}\n\n',
    _event(usage={"prompt_tokens": 7, "completion_tokens": 3}),
    DONE,
]


def _read(reads: list[bytes]) -> tuple[dict[str, Any], list[bool]]:
    events = ChatEvents(TurnOutput(), 0.0)
    stops = []
    for i, chunk in enumerate(reads):
        stops.append(events.read(chunk, float(i + 1)))
        if stops[-1]:
            break
    events.finish()
    out = asdict(events.out)
    out.pop("latency_s")
    return out, stops


def _cuts(data: bytes, rng: random.Random) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        j = i + rng.randrange(1, 90)
        out.append(data[i:j])
        i = j
    return out


def test_one_event_per_read_all_at_once_or_cut_anywhere_read_the_same() -> None:
    one_by_one, stops = _read(STREAM)
    assert stops == [False] * (len(STREAM) - 1) + [True]
    assert one_by_one["content"] == "Reading the \u00e9 file."
    assert one_by_one["reasoning"] == "Look first\n"
    assert one_by_one["tool_calls"] == [{"id": "c1", "name": "read", "arguments": '{"p":1}'}]
    assert (one_by_one["finish_reason"], one_by_one["prompt_tokens"]) == ("tool_calls", 7)
    assert one_by_one["events"] == 8  # 3 + 2 + 3 that carried text or a call
    assert one_by_one["failure"] is None
    assert one_by_one["ttft_s"] == 2.0  # the first read that carried text
    # the stamps differ by read; the text, the calls and the counts do not
    stamps = ("ttft_s", "itl_s")
    whole = b"".join(STREAM)
    rng = random.Random(3)
    for reads in (
        [whole],
        [b"".join(STREAM[:4]), b"".join(STREAM[4:])],
        *(_cuts(whole, rng) for _ in range(50)),
    ):
        out, stops = _read(reads)
        assert stops[-1] is True
        assert {k: v for k, v in out.items() if k not in stamps} == {
            k: v for k, v in one_by_one.items() if k not in stamps
        }


def test_an_in_band_error_ends_the_stream_and_nothing_after_it_is_read() -> None:
    error = b'data: {"error": {"message": "engine overloaded"}}\n\n'
    after = _event({"content": "never"})
    for reads in ([STREAM[2], error, after], [STREAM[2] + error + after + DONE]):
        out, stops = _read(reads)
        assert stops[-1] is True
        assert out["failure"] == {"kind": "stream_error", "message": "engine overloaded",
                                  "status": None, "retry_after_s": None}  # fmt: skip
        assert "never" not in out["content"]
        assert out["reasoning"] == "first"


def test_an_error_event_line_after_data_ends_the_stream() -> None:
    out, stops = _read([STREAM[4] + b"event: error\ndata: {}\n\n" + STREAM[5]])
    assert stops == [True]
    assert out["failure"]["kind"] == "stream_error"
    assert out["content"] == "Reading "  # the event before it was read


@pytest.mark.parametrize("together", [True, False])
def test_a_broken_event_fails_where_it_stands(together: bool) -> None:
    broken = b'data: {"choices": [{"delta": {"content": "x"}}]\n\n'
    events = ChatEvents(TurnOutput(), 0.0)
    if not together:
        events.read(STREAM[4], 1.0)
    with pytest.raises(msgspec.DecodeError):
        events.read(STREAM[4] + broken + STREAM[5] if together else broken, 1.0)
    assert events.content == ["Reading "]  # read before the broken line; nothing after it


# ---- vLLM names its reasoning ``reasoning``: read from a real loopback server --------------


def _vllm_events() -> list[bytes]:
    """What vLLM streams with a reasoning parser: ``delta.reasoning``, then the content."""
    return [
        _event({"role": "assistant", "content": ""}),
        *(_event({"reasoning": w}) for w in ("The file ", "is small.")),
        *(_event({"content": w}) for w in ("Done", ".")),
        b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n',
        _event(usage={"prompt_tokens": 9, "completion_tokens": 6}),
        DONE,
    ]


async def _serve(chat: Any) -> tuple[Any, str]:
    """``chat`` as the chat endpoint of an aiohttp server on a loopback port: (runner, URL)."""
    from aiohttp import web

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def _vllm_like_server(gap_s: float) -> tuple[Any, str]:
    """An aiohttp server on a loopback port answering like vLLM: streamed events with
    ``delta.reasoning`` (``gap_s`` before the content starts), or ``message.reasoning``."""
    import asyncio

    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Done.", "reasoning": "The file is small."}
            return web.json_response(
                {
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": 6},
                }  # fmt: skip
            )
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for i, event in enumerate(_vllm_events()):
            if i == 3:  # the reasoning is out; the content comes later
                await asyncio.sleep(gap_s)
            await resp.write(event)
        return resp

    return await _serve(chat)


@pytest.mark.parametrize("stream", [True, False])
async def test_vllm_reasoning_is_read_and_counts_for_the_first_token(stream: bool) -> None:
    from harness.client.chat import ChatClient

    gap = 0.4
    runner, url = await _vllm_like_server(gap)
    client = ChatClient(url, model="m")
    try:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        out = await client.chat(body, stream=stream)
    finally:
        await client.aclose()
        await runner.cleanup()
    assert out.failure is None
    assert out.reasoning == "The file is small."
    assert out.content == "Done."
    assert out.prompt_tokens == 9
    if stream:
        assert out.events == 4
        assert out.ttft_s is not None
        assert out.latency_s is not None
        # the first token is the first reasoning token, before the pause, not the content after
        assert out.latency_s - out.ttft_s >= gap * 0.9


async def _chunking_server(cuts: dict[str, list[bytes]]) -> tuple[Any, str]:
    """A loopback server writing the same stream cut as ``cuts[the user's message]`` says,
    each piece its own write with a pause after it, so the client reads them one by one."""
    import asyncio

    from aiohttp import web

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for piece in cuts[body["messages"][0]["content"]]:
                await resp.write(piece)
                await asyncio.sleep(0.002)
        except ConnectionResetError:
            pass  # the client stops reading at [DONE] and hands the connection back
        return resp

    return await _serve(chat)


async def test_a_stream_cut_anywhere_by_a_real_server_reads_as_the_whole() -> None:
    """Through a real socket, the stream in one write, one byte a write (UTF-8 characters
    cut in half), at random cuts, and cut inside every ``data:``, blank line and ``[DONE]``
    gives the same turn."""
    from harness.client.chat import ChatClient

    data = b"".join(STREAM)
    rng = random.Random(5)
    cuts = {
        "whole": [data],
        "bytes": [data[i : i + 1] for i in range(len(data))],
        "random": _cuts(data, rng),
        "events": [p for e in STREAM for p in (e[:3], e[3:-1], e[-1:])],
    }
    runner, url = await _chunking_server(cuts)
    client = ChatClient(url, model="m")
    try:
        outs = {}
        for name in cuts:
            out = await client.chat({"messages": [{"role": "user", "content": name}]}, stream=True)
            outs[name] = out
    finally:
        await client.aclose()
        await runner.cleanup()
    whole = outs["whole"]
    assert whole.failure is None
    assert whole.content == "Reading the \u00e9 file."
    assert whole.reasoning == "Look first\n"
    assert whole.tool_calls == [{"id": "c1", "name": "read", "arguments": '{"p":1}'}]
    assert (whole.finish_reason, whole.prompt_tokens) == ("tool_calls", 7)
    for name, out in outs.items():
        assert out.failure is None, name
        got = (out.content, out.reasoning, out.tool_calls, out.finish_reason, out.prompt_tokens)
        want = (whole.content, whole.reasoning, whole.tool_calls, "tool_calls", 7)
        assert got == want, name
    assert outs["bytes"].events == whole.events == 8  # every event with text or a call


def _unindexed(*calls: dict[str, Any]) -> bytes:
    return _event({"tool_calls": list(calls)})


async def test_parallel_calls_streamed_without_an_index_stay_apart() -> None:
    """Mistral's API streams whole calls without an ``index``, several in one event: each
    new id is a call of its own, read through a real socket, and the verdict finds them
    valid; a delta without an id continues the last call."""
    from harness.client.chat import ChatClient
    from harness.verdict import classify_turn

    plus = {"id": "QAw0", "function": {"name": "plus", "arguments": '{"a": 1, "b": 2}'}}
    minus = {"id": "Hlyh", "function": {"name": "minus", "arguments": '{"a": '}}
    rest = {"function": {"arguments": '1, "b": 2}'}}
    stream = [_event({"role": "assistant", "content": ""}), _unindexed(plus, minus),
              _unindexed(rest), DONE]  # fmt: skip
    runner, url = await _chunking_server({"mistral": [b"".join(stream)]})
    client = ChatClient(url, model="m")
    try:
        body = {"messages": [{"role": "user", "content": "mistral"}]}
        out = await client.chat(body, stream=True)
    finally:
        await client.aclose()
        await runner.cleanup()
    assert out.tool_calls == [
        {"id": "QAw0", "name": "plus", "arguments": '{"a": 1, "b": 2}'},
        {"id": "Hlyh", "name": "minus", "arguments": '{"a": 1, "b": 2}'},
    ]
    calls = [{"id": c["id"], "type": "function",
              "function": {"name": c["name"], "arguments": c["arguments"]}}
             for c in out.tool_calls]  # fmt: skip
    assert not classify_turn(out.content, tool_calls=calls).corrupted


def test_an_id_repeated_without_an_index_is_one_call() -> None:
    first = {"id": "c1", "function": {"name": "read", "arguments": '{"p"'}}
    again = {"id": "c1", "function": {"arguments": ":1}"}}
    out, _ = _read([_unindexed(first), _unindexed(again), DONE])
    assert out["tool_calls"] == [{"id": "c1", "name": "read", "arguments": '{"p":1}'}]


def test_token_ids_of_the_events_are_concatenated() -> None:
    """vLLM's ``return_token_ids``: each streamed event carries the ids of its own piece."""

    def piece(text: str, ids: Any) -> bytes:
        choice = {"index": 0, "delta": {"content": text}, "token_ids": ids}
        return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"

    out, _ = _read([piece("Hel", [5, 6]), piece("lo", [7]), piece("", None), DONE])
    assert out["content"] == "Hello"
    assert out["token_ids"] == [5, 6, 7]
    plain, _ = _read(STREAM)
    assert plain["token_ids"] is None  # a server that sends none: no ids, not an empty list
    odd, _ = _read([piece("a", 3), piece("b", ["x"]), DONE])  # a shape no server sends
    assert odd["token_ids"] is None
    assert odd["content"] == "ab"


@pytest.mark.parametrize(
    ("choice", "ids", "strs"),
    [
        ({"token_ids": [4, 5]}, [4, 5], None),  # vLLM
        ({"logprobs": {"content": [{"id": 9, "token": "a"}, {"id": 8, "token": "b"}]}}, [9, 8],
         None),  # llama.cpp
        ({"logprobs": {"content": [{"token": "a"}, {"token": "b"}]}}, None, ["a", "b"]),  # SGLang
        ({"logprobs": None}, None, None),
    ],
)  # fmt: skip
async def test_token_ids_of_a_whole_answer(
    choice: dict[str, Any], ids: list[int] | None, strs: list[str] | None
) -> None:
    from aiohttp import web

    from harness.client.chat import ChatClient

    async def chat(request: web.Request) -> web.Response:
        message = {"role": "assistant", "content": "ab"}
        return web.json_response(
            {"choices": [{"index": 0, "message": message, "finish_reason": "stop", **choice}]}
        )

    runner, url = await _serve(chat)
    client = ChatClient(url, model="m")
    try:
        out = await client.chat({"messages": [{"role": "user", "content": "hi"}]}, stream=False)
    finally:
        await client.aclose()
        await runner.cleanup()
    assert out.failure is None
    assert (out.token_ids, out.token_strs) == (ids, strs)
