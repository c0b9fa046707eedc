"""``python -m harness.sim`` as a real subprocess: port 0, port file, SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from harness.sim.main import bind, build_parser, config_from_args


def test_parser_defaults_are_the_production_setting() -> None:
    config = config_from_args(build_parser().parse_args([]))
    assert (config.index_k, config.hicache, config.topk) == ("bf16", "on", "v2")
    assert config.max_running == 256
    args = build_parser().parse_args(["--index-k", "fp8", "--hicache", "off", "--speed", "5"])
    config = config_from_args(args)
    assert (config.index_k, config.hicache, config.speed) == ("fp8", "off", 5.0)


def test_subprocess_port_file_and_sigterm(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    cmd = [sys.executable, "-m", "harness.sim", "--port", "0", "--port-file", str(port_file)]
    cmd += ["--speed", "100", "--log-level", "warning"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        for _ in range(200):  # up to ~20 s
            if port_file.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        port = int(port_file.read_text())
        assert port > 0
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        body = {"messages": [{"role": "user", "content": "hello there, general question"}]}
        r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=10)
        assert r.status_code == 200
        assert r.headers["x-sim-injected"] in ("none", "salad", "debris", "repetition")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_listening_socket_turns_nagle_off_for_its_connections() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose protocol is TCP by name; with protocol 0
    each answer on a kept-alive connection waited for the client's delayed ACK."""
    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
        client = socket.create_connection(sock.getsockname()[:2])
        conn, _ = sock.accept()
        with client, conn:
            assert conn.proto == socket.IPPROTO_TCP  # what asyncio checks before setting it
    finally:
        sock.close()


def test_fault_rate_flag() -> None:
    config = config_from_args(build_parser().parse_args(["--fault-rate", "0.0003"]))
    assert config.fault_rate == 0.0003
    assert config_from_args(build_parser().parse_args([])).fault_rate is None
