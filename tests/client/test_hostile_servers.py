"""Hostile servers: one bad turn costs only that turn, every read is bounded, a huge answer
never stalls the other streams, compression is not asked for and is bounded when it comes.

Each test runs the hostile stand-in (tests/standins/hostile.py) as a real loopback server
process and drives real sessions, or the whole CLI, against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import labels as L
from harness.client import DEFAULT_REQUEST_TIMEOUT
from harness.client.chat import ChatClient
from harness.client.output import TurnOutput
from harness.client.response_limits import Limits
from harness.drive.driver import DriveHooks, DriveOptions, drive
from harness.drive.session import Session, SessionPlan, Shared, make_plans
from harness.record.safejson import Unencodable
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import load_scenario
from tests.standins import running_hostile

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}
ROOT = Path(__file__).resolve().parent.parent.parent
ASK = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def drive_against(
    url: str,
    tmp_path: Path,
    *,
    sessions: int = 2,
    concurrency: int | None = None,
    max_turns: int = 3,
    stream: bool = True,
    request_timeout: float = 20.0,
    limits: Limits | None = None,
    **hooks: Any,
) -> list[dict[str, Any]]:
    """Drive ``sessions`` sessions of the shipped scenario against ``url``; their rows.
    ``hooks``: ``DriveHooks``' ``make_session`` and ``on_session_end``."""
    scenario = load_scenario().with_overrides(sessions=sessions, max_turns=max_turns)
    client = ChatClient(url, model="m", request_timeout=request_timeout, limits=limits)
    options = DriveOptions(concurrency=concurrency or sessions, stream=stream)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            plans = make_plans(scenario, sessions, seed=3)
            await drive(client, scenario, plans, writer, BASE, options, hooks=DriveHooks(**hooks))
    finally:
        await client.aclose()
    return [dict(r) for r in read_turns(tmp_path / "turns.jsonl")]


async def ask(url: str, *, stream: bool = True, limits: Limits | None = None) -> TurnOutput:
    """One request (ASK) from a client of its own, closed after."""
    client = ChatClient(url, model="m", limits=limits)
    try:
        return await client.chat(ASK, stream=stream)
    finally:
        await client.aclose()


async def stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as http:
        return dict((await http.get(url + "/stats")).json())


def harness(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )


# ---- one bad turn costs that turn ------------------------------------------------------------


def test_arguments_nested_10000_deep_are_the_servers_invalid_call_without_a_traceback(
    tmp_path: Path,
) -> None:
    out = tmp_path / "run"
    with running_hostile("deep") as url:
        done = harness("run", "--endpoint", url, "--model", "m", "--sessions", "3",
                       "--turns", "2", "--out", str(out), "--workers", "1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_turns(out / "turns.jsonl")
    assert rows
    # the server's output, classified: an invalid call, not a failure of the harness
    assert {r["label"] for r in rows} == {L.INVALID_TOOL_CALL}
    assert all(r["corrupted"] and r["transport_error"] is None for r in rows)
    assert all("nested deeper than 128 levels" in r["evidence"]["reason"] for r in rows)
    # stored as it arrived: the raw arguments string
    assert all(r["tool_calls"][0]["arguments"].startswith('{"path": [[[') for r in rows)
    assert "Traceback" not in done.stderr
    assert "RecursionError" not in done.stderr
    assert "failed in the harness itself" not in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    (variant,) = summary["variants"]
    assert variant["harness_errors"] == 0
    assert variant["corrupted_sessions"] == 3


async def test_a_lone_surrogate_in_arguments_is_stored_and_the_session_goes_on(
    tmp_path: Path,
) -> None:
    with running_hostile("surrogate") as url:
        rows = await drive_against(url, tmp_path)
        seen = await stats(url)
    rows.sort(key=lambda r: (r["session"], r["turn"]))
    assert [r["label"] for r in rows] == [L.OK_TOOL_CALL, L.OK_TEXT] * 2
    first = rows[0]
    assert first["tool_calls"][0]["arguments"] == {"path": "\ud800src"}  # escaped on disk
    assert seen["chat"] == 4  # the tool result went back: the second turn was sent


def test_a_lone_surrogate_in_arguments_reaches_every_writer_of_a_run(tmp_path: Path) -> None:
    out = tmp_path / "run"
    junit = tmp_path / "junit.xml"
    with running_hostile("surrogate") as url:
        done = harness("run", "--endpoint", url, "--model", "m", "--sessions", "2",
                       "--turns", "2", "--out", str(out), "--workers", "1",
                       "--junit", str(junit))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    for name in ("turns.parquet", "report.md", "report.html", "summary.json"):
        assert (out / name).is_file(), name
    assert junit.is_file()
    assert json.loads(done.stdout.strip().splitlines()[-1])["exit_code"] == 0


async def test_an_exception_of_the_harness_in_the_client_is_not_the_servers_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of the harness's own while reading (here: the event reader raising a
    ZeroDivisionError) is a harness_error row, never a transport failure."""
    from harness.client import sse

    def broken(self: Any, chunk: bytes, now: float) -> bool:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sse.ChatEvents, "read", broken)
    with running_hostile("healthy") as url:
        rows = await drive_against(url, tmp_path)
    assert [r["label"] for r in rows] == [L.HARNESS_ERROR] * 2
    assert all(r["transport_error"] is None for r in rows)
    assert "ZeroDivisionError" in rows[0]["evidence"]["reason"]


def test_the_writer_never_writes_half_a_line(tmp_path: Path) -> None:
    """A record no encoder can write raises before a byte is written; a lone surrogate is
    written escaped and read back as it was."""
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    with TurnWriter(tmp_path / "turns.jsonl") as writer:
        writer.write({"session": 0, "content": "\ud800"})
        with pytest.raises(Unencodable):
            writer.write({"session": 1, "tool_calls": [{"arguments": deep}]})
        writer.write({"session": 2, "content": "ok"})
    rows = read_turns(tmp_path / "turns.jsonl")
    assert [r["session"] for r in rows] == [0, 2]
    assert rows[0]["content"] == "\ud800"


async def test_a_tool_that_raises_ends_its_session_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from harness.drive import session as session_module

    def broken(*_a: Any, **_k: Any) -> str:
        raise KeyError("a bug in a tool")

    monkeypatch.setattr(session_module, "run_tool", broken)
    ended: list[str | None] = []
    with running_hostile("surrogate") as url:
        rows = await drive_against(
            url,
            tmp_path,
            request_timeout=DEFAULT_REQUEST_TIMEOUT,
            on_session_end=lambda _i, why: ended.append(why),
        )
    assert ended == [L.HARNESS_ERROR] * 2
    assert [r["label"] for r in rows] == [L.OK_TOOL_CALL] * 2


# ---- a huge answer never stalls the other streams -------------------------------------------


async def test_a_1mb_answer_never_makes_the_other_streams_time_out(tmp_path: Path) -> None:
    """The first request gets 1,000,000 x's; three others stream slowly meanwhile (an event
    every 50 ms for a second). Classified on the event loop at full length, the x's took
    seconds: the others' reads stalled past the read timeout and were recorded as the
    server's timeouts."""
    with running_hostile("huge-first") as url:
        rows = await drive_against(url, tmp_path, sessions=4, request_timeout=2.0)
    assert len(rows) == 5  # the corrupted turn is sent again (--on-corruption retry)
    assert [r["transport_error"] for r in rows] == [None] * 5
    huge = next(r for r in rows if len(r["content"]) == 1_000_000)
    assert huge["label"] == L.REPETITION
    assert huge["evidence"]["scored_windows"] is True
    assert sorted(r["label"] for r in rows if r is not huge) == [L.OK_TEXT] * 4


def test_long_texts_are_scored_in_windows_with_offsets_in_the_whole_text() -> None:
    from harness.verdict import SCORE_MAX_CHARS, classify_turn

    table = "\n".join(f"line {i}: value {i * 7919 % 10007}" for i in range(6000))
    assert len(table) > 2 * SCORE_MAX_CHARS
    clean = classify_turn(table)
    assert clean.label == L.OK_TEXT
    assert clean.evidence["scored_windows"] is True
    loop = "\n" + "the loop again and " * 300
    tail = classify_turn(table + loop)  # in the tail window
    assert tail.label == L.REPETITION
    assert tail.evidence["offset"] == len(table) + 1
    head = classify_turn(table[:5000] + loop + table[5000:])  # in the head window
    assert head.label == L.REPETITION
    assert head.evidence["offset"] == 5001


# ---- limits: too_large, the total timeout, partial text kept ---------------------------------


async def test_an_endless_stream_is_cut_at_the_answer_limit_keeping_what_arrived(
    tmp_path: Path,
) -> None:
    with running_hostile("endless") as url:
        out = await ask(url, limits=Limits(max_answer_bytes=200_000))
    assert out.failure is not None
    assert out.failure.kind == "too_large", out.failure
    assert "--max-answer-bytes" in out.failure.message
    assert 150_000 < len(out.content) <= 200_000
    assert set(out.content) == {"x"}


async def test_a_line_without_end_is_cut_at_the_line_limit(tmp_path: Path) -> None:
    with running_hostile("endless-line") as url:
        out = await ask(url, limits=Limits(max_line_bytes=100_000))
    assert out.failure is not None
    assert out.failure.kind == "too_large", out.failure
    assert "--max-line-bytes" in out.failure.message


async def test_the_total_timeout_can_be_short_and_keeps_the_partial_text() -> None:
    with running_hostile("trickle") as url:
        out = await ask(url, limits=Limits(total_timeout_s=1.5))
    assert out.failure is not None
    assert out.failure.kind == "timeout", out.failure
    assert "1.5s" in out.failure.message
    assert out.content
    assert set(out.content) == {"x"}


async def test_too_large_rows_keep_their_text_in_a_run(tmp_path: Path) -> None:
    with running_hostile("endless") as url:
        rows = await drive_against(
            url, tmp_path, sessions=1, limits=Limits(max_answer_bytes=50_000)
        )
    assert rows
    assert all(r["label"] == L.TRANSPORT_ERROR for r in rows)
    assert all(str(r["transport_error"]).startswith("too_large:") for r in rows)
    assert all(len(r["content"]) > 10_000 for r in rows)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_the_limit_flags_reach_every_client(tmp_path: Path, workers: str) -> None:
    out = tmp_path / "run"
    with running_hostile("trickle") as url:
        done = harness("run", "--endpoint", url, "--model", "m", "--sessions", "2",
                       "--turns", "1", "--out", str(out), "--workers", workers,
                       "--total-timeout", "1", "--request-timeout", "5")  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]  # every turn failed: cannot be judged
    rows = read_turns(out / "turns.jsonl")
    assert len(rows) == 2 * 3  # 3 attempts per session
    assert all("took longer than 1s (--total-timeout)" in r["transport_error"] for r in rows)
    assert all(r["content"].startswith("x") for r in rows)


# ---- compression -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_compression_is_not_asked_for(stream: bool) -> None:
    with running_hostile("gzip") as url:
        out = await ask(url, stream=stream)
        seen = await stats(url)
    assert seen["accept_encoding"] == "identity"
    assert out.failure is None
    assert out.content == "All done."


@pytest.mark.parametrize("stream", [True, False])
async def test_a_body_compressed_anyway_is_decompressed(stream: bool) -> None:
    with running_hostile("gzip-always") as url:
        out = await ask(url, stream=stream)
    assert out.failure is None, out.failure
    assert out.content == "All done."


@pytest.mark.parametrize("stream", [True, False])
async def test_a_compression_bomb_stops_at_the_answer_limit(stream: bool) -> None:
    with running_hostile("gzip-bomb") as url:
        out = await ask(url, stream=stream, limits=Limits(max_answer_bytes=1 << 20))
    assert out.failure is not None
    assert out.failure.kind == "too_large", out.failure


# ---- sessions above the concurrency start as capacity allows ---------------------------------


class _Watched(Session):
    """A session that notes when it starts and ends (in ``events``)."""

    events: list[tuple[str, int]] = []

    async def run(self) -> None:
        self.events.append(("start", self.plan.index))
        try:
            await super().run()
        finally:
            self.events.append(("end", self.plan.index))


async def _drive_watched(
    url: str, tmp_path: Path, sessions: int, concurrency: int
) -> tuple[list[tuple[str, int]], list[int]]:
    events: list[tuple[str, int]] = []
    finished: list[int] = []

    def make(plan: SessionPlan, shared: Shared) -> Session:
        session = _Watched(plan, shared)
        session.events = events
        return session

    await drive_against(
        url,
        tmp_path,
        sessions=sessions,
        concurrency=concurrency,
        max_turns=4,
        request_timeout=DEFAULT_REQUEST_TIMEOUT,
        make_session=make,
        on_session_end=lambda index, _why: finished.append(index),
    )
    return events, finished


def _most_active(events: list[tuple[str, int]]) -> int:
    active = most = 0
    for kind, _ in events:
        active += 1 if kind == "start" else -1
        most = max(most, active)
    return most


async def test_sessions_above_the_concurrency_start_as_others_end(
    tmp_path: Path, sim_url: str
) -> None:
    events, finished = await _drive_watched(sim_url, tmp_path, sessions=16, concurrency=4)
    assert _most_active(events) == 4
    starts = [i for kind, i in events if kind == "start"]
    assert starts == list(range(16))  # in plan order
    first_end = events.index(next(e for e in events if e[0] == "end"))
    assert first_end < events.index(("start", 15))  # sessions finish all along the run
    assert sorted(finished) == list(range(16))


async def test_sessions_within_the_concurrency_all_start_at_once(
    tmp_path: Path, sim_url: str
) -> None:
    events, _ = await _drive_watched(sim_url, tmp_path, sessions=6, concurrency=6)
    assert [kind for kind, _ in events[:6]] == ["start"] * 6


async def test_retry_after_is_honoured(tmp_path: Path) -> None:
    """The first answer is a 503 with Retry-After: 1; the default backoff would wait 0.5 s."""
    with running_hostile("retry-after") as url:
        rows = await drive_against(url, tmp_path, sessions=1)
    assert [r["label"] for r in rows] == [L.TRANSPORT_ERROR, L.OK_TEXT]
    assert rows[1]["sent_at"] - rows[0]["sent_at"] >= 0.99


def test_retry_after_values() -> None:
    from harness.client.chat import retry_after

    assert retry_after("3") == 3.0
    assert retry_after(None) is None
    assert retry_after("soon") is None
    assert retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past
