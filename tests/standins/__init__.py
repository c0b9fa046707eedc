"""Stand-in servers for the target tests, and helpers to run them without leaking processes."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

SERVER = Path(__file__).resolve().parent / "server.py"
HOSTILE = Path(__file__).resolve().parent / "hostile.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sims(marker: str) -> list[tuple[int, str]]:
    """(pid, command line) of the simulators running whose command line holds ``marker``."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "harness.sim" in cmd and marker in cmd:
            found.append((int(pid), cmd))
    return found


def sim_processes(marker: str) -> list[str]:
    """The command lines of the simulators running whose command line holds ``marker``."""
    return [cmd for _, cmd in _sims(marker)]


def sim_pids(marker: str) -> list[int]:
    """The pids of the simulators running whose command line holds ``marker``."""
    return [pid for pid, _ in _sims(marker)]


def group_gone(pgid: int, polls: int = 100) -> bool:
    """True once no process of the group is left (bounded polling, no timing assertion)."""
    for _ in range(polls):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def pid_gone(pid: int, polls: int = 100) -> bool:
    for _ in range(polls):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@contextlib.contextmanager
def running_standin(*flags: str, log: Path | None = None, script: Path = SERVER) -> Iterator[str]:
    """Start server.py (or ``script``) on a free loopback port, wait for /health, yield its
    URL, kill it."""
    port = free_port()
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", str(port), "--max-life", "60", *flags],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            if proc.poll() is not None:
                raise RuntimeError(f"stand-in exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=1):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.05)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if log and not isinstance(out, int):
            out.close()


def running_hostile(mode: str) -> contextlib.AbstractContextManager[str]:
    """The hostile server (hostile.py) in ``mode``, on a free loopback port."""
    return running_standin("--mode", mode, script=HOSTILE)
