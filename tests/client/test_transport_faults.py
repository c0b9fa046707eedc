"""Every server fault becomes a transport_error row, never corruption, and the run goes on.

Faults come from the simulator's transport knobs over real loopback HTTP; the sessions are
driven by ``harness.drive.driver.drive`` and the whole CLI. Rows are counted against the chat
requests the simulator says it received (``sim:chat_requests_total`` in /metrics).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import labels as L
from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, drive
from harness.drive.session import Session, make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import load_scenario
from tests.sim.common import TOOLS, messages

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}
#: The failure kind each simulator knob must produce on the client side.
KIND = {
    "error": "http_status",
    "disconnect": "cut",
    "stall": "timeout",
    "error_event": "stream_error",
    "bad_json": "protocol",
}


def kind_of(row: dict[str, Any]) -> str:
    """The failure kind of a transport_error row ("kind: message")."""
    return str(row["transport_error"]).split(":", 1)[0]


def chat_requests(url: str) -> int:
    text = httpx.get(url + "/metrics").text
    line = next(x for x in text.splitlines() if x.startswith("sim:chat_requests_total "))
    return int(float(line.split()[1]))


async def drive_sessions(
    url: str,
    tmp_path: Path,
    *,
    sessions: int = 3,
    stream: bool = True,
    concurrency: int | None = None,
    request_timeout: float = 20.0,
) -> tuple[list[Session], list[dict[str, Any]]]:
    scenario = load_scenario().with_overrides(
        sessions=sessions, steps=4, max_turns=6, max_context=12000
    )
    client = ChatClient(url, model="m", request_timeout=request_timeout)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            done = await drive(
                client,
                scenario,
                make_plans(scenario, sessions, seed=5),
                writer,
                BASE,
                DriveOptions(concurrency=concurrency or sessions, stream=stream),
            )
    finally:
        await client.aclose()
    return done, [dict(r) for r in read_turns(tmp_path / "turns.jsonl")]


def request(task: str = "Find the race in the cache.") -> dict[str, Any]:
    return {"messages": messages(task), "tools": TOOLS, "max_tokens": 512, "seed": 1}


# ---------------------------------------------------------------- one request per fault


@pytest.mark.parametrize(
    ("knob", "stream"),
    # error events exist only in streams
    [(k, st) for k in KIND for st in (True, False) if st or k != "error_event"],
)
async def test_each_fault_has_its_failure_kind(
    make_sim: Callable[..., str], knob: str, stream: bool
) -> None:
    url = make_sim(fault_scale=0.0, stall_seconds=30.0, **{f"{knob}_rate": 1.0})
    client = ChatClient(url, model="m", request_timeout=0.5)
    try:
        out = await client.chat(request(), stream=stream)
    finally:
        await client.aclose()
    assert out.failure is not None
    assert out.failure.kind == KIND[knob], out.failure
    assert out.sim_injected == f"transport:{knob}"  # the headers were read before the fault
    assert out.status == (out.failure.status if knob == "error" else 200)


# ---------------------------------------------------------------- what the sim does not do

Respond = Callable[[asyncio.StreamWriter], None]


async def _read_request(reader: asyncio.StreamReader) -> None:
    """Read one HTTP/1.1 request with a content-length body (raises at the end of input)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    await reader.readexactly(length)


async def _raw_chat(respond: Respond, stream: bool) -> Any:
    """One chat request against a raw TCP server that reads the request, then ``respond``s."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        respond(writer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}", model="m", request_timeout=5.0)
    try:
        return await client.chat(request(), stream=stream)
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def _reset(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # linger 0: the peer gets a TCP reset


def _answer(content_type: str, body: bytes) -> Respond:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\n"
    head += f"content-length: {len(body)}\r\n\r\n"
    return lambda writer: writer.write(head.encode() + body)


_JSON_ERROR = b'{"error": {"message": "engine died", "code": 500}}'
_EVENT_ERROR = b'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}\n\n'
_EVENT_ERROR += b'event: error\ndata: {"message": "engine died"}\n\n'
_ERR = "stream_error"


@pytest.mark.parametrize(
    ("respond", "stream", "kind"),
    [
        (_reset, True, "cut"),
        (_reset, False, "cut"),
        (lambda w: w.write(b"NOT HTTP AT ALL\r\n\r\n"), True, "protocol"),
        (lambda w: w.write(b"NOT HTTP AT ALL\r\n\r\n"), False, "protocol"),
        (_answer("application/json", _JSON_ERROR), True, "stream_error"),
        (_answer("application/json", _JSON_ERROR), False, "protocol"),
        (_answer("text/event-stream", _EVENT_ERROR), True, "stream_error"),
        (_answer("text/event-stream", b'data: {"choices": [}\n\n'), True, "protocol"),
        (_answer("text/event-stream", b'data: {"choices": {"0": {}}}\n\n'), True, "protocol"),
        (_answer("text/event-stream", b'data: {"error": {"message": "busy"}}\n\n'), True, _ERR),
    ],
    ids=[
        "reset-stream",
        "reset-plain",
        "not-http-stream",
        "not-http-plain",
        "json-error-to-stream",
        "json-error-with-200",
        "sse-error-event",
        "sse-bad-json",
        "sse-choices-not-a-list",
        "sse-error-in-data",
    ],
)
async def test_other_broken_servers(respond: Respond, stream: bool, kind: str) -> None:
    out = await _raw_chat(respond, stream)
    assert out.failure is not None
    assert out.failure.kind == kind, out.failure


_OK = (
    b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "Done."},'
    b' "finish_reason": "stop"}], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}'
)
_OK_STREAM = (
    b'data: {"choices": [{"index": 0, "delta": {"content": "Done."}, "finish_reason": "stop"}]}'
    b"\n\ndata: [DONE]\n\n"
)


class _Resends:
    def __init__(self) -> None:
        self.count = 0

    def request_sent(self, now: float) -> None:
        pass

    def pool_waited(self, seconds: float) -> None:
        pass

    def resent_stale(self) -> None:
        self.count += 1


async def _keepalive_server(
    drop: Callable[[int, int], bool], stream: bool
) -> tuple[asyncio.Server, list[int]]:
    """A raw HTTP/1.1 server keeping connections alive; it reads each request and drops the
    connection without a byte of answer when ``drop(c, n)`` holds for the n-th request of the
    c-th connection (both 0-based). ``seen`` counts the requests that arrived, per
    connection."""
    seen: list[int] = []
    body = _OK_STREAM if stream else _OK
    kind = b"text/event-stream" if stream else b"application/json"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: " + kind + b"\r\ncontent-length: "
    answer = head + str(len(body)).encode() + b"\r\n\r\n" + body

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = len(seen)
        seen.append(0)
        try:
            while True:
                await _read_request(reader)
                seen[conn] += 1
                if drop(conn, seen[conn] - 1):
                    _reset(writer)
                    return
                writer.write(answer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


async def _chats(
    drop: Callable[[int, int], bool], stream: bool, n: int
) -> tuple[list[Any], int, list[int]]:
    """``n`` chat requests one after another against ``_keepalive_server(drop)``: the
    outputs, the resends the client reported, the requests each connection saw."""
    server, seen = await _keepalive_server(drop, stream)
    port = server.sockets[0].getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}", model="m", request_timeout=5.0)
    resends = _Resends()
    client.observers.append(resends)
    try:
        outs = [await client.chat(request(), stream=stream) for _ in range(n)]
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    return outs, resends.count, seen


@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_on_a_dead_kept_alive_connection_is_sent_once_more(stream: bool) -> None:
    """Like llama.cpp closing a connection after each stream: the second request on every
    connection finds it dead before any answer; it is sent again on a new connection."""
    outs, resends, seen = await _chats(lambda _c, n: n == 1, stream, 4)
    assert [o.failure for o in outs] == [None] * 4
    assert [o.content for o in outs] == ["Done."] * 4
    # requests 2, 3 and 4 each met a dead connection (its second request) and went again on a
    # new one, which served it
    assert resends == 3
    assert seen == [2, 2, 2, 1]


@pytest.mark.parametrize("stream", [True, False])
async def test_a_fresh_connection_that_breaks_is_a_failure_not_resent(stream: bool) -> None:
    (out,), resends, seen = await _chats(lambda _c, n: n == 0, stream, 1)
    assert out.failure is not None
    assert out.failure.kind == "cut", out.failure
    assert (resends, seen) == (0, [1])


@pytest.mark.parametrize("stream", [True, False])
async def test_the_resend_is_once(stream: bool) -> None:
    """After the first answer the server breaks everything: the request that met the dead
    connection is sent once more, on a fresh connection, which breaks too: a cut."""
    (first, second), resends, seen = await _chats(lambda c, n: c > 0 or n > 0, stream, 2)
    assert first.failure is None
    assert second.failure is not None
    assert second.failure.kind == "cut", second.failure
    assert (resends, seen) == (1, [2, 1])


# ---------------------------------------------------------------- sessions under faults


@pytest.mark.parametrize("knob", list(KIND))
async def test_faulty_server_gives_one_transport_error_row_per_failed_request(
    make_sim: Callable[..., str], tmp_path: Path, knob: str
) -> None:
    url = make_sim(fault_scale=0.0, stall_seconds=30.0, seed=2, **{f"{knob}_rate": 0.3})
    sessions, rows = await drive_sessions(url, tmp_path, request_timeout=1.0)
    # every request the server received is one row, and every row is one request
    assert len(rows) == chat_requests(url) == sum(s.turns_sent for s in sessions)
    failed = [r for r in rows if r["label"] == L.TRANSPORT_ERROR]
    assert failed, "the knob never fired"
    assert len(failed) < len(rows)
    assert not any(r["corrupted"] for r in rows)
    for r in rows:
        injected = r["sim_injected"] == f"transport:{knob}"
        assert injected == (r["label"] == L.TRANSPORT_ERROR), r
        if injected:
            assert kind_of(r) == KIND[knob], r["transport_error"]
        else:
            assert r["label"] in (L.OK_TOOL_CALL, L.OK_TEXT), r["label"]
    # failed turns were re-sent: the same turn appears with a higher attempt
    resent = {(r["session"], r["turn"]) for r in failed}
    assert any(
        (r["session"], r["turn"]) in resent and r["attempt"] > 0 and r["label"] != L.TRANSPORT_ERROR
        for r in rows
    )
    assert all(s.ended is not None for s in sessions)


@pytest.mark.parametrize("stream", [True, False])
async def test_all_faults_at_once(
    make_sim: Callable[..., str], tmp_path: Path, stream: bool
) -> None:
    """Every answer that gets through is corrupted (salad); transport faults still are not."""
    rates = {f"{knob}_rate": 0.1 for knob in KIND}
    url = make_sim(seed=9, stall_seconds=30.0, force_fault="salad", **rates)
    sessions, rows = await drive_sessions(
        url, tmp_path, sessions=6, stream=stream, request_timeout=1.0
    )
    assert len(rows) == chat_requests(url) == sum(s.turns_sent for s in sessions)
    fired = {r["sim_injected"] for r in rows}
    assert len({k for k in fired if k.startswith("transport:")}) >= 3
    assert "salad" in fired
    for r in rows:
        if str(r["sim_injected"]).startswith("transport:"):
            assert r["label"] == L.TRANSPORT_ERROR
            assert kind_of(r) == KIND[r["sim_injected"].split(":")[1]]
            assert not r["corrupted"]
        else:
            assert r["label"] == L.TOKEN_SALAD, r["label"]
            assert r["corrupted"]


# ---------------------------------------------------------------- deadlines


async def test_a_slow_stream_that_keeps_sending_outlives_the_request_timeout(
    make_sim: Callable[..., str],
) -> None:
    url = make_sim(fault_scale=0.0, speed=0.05, chunk_tokens=1)  # an event every ~40 ms
    client = ChatClient(url, model="m", request_timeout=1.5)
    try:
        out = await client.chat(request(), stream=True)
    finally:
        await client.aclose()
    assert out.failure is None, out.failure
    assert out.latency_s is not None
    assert out.latency_s > 1.5  # longer than the timeout in all, never that long without a byte
    assert out.events > 10


@pytest.mark.parametrize("stream", [True, False])
async def test_a_stall_shorter_than_the_timeout_is_no_failure(
    make_sim: Callable[..., str], stream: bool
) -> None:
    clean = make_sim(fault_scale=0.0)
    stalled = make_sim(fault_scale=0.0, stall_rate=1.0, stall_seconds=0.4)
    outs = []
    for url in (clean, stalled):
        client = ChatClient(url, model="m", request_timeout=3.0)
        try:
            outs.append(await client.chat(request(), stream=stream))
        finally:
            await client.aclose()
    assert outs[1].failure is None
    assert outs[1].sim_injected == "transport:stall"
    assert (outs[1].content, outs[1].tool_calls) == (outs[0].content, outs[0].tool_calls)


async def _stalling_server(events: int, gap_s: float) -> tuple[asyncio.Server, asyncio.Event]:
    """Streams ``events`` events ``gap_s`` apart, then nothing, the connection left open
    until ``done`` is set (each event in a write of its own, as a decoding server writes)."""
    done = asyncio.Event()
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n"
    event = b'data: {"choices": [{"index": 0, "delta": {"content": "tick "}}]}\n\n'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(head)
        for _ in range(events):
            await asyncio.sleep(gap_s)
            writer.write(event)
            await writer.drain()
        await done.wait()
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), done


@pytest.mark.parametrize("raw", [False, True], ids=["chat", "raw"])
async def test_a_stream_that_stops_mid_way_times_out_after_its_last_byte(raw: bool) -> None:
    """The read timeout counts from the last byte of the body, not from the headers: events
    0.3 s apart for 1.2 s outlive a 0.6 s timeout, the silence after them does not."""
    server, done = await _stalling_server(events=4, gap_s=0.3)
    port = server.sockets[0].getsockname()[1]
    client = ChatClient(f"http://127.0.0.1:{port}", model="m", request_timeout=0.6)
    client.total_timeout = 20.0
    try:
        if raw:
            out = await client.raw("/v1/completions", {"prompt": "x"}, stream=True)
        else:
            out = await client.chat(request(), stream=True)
    finally:
        done.set()
        await client.aclose()
        server.close()
        await server.wait_closed()
    assert out.failure is not None
    assert out.failure.kind == "timeout", out.failure
    assert "no byte from the server for 0.6s" in out.failure.message
    if not raw:
        assert out.events == 4  # every event before the silence was read
    assert out.latency_s is not None
    assert 1.2 + 0.6 <= out.latency_s < 10  # after the last event, long before the cap


async def test_the_overall_cap_ends_a_trickling_request(make_sim: Callable[..., str]) -> None:
    url = make_sim(fault_scale=0.0, speed=0.05, chunk_tokens=1)
    client = ChatClient(url, model="m", request_timeout=5.0, total_timeout=0.5)
    try:
        out = await client.chat(request(), stream=True)
    finally:
        await client.aclose()
    assert out.failure is not None
    assert out.failure.kind == "timeout"
    assert "longer than 0.5s" in out.failure.message


# ---------------------------------------------------------------- a server that dies


def _launch_sim(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.sim", "--port", "0", "--port-file", str(port_file)]
        + ["--speed", "200", "--fault-scale", "0", "--log-level", "warning", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("the sim did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text().strip()}"


async def test_a_server_that_crashes_mid_run(tmp_path: Path) -> None:
    proc, url = _launch_sim(tmp_path, "--crash-after", "5")
    try:
        sessions, rows = await drive_sessions(url, tmp_path, sessions=3, concurrency=1)
        code = await asyncio.to_thread(proc.wait, 10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 70
    assert proc.stderr is not None
    assert b"crash" in proc.stderr.read()
    assert all(r["label"] == L.TRANSPORT_ERROR or not r["transport_error"] for r in rows)
    answered = [r for r in rows if r["label"] != L.TRANSPORT_ERROR]
    assert len(answered) == 5
    # one request at a time: the sixth reached the dying server (cut), later ones found no
    # one listening (or, on a kept-alive connection not yet seen closed, a cut one)
    kinds = [kind_of(r) for r in rows if r["label"] == L.TRANSPORT_ERROR]
    assert kinds[0] == "cut"
    assert "connect" in kinds
    assert set(kinds) <= {"cut", "connect"}
    assert len(rows) == sum(s.turns_sent for s in sessions)
    assert [s.ended for s in sessions].count("attempts exhausted") == 3


@pytest.mark.parametrize("stream", [True, False])
async def test_every_request_the_server_saw_is_a_row(tmp_path: Path, stream: bool) -> None:
    """A send dropped before any byte of an answer on a reused connection is re-sent (the
    client test above), and it is a row of its own: a ``dropped`` transport error marked as
    re-sent, with the next attempt number, so the rows match the requests the server saw."""
    server, seen = await _keepalive_server(lambda _c, n: n == 1, stream)
    port = server.sockets[0].getsockname()[1]
    scenario = load_scenario().with_overrides(sessions=4, steps=2, max_turns=2, max_context=12000)
    client = ChatClient(f"http://127.0.0.1:{port}", model="m", request_timeout=5.0)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            await drive(
                client,
                scenario,
                make_plans(scenario, 4, seed=5),
                writer,
                BASE,
                DriveOptions(concurrency=1, stream=stream),
            )
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
    rows = read_turns(tmp_path / "turns.jsonl")
    assert len(rows) == sum(seen)
    dropped = [r for r in rows if r["transport_error"]]
    assert len(dropped) == 3  # sessions 2, 3 and 4 each met a dead connection first
    assert {kind_of(r) for r in dropped} == {"dropped"}
    assert all(r["evidence"]["resent"] for r in dropped)
    for r in dropped:  # the re-send that was answered is the next attempt of the same turn
        (answered,) = [
            x for x in rows if (x["session"], x["turn"], x["attempt"]) == (r["session"], 0, 1)
        ]
        assert not answered["transport_error"]
