"""The harness's self-measurement: histograms, loop lag, send lag, saturation flags, drive()."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.selfreport import LogHistogram, SelfReport
from harness.drive.session import make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.workload.scenario import load_scenario


def test_histogram_quantiles_bracket_the_values() -> None:
    hist = LogHistogram(per_decade=20)
    for _ in range(98):
        hist.add(0.002)
    hist.add(0.5)
    hist.add(1.0)
    p50, p99 = hist.quantile(0.5), hist.quantile(0.99)
    assert p50 is not None
    assert p99 is not None
    # a bucket's upper edge is within one bucket (a factor 10**(1/20)) above the value
    assert 0.002 <= p50 <= 0.002 * 10 ** (1 / 20)
    assert 0.5 <= p99 <= 0.5 * 10 ** (1 / 20)
    assert hist.quantile(1.0) == 1.0
    summary = hist.summary_ms()
    assert summary is not None
    assert summary["max"] == 1000.0
    assert summary["samples"] == 100


def test_histogram_is_fixed_size_and_empty_has_no_quantiles() -> None:
    hist = LogHistogram()
    assert hist.quantile(0.5) is None
    assert hist.summary_ms() is None
    size = len(hist.counts)
    for i in range(10_000):
        hist.add(i * 1e-4)
    hist.add(-1.0)  # clamped, not an error
    hist.add(1e9)  # beyond the top edge: the last bucket
    assert len(hist.counts) == size
    assert hist.n == 10_002


async def test_a_blocked_loop_shows_as_lag_and_saturation() -> None:
    report = SelfReport(interval_s=0.01, lag_limit_ms=50)
    report.start()
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 - blocking the loop on purpose
    await asyncio.sleep(0.05)
    result = report.stop()
    assert result["loop_lag_ms"]["max"] >= 250
    assert result["saturated"] is True
    assert any("event-loop" in w for w in result["warnings"])
    assert not report.running


async def test_an_idle_loop_is_not_saturated() -> None:
    report = SelfReport(interval_s=0.01)
    report.start()
    await asyncio.sleep(0.2)
    result = report.stop()
    assert result["loop_lag_ms"]["samples"] >= 5
    assert result["cpu_percent"] < 90
    assert result["saturated"] is False
    assert result["warnings"] == []
    assert result["send_lag_ms"] is None
    assert result["turns"] == 0


async def test_send_lag_and_pool_waits_through_the_trace_hook(aiohttp_url: str) -> None:
    report = SelfReport()
    report.start()
    connector = aiohttp.TCPConnector(limit=1)  # a pool smaller than the load: requests queue
    async with aiohttp.ClientSession(
        connector=connector, trace_configs=[report.trace_config()]
    ) as http:

        async def one() -> None:
            report.sending()
            async with http.get(aiohttp_url + "/slow") as resp:
                await resp.read()

        await asyncio.gather(*(one() for _ in range(3)))
    result = report.stop()
    assert result["send_lag_ms"]["samples"] == 3
    # the third request waited for two slow answers before it could leave
    assert result["send_lag_ms"]["max"] >= 2 * SLOW_S * 1000 * 0.9
    assert result["pool_wait_ms"]["samples"] >= 2
    assert result["pool_wait_ms"]["max"] >= SLOW_S * 1000 * 0.9


def test_request_sent_without_a_decision_is_ignored() -> None:
    report = SelfReport()
    report.request_sent()
    assert report.send_lag.n == 0


SLOW_S = 0.05


@pytest.fixture
async def aiohttp_url() -> AsyncIterator[str]:
    async def slow(_request: web.Request) -> web.Response:
        await asyncio.sleep(SLOW_S)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_drive_leaves_its_self_report(make_sim: Callable[..., str], tmp_path: Path) -> None:
    url = make_sim()
    scenario = load_scenario().with_overrides(sessions=3, steps=2, max_turns=3, max_context=6000)
    client = ChatClient(url, model="m", request_timeout=20)
    progress = Progress()
    thresholds = gc.get_threshold()
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            await drive(
                client,
                scenario,
                make_plans(scenario, 3, seed=1),
                writer,
                {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0},
                DriveOptions(concurrency=3),
                progress,
            )
    finally:
        await client.aclose()
    assert gc.get_threshold() == thresholds  # raised while driving, restored after
    assert gc.get_freeze_count() == 0  # what existed before was frozen while driving
    rows = read_turns(tmp_path / "turns.jsonl")
    me = progress.harness_self
    assert me is not None
    assert me["turns"] == len(rows) > 0
    assert me["turns_per_s"] > 0
    assert me["wall_s"] > 0
    assert set(me) >= {"loop_lag_ms", "cpu_percent", "loop_cpu_percent", "saturated"}
    if hasattr(client, "observers"):  # a client with the trace hook reports its sends
        assert me["send_lag_ms"]["samples"] == len(rows)
        assert client.observers == []


async def test_drive_leaves_its_self_report_when_cancelled(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim()
    scenario = load_scenario().with_overrides(sessions=2, steps=50, max_turns=60)
    client = ChatClient(url, model="m", request_timeout=20)
    progress = Progress()
    try:
        with TurnWriter(tmp_path / "turns.jsonl") as writer:
            task = asyncio.create_task(
                drive(
                    client,
                    scenario,
                    make_plans(scenario, 2, seed=1),
                    writer,
                    {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0},
                    DriveOptions(concurrency=2),
                    progress,
                )
            )
            for _ in range(200):  # bounded: until a few turns are in
                await asyncio.sleep(0.02)
                if progress.turns >= 2:
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        await client.aclose()
    assert progress.harness_self is not None
    assert progress.harness_self["turns"] >= 2
