"""Several worker processes drive one variant: shards, the same records, stopping, failures.

Real worker processes against a real simulator on loopback; nothing of the client is mocked.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness import labels as L
from harness.client.chat import ChatClient
from harness.drive.driver import DriveHooks, DriveOptions, Progress, drive
from harness.drive.load import Load, Sinks
from harness.drive.permits import Permits
from harness.drive.selfreport import combine
from harness.drive.session import SessionPlan, make_plans
from harness.drive.trace_session import SessionSource
from harness.pool.parent import (
    ClientSpec,
    WorkerError,
    WorkerPool,
    auto_workers,
    drive_workers,
    effective_workers,
    regrant,
    shard,
    split_limit,
)
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import Scenario, load_scenario

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}
SAME = ("session", "turn", "attempt", "label", "corrupted", "content", "tool_calls",
        "prompt_tokens", "finish_reason", "sim_injected", "branch_of")  # fmt: skip


def _small(**changes: Any) -> Scenario:
    base = {"sessions": 8, "steps": 5, "max_turns": 7, "max_context": 12_000}
    return load_scenario().with_overrides(**{**base, **changes})


def _load(
    spec: ClientSpec, scenario: Scenario, plans: list[SessionPlan], options: DriveOptions
) -> Load:
    """One variant's load: its permits ``options.concurrency``."""
    permits = Permits(options.concurrency)
    return Load(spec, scenario, tuple(plans), BASE, options, SessionSource(), permits)


def _key(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(tuple(str(r.get(k)) for k in SAME) for r in rows)


async def _run(
    url: str,
    path: Path,
    scenario: Scenario,
    workers: int,
    concurrency: int | None = None,
    on_corruption: str = "retry",
) -> tuple[Progress, dict[int, str | None]]:
    plans = make_plans(scenario, scenario.sessions, seed=3)
    limit = concurrency or scenario.sessions
    options = DriveOptions(concurrency=limit, on_corruption=on_corruption)
    progress = Progress()
    ended: dict[int, str | None] = {}
    with TurnWriter(path) as writer:
        if workers == 1:
            client = ChatClient(url, model="m", request_timeout=30)
            try:
                await drive(
                    client, scenario, plans, writer, BASE, options, progress,
                    DriveHooks(on_session_end=ended.__setitem__),
                )  # fmt: skip
            finally:
                await client.aclose()
        else:
            spec = ClientSpec(url, "m", request_timeout=30)
            await drive_workers(
                workers, _load(spec, scenario, plans, options),
                Sinks(writer, progress, on_session_end=ended.__setitem__),
            )  # fmt: skip
    return progress, ended


def test_shards_keep_fork_families_whole_and_split_the_limit() -> None:
    plans = make_plans(_small(sessions=12, branches=3, branch_at=2), 12, seed=5)
    parts = shard(plans, 3)
    assert [len(p) for p in parts] == [6, 3, 3]  # families 0,9 | 3 | 6
    for part in parts:
        roots = {p.index for p in part if p.parent is None}
        assert all(p.parent in roots for p in part if p.parent is not None)
    assert sorted(p.index for part in parts for p in part) == list(range(12))
    assert len(shard(plans, 10)) == 4  # never more shards than families
    assert effective_workers(8, plans, concurrency=2) == 2
    assert effective_workers(8, plans, concurrency=80) == 4
    assert split_limit(80, [6, 3, 3]) == [40, 20, 20]
    assert split_limit(5, [1, 1]) == [3, 2]
    assert split_limit(2, [5, 1, 1]) == [1, 1, 1]  # at least one each
    assert sum(split_limit(2000, [667, 667, 666])) == 2000


def test_permits_a_worker_cannot_use_go_where_sessions_wait() -> None:
    assert regrant([40, 40], [40, 300]) == ([40, 40], [0, 0])  # both use all they have
    assert regrant([40, 40], [30, 300]) == ([30, 50], [0, 10])
    assert regrant([40, 40], [0, 300]) == ([0, 80], [0, 40])
    assert regrant([40, 40], [0, 45]) == ([0, 45], [0, 5])  # no more than sessions wait
    assert regrant([10, 10, 10], [0, 20, 40]) == ([0, 13, 17], [0, 3, 7])  # where more wait
    assert regrant([10, 10, 10], [0, 10, 5]) == ([0, 10, 5], [0, 0, 0])  # nobody waits
    for limits, left in [([3, 3, 2], [0, 7, 9]), ([1, 1], [0, 1]), ([50, 50, 50], [1, 2, 900])]:
        new, grants = regrant(limits, left)
        assert sum(new) <= sum(limits)
        assert all(n <= max(lim, lft) for n, lim, lft in zip(new, limits, left, strict=True))


async def test_a_worker_left_with_long_sessions_gets_the_others_permits(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    # two shards of four sessions at 2 in flight each: the even sessions (one shard) end
    # after one turn, the odd ones run 6; the odd shard's tail runs at the whole limit
    url = make_sim(index_k="fp8", speed=5.0)
    sc = _small(sessions=8, max_context=40_000)
    plans = [
        replace(p, steps=1, max_turns=1) if p.index % 2 == 0 else replace(p, steps=6, max_turns=6)
        for p in make_plans(sc, 8, seed=3)
    ]
    path = tmp_path / "t.jsonl"
    with TurnWriter(path) as writer:
        await drive_workers(
            2, _load(ClientSpec(url, "m", request_timeout=30), sc, plans, DriveOptions(4)),
            Sinks(writer, Progress()),
        )  # fmt: skip
    rows = read_turns(path)
    assert max(r["inflight"] for r in rows) <= 4  # never more than the variant's limit
    tail = [r["inflight"] for r in rows if r["session"] % 2 == 1 and r["turn"] >= 2]
    assert tail
    assert max(tail) > 2  # more than the odd shard's own share of 2


def test_auto_workers() -> None:
    assert auto_workers(8, cores=4) == 1
    assert auto_workers(80, cores=4) == 1
    assert auto_workers(256, cores=4) == 2
    assert auto_workers(500, cores=8) == 3
    assert auto_workers(2000, cores=2) == 2
    assert auto_workers(2000, cores=1) == 1
    assert auto_workers(2000) >= 1  # the machine's own cores


def test_combined_self_report() -> None:
    def one(turns: int, p99: float, warn: list[str]) -> dict[str, Any]:
        lag = {"p50": 1.0, "p99": p99, "max": p99, "mean": 1.0, "samples": 10}
        return {
            "wall_s": 2.0, "turns": turns, "turns_per_s": turns / 2, "cpu_s": 1.5,
            "cpu_percent": 75.0, "loop_cpu_percent": 70.0 + turns / 100, "loop_lag_ms": lag,
            "send_lag_ms": None, "pool_wait_ms": None, "stale_resends": 1,
            "saturated": bool(warn), "warnings": warn, "peak_rss_mb": 80.0,
        }  # fmt: skip

    parent = {"wall_s": 2.5, "cpu_s": 0.5, "loop_lag_ms": None}
    out = combine([one(100, 5.0, []), one(300, 250.0, ["event-loop lag p99 250 ms"])], parent)
    assert out["turns"] == 400
    assert out["turns_per_s"] == 160.0  # every turn over the variant's wall
    assert out["cpu_s"] == 3.5  # both workers and the parent
    assert out["loop_lag_ms"]["p99"] == 250.0  # the worst worker
    assert out["loop_lag_ms"]["samples"] == 20
    assert out["loop_cpu_percent"] == 73.0
    assert out["stale_resends"] == 2
    assert out["saturated"] is True
    assert out["warnings"] == ["worker 2: event-loop lag p99 250 ms"]
    assert out["workers"] == 2
    assert out["peak_rss_mb"] == 160.0


@pytest.mark.parametrize(
    ("sim", "scenario", "on_corruption"),
    [
        ({"fault_scale": 0.0}, {}, "retry"),
        ({"fault_scale": 0.0}, {"sessions": 9, "branches": 3, "branch_at": 2}, "retry"),
        ({"force_fault": "salad"}, {"sessions": 6, "max_turns": 3}, "retry"),
        ({"force_fault": "json"}, {"sessions": 6}, "stop"),
    ],
    ids=["clean", "forks", "corrupted-retry", "corrupted-stop"],
)
async def test_the_same_records_with_one_and_with_three_workers(
    make_sim: Callable[..., str],
    tmp_path: Path,
    sim: dict[str, Any],
    scenario: dict[str, Any],
    on_corruption: str,
) -> None:
    sc = _small(**scenario)
    one, ended_one = await _run(make_sim(**sim), tmp_path / "one.jsonl", sc, 1, None, on_corruption)
    many, ended_many = await _run(
        make_sim(**sim), tmp_path / "many.jsonl", sc, 3, None, on_corruption
    )
    rows_one, rows_many = read_turns(tmp_path / "one.jsonl"), read_turns(tmp_path / "many.jsonl")
    assert rows_one
    assert _key(rows_many) == _key(rows_one)
    assert ended_many == ended_one
    assert (many.turns, many.corrupted_turns, many.corrupted_sessions, many.sessions_done) == (
        one.turns, one.corrupted_turns, one.corrupted_sessions, one.sessions_done,
    )  # fmt: skip
    assert many.suspect_sessions == one.suspect_sessions
    assert many.harness_self is not None
    assert many.harness_self["workers"] == 3
    assert many.harness_self["turns"] == len(rows_many)
    if sim.get("force_fault"):
        assert any(r["corrupted"] for r in rows_many)
    if scenario.get("branches"):
        assert any(r.get("branch_of") is not None and r["turn"] == 2 for r in rows_many)


async def test_in_flight_counts_all_workers(make_sim: Callable[..., str], tmp_path: Path) -> None:
    url = make_sim(index_k="fp8", speed=5.0)  # slow enough for all requests to overlap
    await _run(url, tmp_path / "t.jsonl", _small(sessions=8, max_turns=3), 2, concurrency=8)
    rows = read_turns(tmp_path / "t.jsonl")
    assert max(r["inflight"] for r in rows) > 4  # each worker alone has 4 in flight at most


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wait_for_turns(path: Path, n: int) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() or len(path.read_bytes().splitlines()) < n:
        assert time.monotonic() < deadline, f"fewer than {n} turns in {path} after 60 s"
        time.sleep(0.05)


async def _until_turns(path: Path, n: int) -> None:
    await asyncio.to_thread(_wait_for_turns, path, n)


async def test_cancel_records_the_turns_in_flight(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8", speed=5.0)
    sc = _small(sessions=6, max_turns=20, steps=20, max_context=40_000)
    pool = WorkerPool(2)
    progress = Progress()
    path = tmp_path / "t.jsonl"
    with TurnWriter(path) as writer:
        load = asyncio.create_task(
            drive_workers(
                pool,
                _load(ClientSpec(url, "m"), sc, make_plans(sc, 6, seed=3), DriveOptions(6)),
                Sinks(writer, progress),
            )
        )
        await _until_turns(path, 6)
        pids = [p.pid for p in pool.procs]
        load.cancel()
        with pytest.raises(asyncio.CancelledError):
            await load
    rows = read_turns(path)
    stopped = "cancelled: the run was stopped"
    cancelled = [r for r in rows if (r["transport_error"] or "").startswith(stopped)]
    # a session's turn in flight is recorded as cancelled (one whose answer had come says it
    # was stopped while the answer was classified): one row each, none a harness error
    assert cancelled
    assert len({r["session"] for r in cancelled}) == len(cancelled)
    assert not [r for r in rows if r["label"] == L.HARNESS_ERROR]
    assert progress.turns == len(rows)
    assert progress.sessions_done == 6
    assert progress.harness_self is not None
    assert progress.harness_self["workers"] == 2
    assert not any(_alive(pid) for pid in pids)


async def test_a_worker_that_dies_stops_the_variant(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8", speed=5.0)
    sc = _small(sessions=6, max_turns=20, steps=20, max_context=40_000)
    pool = WorkerPool(2)
    path = tmp_path / "t.jsonl"
    with TurnWriter(path) as writer:
        load = asyncio.create_task(
            drive_workers(
                pool,
                _load(ClientSpec(url, "m"), sc, make_plans(sc, 6, seed=3), DriveOptions(6)),
                Sinks(writer, Progress()),
            )
        )
        await _until_turns(path, 6)
        victim, other = pool.procs
        os.kill(victim.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match="worker 1 of 2 exited"):
            await load
    rows = read_turns(path)
    # the other worker was stopped: its turns in flight are recorded as cancelled (one whose
    # answer had come says it was stopped while the answer was classified)
    stopped = "cancelled: the run was stopped"
    assert any((r["transport_error"] or "").startswith(stopped) for r in rows)
    assert not _alive(other.pid)
    assert all(r["label"] in (L.OK_TOOL_CALL, L.OK_TEXT, L.TRANSPORT_ERROR) for r in rows)


async def test_no_sessions_start_no_worker(tmp_path: Path) -> None:
    pool = WorkerPool(2)
    progress = Progress()
    with TurnWriter(tmp_path / "t.jsonl") as writer:
        ended = await drive_workers(
            pool, _load(ClientSpec("http://127.0.0.1:9", "m"), _small(), [], DriveOptions(4)),
            Sinks(writer, progress),
        )  # fmt: skip
    assert ended == {}
    assert pool.procs == []
    assert progress.sessions_total == 0
