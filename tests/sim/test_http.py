"""The sim over real HTTP: response shapes, streaming, usage, cache, metrics, errors."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from harness.dialects import dsml
from harness.dialects.base import ToolCall
from tests.sim.common import SCHEMAS, TOOLS, chat, follow, messages


def read_stream(response: httpx.Response) -> tuple[list[dict[str, Any]], bool]:
    """(chunks, saw [DONE]) of an SSE response."""
    chunks, done = [], False
    for line in response.text.split("\n\n"):
        if not line:
            continue
        assert line.startswith("data: ")
        payload = line[len("data: ") :]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "data after [DONE]"
        chunks.append(orjson.loads(payload))
    return chunks, done


def assemble(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Content, tool calls and finish reason from stream chunks."""
    content, calls, finish = "", {}, None
    for c in chunks:
        for choice in c["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or []:
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = choice["finish_reason"] or finish
    return {"content": content, "calls": [calls[i] for i in sorted(calls)], "finish": finish}


@pytest.fixture
def clean_url(make_sim: Callable[..., str]) -> str:
    return make_sim(fault_scale=0.0)


def test_non_streamed_tool_call_shape(clean_url: str) -> None:
    with httpx.Client(base_url=clean_url) as client:
        r = chat(client, messages())
    assert r.status_code == 200
    assert r.headers["x-sim-injected"] == "none"
    body = r.json()
    assert body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["role"] == "assistant"
    assert message["reasoning_content"] is None
    assert message["content"] is None or isinstance(message["content"], str)
    calls = message["tool_calls"]
    assert calls
    assert all(c["type"] == "function" and c["id"] for c in calls)
    # the first call of a session lists the repository root
    assert calls[0]["function"]["name"] == "list_dir"
    assert orjson.loads(calls[0]["function"]["arguments"]) == {"path": "."}
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert usage["prompt_tokens"] > 100  # the tool schemas count


def test_session_follows_schema_and_plan(clean_url: str) -> None:
    msgs = messages("Investigate the loader. Work in about 5 steps.")
    seen_paths: list[str] = []
    with httpx.Client(base_url=clean_url) as client:
        for turn in range(5):
            r = chat(client, msgs)
            message = r.json()["choices"][0]["message"]
            assert r.json()["choices"][0]["finish_reason"] == "tool_calls", turn
            for call in message["tool_calls"]:
                name, args = call["function"]["name"], orjson.loads(call["function"]["arguments"])
                jsonschema.validate(args, SCHEMAS[name])
                if name == "read_file":
                    seen_paths.append(args["path"])
            follow(msgs, message, turn)
        final = chat(client, msgs).json()["choices"][0]
    assert final["finish_reason"] == "stop"
    assert final["message"]["tool_calls"] is None
    text = final["message"]["content"]
    assert len(text) > 80
    assert dsml.find_fragment(text) is None
    # paths come from earlier tool results and are not read twice while fresh ones remain
    assert len(seen_paths) == len(set(seen_paths))


def test_streamed_matches_non_streamed(clean_url: str) -> None:
    msgs = messages()
    with httpx.Client(base_url=clean_url) as client:
        first = chat(client, msgs).json()["choices"][0]["message"]
        follow(msgs, first, 0)
        plain = chat(client, msgs).json()["choices"][0]
        r = chat(client, msgs, stream=True, stream_options={"include_usage": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["x-sim-injected"] == "none"
    chunks, done = read_stream(r)
    assert done
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    got = assemble(chunks)
    assert got["finish"] == plain["finish_reason"] == "tool_calls"
    assert got["content"] == (plain["message"]["content"] or "")
    want = [
        (c["function"]["name"], c["function"]["arguments"]) for c in plain["message"]["tool_calls"]
    ]
    assert [(c["name"], c["arguments"]) for c in got["calls"]] == want
    total_chars = len(got["content"]) + sum(len(c["arguments"]) for c in got["calls"])
    assert len(chunks) < total_chars / 4  # several characters per event, not one


def test_stream_without_usage_has_no_usage_chunk(clean_url: str) -> None:
    with httpx.Client(base_url=clean_url) as client:
        chunks, done = read_stream(chat(client, messages(), stream=True))
    assert done
    assert all(c["choices"] for c in chunks)


def test_cached_tokens_grow_on_second_turn(clean_url: str) -> None:
    msgs = messages()
    with httpx.Client(base_url=clean_url) as client:
        r1 = chat(client, msgs).json()
        follow(msgs, r1["choices"][0]["message"], 0)
        r2 = chat(client, msgs).json()
    u1, u2 = r1["usage"], r2["usage"]
    assert u2["prompt_tokens"] > u1["prompt_tokens"]
    cached = u2["prompt_tokens_details"]["cached_tokens"]
    # everything up to and including the first answer was seen: only the tool result is new
    assert u1["prompt_tokens"] < cached < u2["prompt_tokens"]


def test_flush_cache_empties_prefix_cache(clean_url: str) -> None:
    msgs = messages()
    with httpx.Client(base_url=clean_url) as client:
        chat(client, msgs)
        again = chat(client, msgs).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert client.post("/flush_cache").status_code == 200
        after = chat(client, msgs).json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert again > 0
    assert after == 0


def test_deterministic_for_seed_and_conversation(make_sim: Callable[..., str]) -> None:
    a, b, c = make_sim(seed=7), make_sim(seed=7), make_sim(seed=8)

    def run(url: str, request_seed: int | None = None) -> list[Any]:
        out = []
        with httpx.Client(base_url=url) as client:
            for task in ("Check the loader. About 6 steps.", "Why is the pool slow? 3 steps"):
                msgs = messages(task)
                for turn in range(3):
                    extra = {} if request_seed is None else {"seed": request_seed}
                    message = chat(client, msgs, **extra).json()["choices"][0]["message"]
                    out.append((message["content"], message["tool_calls"]))
                    follow(msgs, message, turn)
        return out

    assert run(a) == run(b)
    assert run(a) != run(c)
    assert run(a, request_seed=1) != run(a)


def test_no_tools_answers_in_prose(clean_url: str) -> None:
    msgs = [{"role": "user", "content": "How should I size the memory pool for many sessions?"}]
    with httpx.Client(base_url=clean_url) as client:
        r = client.post("/v1/chat/completions", json={"messages": msgs})
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"] is None
    assert len(choice["message"]["content"].split()) >= 15


def test_tool_choice_none_answers_in_prose(clean_url: str) -> None:
    with httpx.Client(base_url=clean_url) as client:
        choice = chat(client, messages(), tool_choice="none").json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["message"]["tool_calls"] is None


def test_max_tokens_cuts_with_length(clean_url: str) -> None:
    with httpx.Client(base_url=clean_url) as client:
        r = chat(client, messages(), max_tokens=8).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"]["tool_calls"] is None
    assert r["usage"]["completion_tokens"] <= 8


def test_tool_calls_round_trip_through_dsml(clean_url: str) -> None:
    """What the server returns re-encodes to DSML that parses back to the same calls."""
    msgs = messages("Look around. About 8 steps.")
    with httpx.Client(base_url=clean_url) as client:
        for turn in range(6):
            message = chat(client, msgs).json()["choices"][0]["message"]
            calls = [
                ToolCall(c["function"]["name"], orjson.loads(c["function"]["arguments"]))
                for c in message["tool_calls"]
            ]
            parsed = dsml.parse(dsml.encode_turn(message["content"] or "", calls), "v4")
            assert parsed.ok
            assert list(parsed.calls) == calls
            follow(msgs, message, turn)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"{not json", "invalid JSON"),
        (b"[]", "JSON object"),
        (b"{}", "messages"),
        (b'{"messages": []}', "messages"),
        (b'{"messages": [{"content": "hi"}]}', "role"),
        (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', "max_tokens"),
        (b'{"messages": [{"role": "user", "content": "x"}], "tools": {}}', "tools"),
    ],
)
def test_bad_requests_get_openai_errors(sim_url: str, body: bytes, fragment: str) -> None:
    with httpx.Client(base_url=sim_url) as client:
        r = client.post("/v1/chat/completions", content=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert fragment in error["message"]
    assert error["type"]
    assert error["code"] == 400


def test_native_endpoints(sim_url: str) -> None:
    with httpx.Client(base_url=sim_url) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/health_generate").status_code == 200
        models = client.get("/v1/models").json()
        info = client.get("/server_info").json()
    assert models["data"][0]["id"] == "deepseek-ai/DeepSeek-V4-Flash"
    assert info["max_total_num_tokens"] > 0
    assert info["index_k_dtype"] == "bf16"
    assert info["enable_hierarchical_cache"] is True


def test_metrics_count_tokens(sim_url: str) -> None:
    msgs = messages()
    with httpx.Client(base_url=sim_url) as client:
        r1 = chat(client, msgs).json()
        follow(msgs, r1["choices"][0]["message"], 0)
        r2 = chat(client, msgs).json()
        text = client.get("/metrics").text
    values = {}
    for line in text.splitlines():
        if line.startswith("sglang:"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    for name in (
        "num_running_reqs",
        "num_queue_reqs",
        "token_usage",
        "cache_hit_rate",
        "cached_tokens_total",
        "prompt_tokens_total",
        "generation_tokens_total",
    ):
        assert f"sglang:{name}" in values, name
    usages = [r1["usage"], r2["usage"]]
    assert values["sglang:prompt_tokens_total"] == sum(u["prompt_tokens"] for u in usages)
    assert values["sglang:generation_tokens_total"] == sum(u["completion_tokens"] for u in usages)
    cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
    assert values["sglang:cached_tokens_total"] == cached
    assert values["sglang:num_running_reqs"] == 0
    assert 0 < values["sglang:cache_hit_rate"] < 1
    assert "# TYPE sglang:prompt_tokens_total counter" in text


def test_tools_are_not_hardcoded(clean_url: str) -> None:
    """Any declared tool set works: arguments follow whatever schema was declared."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_ticket",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "ticket_id": {"type": "integer", "minimum": 1000, "maximum": 9999},
                        "fields": {"type": "array", "items": {"enum": ["title", "owner"]}},
                        "include_closed": {"type": "boolean"},
                    },
                    "required": ["ticket_id", "fields", "include_closed"],
                },
            },
        }
    ]
    msgs = messages()
    with httpx.Client(base_url=clean_url) as client:
        for _ in range(4):
            r = client.post("/v1/chat/completions", json={"messages": msgs, "tools": tools})
            message = r.json()["choices"][0]["message"]
            for call in message["tool_calls"]:
                assert call["function"]["name"] == "lookup_ticket"
                args = orjson.loads(call["function"]["arguments"])
                jsonschema.validate(args, tools[0]["function"]["parameters"])
            msgs.append(
                {
                    "role": "assistant",
                    "content": message["content"],
                    "tool_calls": message["tool_calls"],
                }
            )
            msgs += [
                {"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                for c in message["tool_calls"]
            ]
    assert TOOLS  # the shared tool set is untouched


def _running(client: httpx.Client) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("sglang:num_running_reqs"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no num_running_reqs in /metrics")


def test_client_disconnect_frees_the_slot(make_sim: Callable[..., str]) -> None:
    # slow decoding of a prose answer: the stream runs for seconds after its first event
    url = make_sim(speed=0.1, fault_scale=0.0)
    question = "Explain how a prefix cache behaves when many long sessions share a server."
    body = {"messages": [{"role": "user", "content": question}], "stream": True}
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = r.iter_lines()  # keep a reference: dropping it closes the connection
            assert next(lines).startswith("data: ")
            assert _running(client) == 1
        for _ in range(300):  # bounded wait for the server to notice
            if _running(client) == 0:
                break
            time.sleep(0.02)
        assert _running(client) == 0


def _sglang_metrics(client: httpx.Client) -> dict[str, float]:
    values = {}
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("sglang:"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0].removeprefix("sglang:")] = float(value)
    return values


def test_cache_hit_rate_is_of_the_last_prefill_not_cumulative(sim_url: str) -> None:
    """As upstream SGLang: the gauge is the cached share of the last prefill batch."""
    with httpx.Client(base_url=sim_url) as client:
        chat(client, messages())
        chat(client, messages())  # the same prompt again: almost all of it cached
        again = _sglang_metrics(client)
        other = [{"role": "user", "content": "Something else entirely, from the start."}]
        body = {"model": "m", "messages": other, "max_tokens": 64}
        client.post("/v1/chat/completions", json=body)  # no tools, no system prompt: no hit
        fresh = _sglang_metrics(client)
        info = client.get("/server_info").json()
    assert again["cache_hit_rate"] > 0.9
    cumulative = fresh["cached_tokens_total"] / fresh["prompt_tokens_total"]
    assert cumulative > 0.2  # what the old cumulative gauge said
    assert fresh["cache_hit_rate"] < 0.2
    # HiCache's host tier and the speculative acceptance, under SGLang's names
    assert fresh["hicache_host_total_tokens"] == info["max_total_num_tokens"] * 2
    assert "hicache_host_used_tokens" in fresh
    assert 0 < fresh["spec_accept_rate"] <= 1


def test_usage_leaves_cached_tokens_out_without_the_cache_report(
    make_sim: Callable[..., str],
) -> None:
    with httpx.Client(base_url=make_sim(cache_report=False)) as client:
        usage = chat(client, messages()).json()["usage"]
        info = client.get("/server_info").json()
    assert usage["prompt_tokens_details"] is None
    assert usage["prompt_tokens"] > 0
    assert info["enable_cache_report"] is False


def test_flush_cache_is_refused_while_a_request_runs(make_sim: Callable[..., str]) -> None:
    """As SGLang: 400 while anything runs or waits; 200 once idle."""
    import threading

    url = make_sim(speed=0.5)
    with httpx.Client(base_url=url, timeout=60) as client:
        worker = threading.Thread(target=lambda: chat(httpx.Client(base_url=url, timeout=60),
                                                      messages()))  # fmt: skip
        worker.start()
        deadline = time.monotonic() + 10
        while _sglang_metrics(client)["num_running_reqs"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        busy = client.post("/flush_cache")
        worker.join()
        idle = client.post("/flush_cache")
    assert busy.status_code == 400
    assert "pending requests" in busy.text
    assert idle.status_code == 200


def test_server_info_reports_every_flag_but_the_key(make_sim: Callable[..., str]) -> None:
    """As SGLang's /server_info lists every server argument: a level that reaches the
    simulator shows there (harness.target.serverfacts compares it whole)."""
    url = make_sim(crash_after=50, fault_scale=0.5, api_key="k-secret-1", slow_start=0.0)
    info = httpx.get(url + "/server_info", headers={"authorization": "Bearer k-secret-1"}).json()
    assert info["crash_after"] == 50
    assert info["fault_scale"] == 0.5
    assert info["raw_add_bos"] is False
    assert info["api_key_required"] is True
    assert "k-secret-1" not in orjson.dumps(info).decode()
    assert "api_key" not in info
