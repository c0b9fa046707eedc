"""Judging off the event loop: the same verdicts as on the loop, the model loaded elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import labels as L
from harness.client.chat import ChatClient
from harness.dialects import dsml
from harness.dialects.base import ToolCall
from harness.drive import judging
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.judging import Ask, Failed, Judge, failed_verdict, judge_batch
from harness.drive.session import make_plans
from harness.record.turns import TurnWriter, read_turns
from harness.sim.salad import salad as sim_salad
from harness.workload.scenario import load_scenario

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}
TOOLS = load_scenario().openai_tools()
#: the fields a run's timing sets; every other field of a record is the verdict's or the load's
TIMING = {"sent_at", "ttft_s", "latency_s", "itl_s", "inflight", "run_id"}


def _asks() -> list[Ask]:
    call = ToolCall("read_file", {"path": "src/app.py"})
    prose = "I will read the module that fails first, then fix the import it needs."
    salad = prose + " " + sim_salad(random.Random(4), 600)
    loop = "I will check the file again. " * 40
    raw = dsml.encode_turn(prose, [call])
    server_calls = [{"name": "read_file", "arguments": '{"path": "a.py"}'}]
    bad_calls = [{"name": "read_file", "arguments": '{"path": 3'}]
    asks = []
    for content, calls, source in [
        (prose, [], "server"),
        (prose, server_calls, "server"),
        ("", bad_calls, "server"),
        (salad, [], "server"),
        (loop, [], "server"),
        (raw, [], "raw"),
        (raw, [], "server"),  # markup the server's parser left in the content
        (raw[: len(raw) // 2], [], "raw"),  # a call cut short
        ("", [], "server"),
    ]:
        for tools in (TOOLS, None):
            thought = "Let me think." if content else ""
            asks.append(Ask(content, thought, calls, tools, "stop", "auto", source, None))
    return asks


async def test_the_pool_gives_the_loop_s_verdicts() -> None:
    asks = _asks()
    judge = Judge(2)
    await asyncio.to_thread(judge.wait_ready)
    judge.attach()
    try:
        pooled = await asyncio.gather(*(judge.classify(a) for a in asks))
    finally:
        judge.close()
    assert judge.judged == len(asks)
    assert judge.batches >= 2  # one pass of the loop, spread over both processes
    inline = [a.classify() for a in asks]
    assert pooled == inline
    assert {v.label for v in inline} >= {L.OK_TEXT, L.OK_TOOL_CALL, L.TOKEN_SALAD, L.EMPTY}


async def test_verdicts_reach_their_sessions_a_few_per_pass_of_the_loop() -> None:
    # one process, one batch, one frame of 40 verdicts back: their sessions go on at most
    # RELEASE_PER_PASS a pass (each sends its next request: 64 in one pass stalled the loop)
    asks = (_asks() * 3)[:40]
    judge = Judge(1)
    await asyncio.to_thread(judge.wait_ready)
    judge.attach()
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []
    seen: list[int] = []

    def observe() -> None:  # once a pass: how many verdicts were handed over so far
        seen.append(sum(f.done() for f in futures))
        if seen[-1] < len(futures):
            loop.call_soon(observe)

    try:
        futures = [asyncio.ensure_future(judge.classify(a)) for a in asks]
        loop.call_soon(observe)
        got = await asyncio.gather(*futures)
    finally:
        judge.close()
    assert judge.batches == 1
    assert got == [a.classify() for a in asks]
    steps = [b - a for a, b in zip(seen, seen[1:], strict=False) if b > a]
    assert len(asks) > judging.RELEASE_PER_PASS
    assert max(steps) <= judging.RELEASE_PER_PASS
    assert len(steps) >= len(asks) // judging.RELEASE_PER_PASS


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="niceness is POSIX")
async def test_judging_processes_yield_the_core_to_the_loop() -> None:
    judge = Judge(1)
    await asyncio.to_thread(judge.wait_ready)
    try:
        mine = os.getpriority(os.PRIO_PROCESS, 0)
        theirs = os.getpriority(os.PRIO_PROCESS, judge.pids()[0])
    finally:
        judge.close()
    assert theirs == min(19, mine + judging.JUDGE_NICENESS)


def test_a_classifier_failure_is_its_turn_s_own() -> None:
    bad = Ask(3, "", [], None, None, "auto", "server", None)  # type: ignore[arg-type]
    good = _asks()[0]
    out = judge_batch({}, [bad.wire(-1), good.wire(-1)])
    assert isinstance(out[0], Failed)
    assert out[0].kind == "AttributeError"
    assert out[1] == good.classify()
    verdict = failed_verdict(out[0], session=1, turn=2)
    assert verdict.label == L.HARNESS_ERROR
    assert verdict.evidence["reason"].startswith("classifying the answer: AttributeError")


async def test_a_broken_pool_falls_back_to_the_loop() -> None:
    judge = Judge(1)
    await asyncio.to_thread(judge.wait_ready)
    judge.attach()
    os.kill(judge.pids()[0], signal.SIGKILL)
    asks = _asks()[:4]
    try:
        got = await asyncio.gather(*(judge.classify(a) for a in asks))
    finally:
        judge.close()
    assert judge.broken
    assert got == [a.classify() for a in asks]


async def _run(url: str, out: Path, judges: int) -> list[dict[str, Any]]:
    scenario = load_scenario().with_overrides(sessions=6, steps=4, max_turns=6, max_context=9000)
    client = ChatClient(url, model="m", request_timeout=20)
    try:
        with TurnWriter(out) as writer:
            await drive(
                client,
                scenario,
                make_plans(scenario, 6, seed=5),
                writer,
                BASE,
                DriveOptions(concurrency=6, judges=judges),
                Progress(),
            )
    finally:
        await client.aclose()
    rows = [{k: v for k, v in r.items() if k not in TIMING} for r in read_turns(out)]
    return sorted(rows, key=lambda r: (r["session"], r["turn"], r["attempt"]))


@pytest.mark.parametrize("fault", [None, "salad"])
async def test_records_are_the_same_judged_on_the_loop_or_off_it(
    make_sim: Callable[..., str], tmp_path: Path, fault: str | None
) -> None:
    knobs: dict[str, Any] = {"index_k": "fp8", **({"force_fault": fault} if fault else {})}
    # a fresh simulator each (its prefix cache would remember the first run's prompts)
    on_loop = await _run(make_sim(**knobs), tmp_path / "a.jsonl", judges=0)
    off_loop = await _run(make_sim(**knobs), tmp_path / "b.jsonl", judges=1)
    assert on_loop == off_loop
    assert len(on_loop) > 6
    if fault:
        assert any(r["corrupted"] for r in on_loop)


def test_the_detector_loads_outside_the_driving_process(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """The detector's model (and the classifier's first-call work) is never loaded by the
    process whose event loop drives the sessions: nothing one-time stalls it."""
    url = make_sim(index_k="fp8")
    script = textwrap.dedent(
        f"""
        import asyncio, json
        from pathlib import Path
        from harness.verdict.detector.fitted import model
        from tests.drive.test_judging import _run
        rows = asyncio.run(_run({url!r}, Path({str(tmp_path / "t.jsonl")!r}), judges=1))
        print(json.dumps([model.load.cache_info().currsize, sorted({{r["label"] for r in rows}})]))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    loaded, labels = json.loads(proc.stdout.splitlines()[-1])
    assert loaded == 0
    assert L.OK_TOOL_CALL in labels


def test_shared_judge_is_sized_to_the_machine() -> None:
    assert judging.auto_processes(1) == judging.usable_cores()
    assert judging.auto_processes(10_000) == 1
