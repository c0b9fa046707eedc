"""Workload features against a real simulator: shared prefixes, forks, think time, capacity."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.session import Session, make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import Scenario, load_scenario

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}


async def _drive(
    url: str, tmp_path: Path, scenario: Scenario, seed: int = 3
) -> tuple[list[Session], list[dict[str, Any]]]:
    client = ChatClient(url, model="m", request_timeout=30)
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            done = await drive(
                client,
                scenario,
                make_plans(scenario, scenario.sessions, seed=seed),
                writer,
                BASE,
                DriveOptions(concurrency=scenario.sessions),
                Progress(),
            )
    finally:
        await client.aclose()
    return done, read_turns(tmp_path / "turns.jsonl")


def _small(**changes: Any) -> Scenario:
    base = {"sessions": 6, "steps": 5, "max_turns": 8, "max_context": 12_000}
    return load_scenario().with_overrides(**{**base, **changes})


def _first_turns(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for r in sorted(rows, key=lambda r: (r["session"], r["turn"], r["attempt"])):
        out.setdefault(r["session"], r)
    return out


def test_plans_by_default_are_unchanged() -> None:
    scenario = load_scenario()
    plans = make_plans(scenario, 8, seed=3)
    assert all(p.parent is None and p.group is None and p.prefix_seed is None for p in plans)
    assert all(p.think_s(t) == 0.0 for p in plans for t in range(5))
    assert len({p.seed for p in plans}) == 8


def test_prefix_groups_and_families_in_plans() -> None:
    scenario = _small(sessions=12, prefix_groups=2, branches=3, branch_at=2)
    plans = make_plans(scenario, 12, seed=5)
    roots = [p for p in plans if p.parent is None]
    assert [p.index for p in roots] == [0, 3, 6, 9]
    for p in plans:
        if p.parent is not None:
            root = plans[p.parent]
            assert p.prefix_seed == root.prefix_seed
            assert p.task == root.task
            assert p.seed_for(1) == root.seed
            assert p.seed_for(2) == p.seed != root.seed
    assert {p.group for p in roots} == {0, 1}
    assert plans[0].prefix_seed == plans[6].prefix_seed != plans[3].prefix_seed


async def test_shared_prefix_groups_hit_the_prefix_cache(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    (tmp_path / "g").mkdir()
    (tmp_path / "n").mkdir()
    _, grouped = await _drive(url, tmp_path / "g", _small(prefix_groups=1, max_turns=2))
    url = make_sim(index_k="fp8")  # a fresh cache
    _, alone = await _drive(url, tmp_path / "n", _small(max_turns=2))
    g_first = _first_turns(grouped)
    n_first = _first_turns(alone)
    # every session's first request carries ~2k prompt tokens
    assert all(r["prompt_tokens"] > 1500 for r in g_first.values())
    shared = sorted(r["cached_tokens"] / r["prompt_tokens"] for r in g_first.values())
    own = sorted(r["cached_tokens"] / r["prompt_tokens"] for r in n_first.values())
    # one group: all but (at most) the first sessions find the shared system prompt cached
    assert sum(s > 0.7 for s in shared) >= 4
    assert all(s < 0.3 for s in own)  # own prompts: only the tool list can be cached


async def test_forks_take_the_parent_history_and_diverge(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    scenario = _small(sessions=6, branches=3, branch_at=2, max_turns=5, steps=4)
    sessions, rows = await _drive(url, tmp_path, scenario)
    by = {s.plan.index: s for s in sessions}
    first = _first_turns(rows)
    for i in (1, 2, 4, 5):  # the forks
        s = by[i]
        root = by[s.plan.parent]  # type: ignore[index]
        assert first[i]["turn"] == 2
        assert first[i]["branch_of"] == root.plan.index
        # the fork's history up to the branch turn is exactly the root's
        prefix = _history_at(root, 2)
        assert len(prefix) >= 6
        assert s.messages[: len(prefix)] == prefix
        # and the server had it cached: the fork's first request hits most of its prompt
        assert first[i]["cached_tokens"] > 0.6 * first[i]["prompt_tokens"]
        assert s.messages != root.messages  # then they diverge
    assert {r["turn"] for r in rows if r["session"] in (1, 2)} == set(range(2, 5))


def _history_at(session: Session, turn: int) -> list[dict[str, Any]]:
    """The messages a session had before sending ``turn`` (system, user, then 1 + calls each)."""
    msgs = session.messages
    out = msgs[:2]
    i = 2
    for _ in range(turn):
        assistant = msgs[i]
        n = len(assistant.get("tool_calls") or [])
        out += msgs[i : i + 1 + n]
        i += 1 + n
    return out


async def test_think_time_is_seeded_and_recorded(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    scenario = _small(sessions=3, max_turns=4, think_time_s=(0.01, 0.05))
    sessions, rows = await _drive(url, tmp_path, scenario)
    plans = {s.plan.index: s.plan for s in sessions}
    for r in rows:
        expected = plans[r["session"]].think_s(r["turn"])
        assert r["think_s"] == round(expected, 3)
        if r["turn"] == 0:
            assert r["think_s"] == 0.0
        else:
            assert 0.01 <= r["think_s"] <= 0.05
    # seeded: the same plan draws the same pauses
    again = make_plans(scenario, 3, seed=3)
    assert [p.think_s(2) for p in again] == [plans[i].think_s(2) for i in range(3)]


async def test_pressure_plan_reads_the_server_capacity(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8", kv_capacity=48_000)
    scenario = _small(sessions=4, pressure=1.0, steps=4, max_turns=6)
    sessions, rows = await _drive(url, tmp_path, scenario)
    assert all(s.plan.max_context == 12_000 for s in sessions)  # 1.0 x 48k / 4 sessions
    assert {r["kv_capacity"] for r in rows} == {48_000}
    assert max(r["prompt_tokens"] for r in rows) > 9_000
