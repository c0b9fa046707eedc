"""The pressure planner, and cache pressure driving the simulator's race (real sims, loopback)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.session import make_plans
from harness.errors import ConfigError
from harness.record.turns import TurnWriter, read_turns
from harness.target.metrics import parse_prometheus
from harness.workload.pressure import capacity_from_info, plan_pressure, server_capacity
from harness.workload.scenario import load_scenario, parse_scenario

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}
PRESSURE_SCENARIO = Path(__file__).parents[2] / "scenarios" / "cache_pressure.toml"


# ----------------------------------------------------------------------------- the planner


def test_planner_sizes_growth_to_the_pressure() -> None:
    scenario = load_scenario().with_overrides(pressure=1.5, sessions=80)
    plan = plan_pressure(scenario, 2_000_000, 80, "server")
    assert plan.max_context == 37_500
    assert plan.peak_live_tokens == 3_000_000
    cross = plan.crossing_turn
    assert cross is not None
    assert 0 < cross < plan.steps
    assert "pressure 1.5 on 2,000,000 KV tokens (server)" in plan.describe()
    low = plan_pressure(scenario.with_overrides(pressure=0.5), 2_000_000, 80)
    assert low.crossing_turn is None  # never over capacity


def test_planner_says_what_to_change() -> None:
    scenario = load_scenario().with_overrides(pressure=0.1)
    with pytest.raises(ConfigError, match="use at most 66 sessions"):
        plan_pressure(scenario, 2_000_000, 80)
    with pytest.raises(ConfigError, match="use at least 300 sessions"):
        plan_pressure(scenario.with_overrides(pressure=30.0), 10_000_000, 80)


def test_scenario_keys_are_checked() -> None:
    base = {"name": "x", "tools": [{"name": "list_dir"}]}
    s = parse_scenario({**base, "pressure": 2, "think_time_s": [1, 3], "kv_capacity": 500}, "f")
    assert (s.pressure, s.think_time_s, s.kv_capacity) == (2.0, (1.0, 3.0), 500)
    assert parse_scenario({**base, "think_time_s": 2}, "f").think_time_s == (2.0, 2.0)
    for bad, message in (
        ({"pressure": 0}, "'pressure' must be above 0"),
        ({"pressure": "high"}, "'pressure' must be a number"),
        ({"think_time_s": [3, 1]}, "0 <= min <= max"),
        ({"think_time_s": [1, 2, 3]}, r"\[min, max\]"),
        ({"branches": 3}, "'branch_at' must be a turn"),
        ({"branches": 0}, "'branches' must be at least 1"),
        ({"prefix_groups": -1}, "'prefix_groups' must be 0 or more"),
        ({"kv_capacity": 1.5}, "'kv_capacity' must be an integer"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_scenario({**base, **bad}, "f")
    shipped = load_scenario(PRESSURE_SCENARIO)
    assert shipped.pressure
    assert shipped.think_time_s[1] > 0
    assert shipped.branches > 1


def test_capacity_from_server_info_shapes() -> None:
    assert capacity_from_info({"max_total_num_tokens": 123}) == 123
    assert capacity_from_info({"internal_states": [{"max_total_num_tokens": 7}]}) == 7
    assert capacity_from_info({"max_total_num_tokens": True}) is None
    assert capacity_from_info([]) is None


async def test_server_capacity_from_the_sim(make_sim: Callable[..., str]) -> None:
    client = ChatClient(make_sim(kv_capacity=123_456), model="m")
    try:
        assert await server_capacity(client) == 123_456
    finally:
        await client.aclose()


# ----------------------------------------------------------------------------- the mechanism


async def _run(
    url: str,
    tmp: Path,
    pressure: float | None,
    think: tuple[float, float],
    *,
    sessions: int = 8,
    concurrency: int = 8,
    max_context: int = 6_000,
) -> dict[str, Any]:
    """Drive a small pressure scenario; the session corruption count and the sim's counters.

    ``pressure`` None: no plan, every session grows to ``max_context`` tokens."""
    if pressure is None:
        scenario = load_scenario().with_overrides(
            sessions=sessions, steps=6, max_turns=8, start_context=2000, max_context=max_context,
            think_time_s=think,
        )  # fmt: skip
    else:
        scenario = load_scenario(PRESSURE_SCENARIO).with_overrides(
            sessions=sessions, steps=6, max_turns=8, start_context=2000, pressure=pressure,
            think_time_s=think, prefix_groups=0, branches=1,
        )  # fmt: skip
    client = ChatClient(url, model="m", request_timeout=30)
    try:
        with TurnWriter(tmp / "turns.jsonl") as writer:
            await drive(
                client,
                scenario,
                make_plans(scenario, sessions, seed=11),
                writer,
                BASE,
                DriveOptions(concurrency=concurrency),
                Progress(),
            )
    finally:
        await client.aclose()
    rows = read_turns(tmp / "turns.jsonl")
    async with httpx.AsyncClient(base_url=url) as http:
        text = (await http.get("/metrics")).text
    m = parse_prometheus(text)
    causes = dict(re.findall(r'^sim:corrupted_total\{cause="(\w+)"\} (\d+)', text, re.M))
    return {
        "rows": rows,
        "bad_sessions": len({r["session"] for r in rows if r["corrupted"]}),
        "injected": sum(r["sim_injected"] not in (None, "none") for r in rows),
        "loadbacks": m["sim:hicache_loadbacks_total"],
        "evicted": m["sim:kv_evicted_tokens_total"],
        "recomputed": m["sim:kv_recomputed_tokens_total"],
        "causes": {k: int(v) for k, v in causes.items()},
    }


#: Only the modelled pool corrupts; its odds scaled up so a small run shows them.
POOL = {"kv_capacity": 80_000, "calibrated_race": False, "fault_scale": 300.0}
#: the race's odds at their cap (1 in 2 per load-back beside another request), for the tests
#: about where load-backs happen: at the odds above, 75 load-backs with think time raced 0 to
#: 3 times, as the machine's timing decides how many requests decode beside each (at these,
#: 34 to 40 times); docs/pressure_curve.py measures the rates
SURE = {**POOL, "fault_scale": 30_000.0}


async def test_pressure_raises_bf16_corruption_and_fp8_stays_clean(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    results = {}
    for index_k in ("bf16", "fp8"):
        for pressure in (0.5, 3.0):
            out = tmp_path / f"{index_k}-{pressure}"
            out.mkdir()
            url = make_sim(index_k=index_k, **POOL)
            results[index_k, pressure] = await _run(url, out, pressure, (0.0, 0.0))
    low, high = results["bf16", 0.5], results["bf16", 3.0]
    # the workload fits: nothing is evicted, nothing loaded back, nothing corrupted
    assert low["evicted"] == 0
    assert low["loadbacks"] == 0
    assert low["injected"] == 0
    assert max(r["prompt_tokens"] for r in low["rows"]) <= 5_000
    # three times the pool: sessions are evicted to the host tier and loaded back
    assert high["loadbacks"] >= 10
    assert high["injected"] >= 1
    assert high["bad_sessions"] > low["bad_sessions"]
    # every injected fault is the load-back race, and the detector sees them
    assert high["causes"]["loadback"] == high["injected"]
    assert high["causes"]["race"] == 0
    assert high["bad_sessions"] == len(
        {r["session"] for r in high["rows"] if r["sim_injected"] != "none"}
    )
    fp8 = results["fp8", 3.0]
    assert fp8["loadbacks"] >= 10  # the same pressure, the same load-backs ...
    assert fp8["injected"] == 0
    assert fp8["bad_sessions"] == 0


async def test_think_time_sessions_are_evicted_and_loaded_back(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """With HiCache on, idle sessions come back from the host tier; with it off they are
    recomputed and nothing races."""
    on = await _run(make_sim(**SURE), tmp_path, 3.0, (0.02, 0.06))
    assert all(0.02 <= r["think_s"] <= 0.06 for r in on["rows"] if r["turn"] > 0)
    assert on["loadbacks"] >= 10
    assert on["injected"] >= 1
    (tmp_path / "off").mkdir()
    off = await _run(make_sim(hicache="off", **SURE), tmp_path / "off", 3.0, (0.02, 0.06))
    assert off["loadbacks"] == 0
    assert off["recomputed"] > 0
    assert off["injected"] == 0


async def test_at_the_same_load_sessions_that_think_bring_the_race(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """A closed loop of 8 sessions against 24 agent sessions that think between turns, the
    server never seeing more than 8 requests at once and every session growing alike: the
    agents keep three times the context live, so only they make the pool evict and load back,
    and only there does bf16 race (fp8 sees the same load-backs and stays clean)."""
    runs = {}
    for name, sessions, think, index_k in (
        ("closed", 8, (0.0, 0.0), "bf16"),
        ("agents", 24, (0.04, 0.12), "bf16"),
        ("agents-fp8", 24, (0.04, 0.12), "fp8"),
    ):
        (tmp_path / name).mkdir()
        url = make_sim(index_k=index_k, **SURE)
        runs[name] = await _run(url, tmp_path / name, None, think, sessions=sessions)
    closed, agents, fp8 = runs["closed"], runs["agents"], runs["agents-fp8"]
    for run in runs.values():
        assert max(r["inflight"] for r in run["rows"]) <= 8  # the same load on the server
        assert max(r["prompt_tokens"] for r in run["rows"]) <= 6_000  # sessions grow alike
    # 8 x 6k tokens fit the 80k pool; 24 x 6k do not
    assert closed["evicted"] == 0
    assert closed["loadbacks"] == 0
    assert closed["injected"] == 0
    assert all(r["think_s"] > 0 for r in agents["rows"] if r["turn"] > 0)
    assert agents["loadbacks"] >= 10
    assert agents["injected"] >= 1
    assert agents["causes"]["loadback"] == agents["injected"]
    assert agents["bad_sessions"] >= 1
    assert fp8["loadbacks"] >= 10
    assert fp8["injected"] == 0


# ----------------------------------------------------------------------------- the report


def _turn(session: int, turn: int, sent_at: float, prompt: int, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": "r", "variant": "index_k=bf16", "factors": {"index_k": "bf16"}, "repeat": 0,
        "session": session, "turn": turn, "attempt": 0, "sent_at": sent_at, "latency_s": 1.0,
        "prompt_tokens": prompt, "completion_tokens": 100, "cached_tokens": prompt // 2,
        "label": "ok_tool_call", "corrupted": False, "content": "", "kv_capacity": 1000,
        **extra,
    }  # fmt: skip


def test_live_context_and_pressure_from_turns() -> None:
    from harness.analysis.livecontext import cache_summary, live_context_frame
    from harness.analysis.summary import prepare

    rows = [
        _turn(0, 0, 100.0, 400),  # session 0: 400 live at t=0, 500 at t=1
        _turn(0, 1, 3.0 + 100, 600),  # thinks 2 s, then 600 at t=3, 700 at t=4, ends at t=4
        _turn(1, 0, 100.5, 300),  # session 1: 300 at t=0.5, 400 at t=1.5, ends then
    ]
    df = prepare(pd.DataFrame(rows))
    live = live_context_frame(df)
    at = {round(t, 3): v for t, v in zip(live["t"], live["live_tokens"], strict=True)}
    assert at[0.0] == 400
    assert at[0.5] == 700
    assert at[1.0] == 800  # 500 + 300
    assert at[1.5] == 500  # session 1 ended after its answer
    assert at[3.0] == 600  # session 0 stayed live while it thought
    assert at[4.0] == 0
    assert live["pressure"].max() == pytest.approx(0.8)
    summary = cache_summary(df)
    assert summary["cached_token_share"] == pytest.approx((200 + 300 + 150) / 1300)
    assert summary["live_tokens_peak"] == 800
    assert summary["kv_capacity"] == 1000
    assert summary["pressure_peak"] == pytest.approx(0.8)
    assert 0.3 < summary["pressure_mean"] < 0.8


def test_live_context_does_not_depend_on_the_rows_order() -> None:
    """The sessions' turns in any order in the file (workers write them as they finish):
    the same live context, a session's turns taken in the order they were sent."""
    from harness.analysis.livecontext import live_context_frame
    from harness.analysis.summary import prepare

    rows = [_turn(s, t, 100.0 + 2 * t + s / 10, 300 + 200 * t + 7 * s) for s in range(5)
            for t in range(4)]  # fmt: skip
    ordered = live_context_frame(prepare(pd.DataFrame(rows)))
    shuffled = live_context_frame(prepare(pd.DataFrame(rows[::-1][3:] + rows[::-1][:3])))
    pd.testing.assert_frame_equal(ordered, shuffled)
    assert ordered["live_tokens"].iloc[-1] == 0
    assert ordered["live_tokens"].max() == sum(900 + 7 * s for s in range(5))  # last prompts


def test_report_shows_pressure_and_cached_share(tmp_path: Path) -> None:
    from harness.report.build import write_report

    rows = [_turn(s, t, 100.0 + 2 * t + s / 10, 300 + 200 * t) for s in range(4) for t in range(5)]
    rows[7]["corrupted"], rows[7]["label"] = True, "token_salad"
    (tmp_path / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(tmp_path)
    [v] = summary["variants"]
    # all four last prompts (1100) are live at once; each ends right after its answer
    assert v["pressure_peak"] == pytest.approx(4 * 1100 / 1000)
    assert "pressure_over_time" in summary["plots"]
    assert (tmp_path / summary["plots"]["pressure_over_time"]).read_bytes()[:4] == b"\x89PNG"
    md = (tmp_path / "report.md").read_text()
    assert "## Cache" in md
    assert "| index_k=bf16 | " in md
    assert "4.40x" in md
