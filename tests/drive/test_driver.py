"""The session loop and the driver against a real simulator over loopback HTTP."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from harness import labels as L
from harness.client.chat import ChatClient
from harness.drive.driver import START_PER_PASS, DriveHooks, DriveOptions, Progress, drive
from harness.drive.session import Session, SessionPlan, Shared, make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import load_scenario

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}


async def _drive(
    url: str,
    tmp_path: Path,
    sessions: int = 4,
    stream: bool = True,
    on_corruption: str = "retry",
    **overrides: int,
):
    scenario = load_scenario().with_overrides(
        sessions=sessions,
        steps=overrides.get("steps", 5),
        max_turns=overrides.get("turns", 8),
        max_context=overrides.get("max_context", 12000),
    )
    client = ChatClient(url, model="m", request_timeout=20)
    progress = Progress()
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            done = await drive(
                client,
                scenario,
                make_plans(scenario, sessions, seed=3),
                writer,
                BASE,
                DriveOptions(concurrency=sessions, stream=stream, on_corruption=on_corruption),
                progress,
            )
    finally:
        await client.aclose()
    return done, read_turns(tmp_path / "turns.jsonl"), progress


async def test_sessions_grow_their_context_and_finish(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    sessions, rows, progress = await _drive(url, tmp_path)
    assert [s.ended for s in sessions] == ["answered"] * 4
    assert progress.turns == len(rows)
    assert progress.sessions_done == 4
    by_session: dict[int, list[dict]] = {}
    for r in rows:
        by_session.setdefault(r["session"], []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: r["turn"])
        labels = [t["label"] for t in turns]
        assert labels[:-1] == [L.OK_TOOL_CALL] * (len(turns) - 1)
        assert labels[-1] == L.OK_TEXT  # the final answer after the planned steps
        prompts = [t["prompt_tokens"] for t in turns]
        assert prompts == sorted(prompts)
        assert prompts[-1] > 2.5 * prompts[0]
        assert all(t["cached_tokens"] > 0 for t in turns[1:])
        assert all(t["sim_injected"] == "none" and not t["corrupted"] for t in turns)
    # tool results were appended to the history, answering each call by its id
    msgs = sessions[0].messages
    calls = [c["id"] for m in msgs if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    answers = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
    assert calls
    assert calls == answers


async def test_streamed_and_plain_runs_agree(make_sim: Callable[..., str], tmp_path: Path) -> None:
    url = make_sim(index_k="fp8")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    _, streamed, _ = await _drive(url, tmp_path / "a", sessions=2, stream=True)
    _, plain, _ = await _drive(url, tmp_path / "b", sessions=2, stream=False)
    key = lambda r: (r["session"], r["turn"])  # noqa: E731
    assert [(r["content"], r["tool_calls"]) for r in sorted(streamed, key=key)] == [
        (r["content"], r["tool_calls"]) for r in sorted(plain, key=key)
    ]
    assert all(r["itl_s"] is not None for r in streamed if r["completion_tokens"] > 8)


@pytest.mark.parametrize("kind", ["salad", "envelope", "json", "schema", "repetition", "debris"])
async def test_corrupted_turns_are_recorded_and_resent(
    make_sim: Callable[..., str], tmp_path: Path, kind: str
) -> None:
    url = make_sim(force_fault=kind)
    sessions, rows, progress = await _drive(url, tmp_path, sessions=2)
    attempts = load_scenario().max_attempts
    assert len(rows) == 2 * attempts  # every send is a row; each turn re-sent until the cap
    assert sorted(r["attempt"] for r in rows) == sorted(list(range(attempts)) * 2)
    # a turn whose call has no JSON-typed argument gets an envelope fault instead of a JSON one
    expected = {kind, "envelope"} if kind == "json" else {kind}
    assert all(r["corrupted"] and r["sim_injected"] in expected for r in rows), [
        (r["label"], r["content"][:80]) for r in rows if not r["corrupted"]
    ]
    assert [s.ended for s in sessions] == ["attempts exhausted"] * 2
    # the text detector's findings (salad, a loop) are suspects until the judge confirms them
    flagged = (
        progress.suspect_sessions
        if kind in ("salad", "repetition")
        else progress.corrupted_sessions
    )
    assert len(flagged) == 2


async def test_stop_on_corruption_ends_the_session(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(force_fault="salad")
    sessions, rows, _ = await _drive(url, tmp_path, sessions=3, on_corruption="stop")
    assert len(rows) == 3
    assert [s.ended for s in sessions] == ["corrupted"] * 3
    assert {r["label"] for r in rows} == {L.TOKEN_SALAD}


async def test_unreachable_endpoint_becomes_transport_error_rows(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sessions, rows, progress = await _drive(f"http://127.0.0.1:{port}", tmp_path, sessions=2)
    assert len(rows) == 2 * load_scenario().max_attempts
    assert all(
        r["label"] == L.TRANSPORT_ERROR and r["transport_error"].startswith("connect") for r in rows
    )
    assert not any(r["corrupted"] for r in rows)
    assert progress.transport_errors == len(rows)


@pytest.mark.parametrize("concurrency", [2, 6])
async def test_a_session_that_hands_its_slot_on_keeps_no_encoded_history(
    make_sim: Callable[..., str], tmp_path: Path, concurrency: int
) -> None:
    """Sessions encode their history a message at a time (``HistoryEncoder``); one that ends
    while others wait for its slot drops those bytes with its history. With a slot each, the
    sessions keep both (the driver returns them whole)."""
    url = make_sim(index_k="fp8")
    scenario = load_scenario().with_overrides(sessions=6, steps=3, max_turns=4)
    client = ChatClient(url, model="m", request_timeout=20)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            done = await drive(
                client, scenario, make_plans(scenario, 6, seed=3), writer, BASE,
                DriveOptions(concurrency=concurrency), Progress(),
            )  # fmt: skip
    finally:
        await client.aclose()
    assert len(read_turns(tmp_path / "turns.jsonl")) >= 6 * 3
    if concurrency < 6:
        assert all(s.messages == [] and len(s.encoded) == 0 for s in done)
    else:
        assert all(0 < len(s.encoded) <= len(s.messages) for s in done)  # (as last sent)


async def test_sessions_start_a_few_per_pass_of_the_loop(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """2,000 sessions built (and their tasks made) in one pass held the loop, and every time
    stamp, for most of a second: they start START_PER_PASS a pass."""
    url = make_sim(index_k="fp8")
    n = 6 * START_PER_PASS + 3
    scenario = load_scenario().with_overrides(sessions=n, steps=1, max_turns=1)
    loop = asyncio.get_running_loop()
    passes = [0]
    made: list[int] = []  # the pass each session was built in
    tasks: list[int] = []  # the loop's tasks at each pass

    def tick() -> None:
        passes[0] += 1
        tasks.append(len(asyncio.all_tasks(loop)))
        if len(made) < n:
            loop.call_soon(tick)

    def make_session(plan: SessionPlan, shared: Shared) -> Session:
        made.append(passes[0])
        return Session(plan, shared)

    client = ChatClient(url, model="m", request_timeout=20)
    loop.call_soon(tick)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            await drive(
                client, scenario, make_plans(scenario, n, seed=3), writer, BASE,
                DriveOptions(concurrency=n), Progress(), DriveHooks(make_session=make_session),
            )  # fmt: skip
    finally:
        await client.aclose()
    assert len(made) == n
    assert max(Counter(made).values()) <= START_PER_PASS
    assert len(set(made)) >= n // START_PER_PASS
    # their tasks too are made as they start, not all in the first pass
    assert max(b - a for a, b in zip(tasks, tasks[1:], strict=False)) < n // 2
