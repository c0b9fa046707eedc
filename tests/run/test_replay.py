"""Transcripts (exact requests rebuilt from deltas) and ``harness replay`` against real sims."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from harness.client.chat import ChatClient
from harness.drive.driver import DriveHooks, DriveOptions, Progress, drive
from harness.drive.session import make_plans
from harness.record.rundir import TRANSCRIPTS_FILE
from harness.record.transcripts import TranscriptLog, load_transcripts
from harness.record.turns import TurnWriter, read_turns
from harness.run.execute import execute, write_run_json
from harness.run.options import DEMO_FAULT_SCALE, RunOptions
from harness.run.replay import (
    ReplayOptions,
    format_replay,
    replay,
    sim_args_of,
    target_for_replay,
)
from harness.verdict import classify_turn
from harness.workload.scenario import load_scenario
from tests.cli.test_cli import harness
from tests.run.endpoint_options import endpoint_options

BASE = {"run_id": "t", "variant": "v", "factors": {}, "repeat": 0}


class Proxy:
    """A loopback HTTP proxy to a sim that keeps the raw bytes of every chat request.

    ``rewrite(bytes) -> bytes`` (optional) changes a response that arrived while another
    request was in flight through the proxy.
    """

    def __init__(self, upstream: str, rewrite: Callable[[bytes], bytes] | None = None) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.bodies: list[bytes] = []
        self.inflight = 0
        self.rewritten = 0
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> str:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self._http = aiohttp.ClientSession()
        host, port = self._runner.addresses[0][:2]
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        assert self._http is not None
        body = await request.read()
        chat = request.path.endswith("/chat/completions")
        if chat:
            self.bodies.append(body)
        self.inflight += 1
        crowded = self.inflight > 1
        try:
            async with self._http.request(
                request.method,
                self.upstream + request.path,
                data=body if body else None,
                headers={"content-type": request.headers.get("content-type", "")},
            ) as resp:
                data = await resp.read()
                status = resp.status
                headers = {
                    k: v
                    for k, v in resp.headers.items()
                    if k.lower() in ("content-type", "x-sim-injected")
                }
        finally:
            self.inflight -= 1
        if chat and crowded and self.rewrite is not None and status == 200:
            data = self.rewrite(data)
            self.rewritten += 1
        return web.Response(body=data, status=status, headers=headers)


def small_scenario(sessions: int, turns: int = 6, max_context: int = 12000) -> Any:
    return load_scenario().with_overrides(
        sessions=sessions, steps=turns - 1, max_turns=turns, max_context=max_context
    )


async def drive_with_log(
    url: str, path: Path, sessions: int, *, keep_all: bool, stream: bool = True, seed: int = 3
) -> TranscriptLog:
    scenario = small_scenario(sessions)
    client = ChatClient(url, model="m", request_timeout=20)
    log = TranscriptLog(
        path / TRANSCRIPTS_FILE,
        BASE,
        model="m",
        stream=stream,
        dialect=scenario.dialect,
        keep_all=keep_all,
    )
    try:
        with TurnWriter(path / "turns.jsonl") as writer:
            await drive(
                client,
                scenario,
                make_plans(scenario, sessions, seed=seed),
                writer,
                BASE,
                DriveOptions(concurrency=sessions, stream=stream),
                Progress(),
                DriveHooks(transcripts=log),
            )
    finally:
        log.close()
        await client.aclose()
    return log


@pytest.mark.parametrize("stream", [True, False])
async def test_rebuilt_requests_are_the_bytes_sent(
    make_sim: Callable[..., str], tmp_path: Path, stream: bool
) -> None:
    proxy = Proxy(make_sim(index_k="fp8"))
    url = await proxy.start()
    try:
        await drive_with_log(url, tmp_path, 3, keep_all=True, stream=stream)
    finally:
        await proxy.stop()
    transcripts = load_transcripts(tmp_path / TRANSCRIPTS_FILE)
    assert len(transcripts) == 3
    rebuilt = [t.wire(r["seq"]) for t in transcripts.values() for r in t.rows]
    assert len(proxy.bodies) > 3 * 3  # several turns per session
    assert sorted(rebuilt) == sorted(proxy.bodies)
    # each row stores only what was appended: the file is far smaller than the requests
    assert (tmp_path / TRANSCRIPTS_FILE).stat().st_size < 0.5 * sum(map(len, proxy.bodies))
    # the verdict context is rebuilt too: every recorded response is judged the same again
    for t in transcripts.values():
        for r in t.rows:
            resp = r["response"]
            body = t.body(r["seq"])
            again = classify_turn(
                resp["content"],
                reasoning=resp["reasoning"],
                tool_calls=resp["tool_calls"],
                tools=body["tools"],
                finish_reason=resp["finish_reason"],
                dialect=t.header["dialect"],
                context=t.context(r["seq"]),
            )
            assert again.label == resp["label"]
        assert any(t.context(r["seq"]) for r in t.rows[1:])


async def test_only_corrupted_sessions_are_kept_unless_asked(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    clean = await drive_with_log(make_sim(index_k="fp8"), tmp_path, 3, keep_all=False)
    assert clean.held_sessions == 0  # finished clean sessions are dropped from memory
    assert not (tmp_path / TRANSCRIPTS_FILE).exists()
    bad = await drive_with_log(make_sim(force_fault="salad"), tmp_path, 2, keep_all=False)
    assert bad.held_sessions == 0
    transcripts = load_transcripts(tmp_path / TRANSCRIPTS_FILE)
    assert sorted(k[2] for k in transcripts) == [0, 1]
    attempts = load_scenario().max_attempts
    for t in transcripts.values():
        assert [(r["turn"], r["attempt"]) for r in t.rows] == [(0, a) for a in range(attempts)]
        assert all(r["response"]["corrupted"] for r in t.rows)
        assert all(r["messages"] == [] for r in t.rows[1:])  # re-sends add no message


async def _fault_run(url: str, out: Path, sessions: int, **opts: Any) -> RunOptions:
    scenario = small_scenario(sessions, turns=8, max_context=16000)
    options = endpoint_options(scenario, out, url, sessions, **opts)
    write_run_json(options, "r1")
    await execute(options, "r1", Progress())
    return options


#: With this scale the sim's race corrupts about one response in five at 40 in flight and
#: one in a hundred or fewer alone (its odds follow a logistic step in the requests in flight).
LOAD_SCALE = 9600.0


async def test_replay_corrupts_under_load_and_not_alone(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    await _fault_run(url, tmp_path, 40)
    rows = read_turns(tmp_path / "turns.jsonl")
    bad = [r for r in rows if r["corrupted"]]
    assert bad
    worst = max(bad, key=lambda r: r["prompt_tokens"] or 0)  # the longest context
    result = await replay(
        ReplayOptions(
            run_dir=tmp_path,
            session=worst["session"],
            turn=worst["turn"],
            attempt=worst["attempt"],
            count=48,
            load=40,
            endpoint=url,
        )
    )
    alone, loaded = result["alone"], result["under_load"]
    assert alone["sends"] == loaded["sends"] == 48
    assert alone["transport_errors"] == loaded["transport_errors"] == 0
    assert loaded["corrupted"] > alone["corrupted"]
    assert alone["corrupted"] <= 9
    assert loaded["inflight_median"] > 20
    saved = json.loads(Path(result["path"]).read_text())  # noqa: ASYNC240 - a test
    assert saved["alone"] == alone
    assert saved["turn"] == worst["turn"]
    assert "under load (40)" in format_replay(result)


async def test_replay_defaults_to_the_first_corrupted_turn(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(force_fault="salad")
    await _fault_run(url, tmp_path, 2)
    result = await replay(ReplayOptions(run_dir=tmp_path, session=1, count=3, endpoint=url))
    assert (result["turn"], result["attempt"]) == (0, 0)
    assert result["alone"]["corrupted"] == 3
    assert result["under_load"] is None


def _fault_target(tmp_path: Path) -> Path:
    path = tmp_path / "faulty.toml"
    path.write_text(
        """name = "sim"
mode = "launch"
model = "m"
[launch]
command = ["{python}", "-m", "harness.sim", "--host", "{host}", "--port", "{port}",
           "--model", "{model}"]
stop_grace_s = 5
[ready]
timeout_s = 60
interval_s = 0.2
[factors.fault.salad]
args = ["--force-fault", "salad"]
[factors.fault.none]
args = []
"""
    )
    return path


@pytest.mark.slow
def test_cli_run_confirm_then_replay_relaunches_the_server(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = harness(
        "run", "--target", str(_fault_target(tmp_path)), "--ab", "fault=salad",
        "--sessions", "2", "--turns", "2", "--speed", "50", "--no-progress", "--confirm",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    confirm = [json.loads(x) for x in (out / "confirm.jsonl").read_text().splitlines()]
    bad = [r for r in read_turns(out / "turns.jsonl") if r["corrupted"]]
    assert len(confirm) == len(bad) > 0
    assert {r["status"] for r in confirm} == {"reproduces_alone"}
    assert "re-sent alone" in (out / "report.md").read_text()
    # the corrupted sessions, each a ready-to-run line, on the terminal and in report.md
    ready = f"harness replay {out} --session "
    assert ready in proc.stdout
    md = (out / "report.md").read_text()
    assert "## Reproduce a corrupted session" in md
    listed = [x for x in md.splitlines() if x.startswith(ready)]
    assert len(listed) == len(bad_sessions(out))
    assert not any("--variant" in x for x in listed)  # one variant: no need to name it

    again = harness("replay", str(out), "--session", "1", "--count", "2", "--load", "2")
    assert again.returncode == 0, again.stderr
    assert "alone" in again.stdout
    assert "under load (2)" in again.stdout
    [saved] = (out / "replays").glob("*.json")
    result = json.loads(saved.read_text())
    assert result["server"] == "relaunched"
    assert result["alone"]["corrupted"] == result["under_load"]["corrupted"] == 2

    missing = harness("replay", str(out), "--session", "7")
    assert missing.returncode == 2
    assert "no transcript of session 7" in missing.stderr


def bad_sessions(run: Path) -> set[tuple[str, int, int]]:
    return {(r["variant"], r["repeat"], r["session"])
            for r in read_turns(run / "turns.jsonl") if r["corrupted"]}  # fmt: skip


@pytest.mark.slow
def test_a_replay_launches_the_simulator_exactly_as_the_demo_did(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = harness(
        "run", "--demo", "--sessions", "2", "--turns", "2", "--speed", "50", "--no-progress",
        "--out", str(out),
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert meta["sim_args"] == [
        "--seed",
        "1",
        "--speed",
        "50.0",
        "--fault-scale",
        str(DEMO_FAULT_SCALE),
    ]
    label = meta["variants"][0]["label"]
    command = target_for_replay(out, meta, label, None).describe()["command"]
    assert command[-len(meta["sim_args"]) :] == meta["sim_args"]
    # a folder from before run.json kept them: the demo's fault scale all the same
    old = {k: v for k, v in meta.items() if k != "sim_args"}
    assert sim_args_of(old)[-2:] == ["--fault-scale", str(DEMO_FAULT_SCALE)]
