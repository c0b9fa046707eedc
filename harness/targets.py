"""Bring one variant's server up, check it is ready, tear it down.

``SimTarget`` launches ``harness sim`` as a child process group with the variant's levels as
its flags; ``EndpointTarget`` uses a server that is already up. Either way the server is
ready once a readiness URL answers 200. A launched server is always stopped: on success, on
error and on Ctrl-C (the whole process group is signalled).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import httpx

from harness.errors import InfrastructureError, UsageError
from harness.matrix import Variant

log = logging.getLogger(__name__)

READINESS_PATHS = ("/health_generate", "/health", "/v1/models")

#: Every server process group this process started and has not stopped yet; killed at exit
#: so that nothing is left running whatever way the harness ends.
_LIVE: set[subprocess.Popen[bytes] | None] = set()


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE):
        if proc is not None and proc.poll() is None:
            stop_group(proc, grace_s=3.0)


async def wait_ready(
    base_url: str,
    *,
    timeout_s: float,
    paths: tuple[str, ...] = READINESS_PATHS,
    alive: Any = None,
    interval_s: float = 0.2,
) -> str:
    """Poll the readiness paths until one answers 200; return it. ``alive()`` False fails fast."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(base_url=base_url, timeout=5.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                raise InfrastructureError(f"server at {base_url} exited while starting ({last})")
            for path in paths:
                try:
                    resp = await http.get(path)
                except httpx.HTTPError as exc:
                    last = f"{path}: {type(exc).__name__}"
                    break  # not listening yet: no point trying the other paths
                if resp.status_code == 200:
                    return path
                last = f"{path}: HTTP {resp.status_code}"
                if resp.status_code != 404:
                    break
            await asyncio.sleep(interval_s)
    raise InfrastructureError(f"server at {base_url} not ready after {timeout_s:.0f}s ({last})")


class EndpointTarget:
    """A server that is already up."""

    def __init__(self, base_url: str, ready_timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.ready_timeout_s = ready_timeout_s

    async def start(self) -> str:
        await wait_ready(self.base_url, timeout_s=self.ready_timeout_s)
        return self.base_url

    async def stop(self) -> None:
        return None


def sim_flags(variant: Variant) -> list[str]:
    """The ``harness sim`` flags for a variant; unknown factors are a usage error."""
    from harness.sim.main import build_parser

    parser = build_parser()
    reserved = {"help", "host", "port", "port_file", "log_level"}
    known = {
        a.dest: a
        for a in parser._actions  # noqa: SLF001 - argparse has no public API for this
        if a.dest not in reserved
    }
    flags: list[str] = []
    for name, level in variant.factors:
        action = known.get(name)
        if action is None or not action.option_strings:
            factors = sorted(k for k, a in known.items() if a.option_strings and k != "help")
            raise UsageError(
                f"factor {name!r} is not a knob of the simulator; its knobs: {', '.join(factors)}"
            )
        if action.choices is not None and level not in action.choices:
            raise UsageError(
                f"factor {name}: level {level!r} is not one of "
                f"{', '.join(map(str, action.choices))}"
            )
        flags += [action.option_strings[-1], level]
    return flags


class SimTarget:
    """``harness sim`` as a child process group on an ephemeral loopback port."""

    def __init__(
        self,
        variant: Variant,
        *,
        log_path: Path,
        extra_args: list[str] | None = None,
        ready_timeout_s: float = 60.0,
    ) -> None:
        self.args = sim_flags(variant) + list(extra_args or [])
        self.log_path = log_path
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.base_url = ""

    async def start(self) -> str:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        fd, port_file = tempfile.mkstemp(prefix="harness-sim-port-")
        os.close(fd)
        os.unlink(port_file)
        cmd = [
            sys.executable,
            "-m",
            "harness.sim",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            port_file,
            *self.args,
        ]
        log.info("starting %s", " ".join(cmd))
        self.proc = subprocess.Popen(
            cmd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _LIVE.add(self.proc)
        try:
            port = await self._read_port(Path(port_file))
            self.base_url = f"http://127.0.0.1:{port}"
            await wait_ready(self.base_url, timeout_s=self.ready_timeout_s, alive=self.alive)
        except BaseException:
            await self.stop()
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(port_file)
        return self.base_url

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    async def _read_port(self, path: Path) -> int:
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise InfrastructureError(
                    "the simulator exited during start-up "
                    f"(code {self.proc.returncode if self.proc else '?'}); "
                    f"see {self.log_path}"
                )
            if path.exists() and path.stat().st_size > 0:
                return int(path.read_text().strip())
            await asyncio.sleep(0.05)
        raise InfrastructureError(
            f"the simulator did not open a port in {self.ready_timeout_s:.0f}s"
        )

    async def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            await asyncio.to_thread(stop_group, proc)
        _LIVE.discard(proc)
        if self._log is not None:
            self._log.close()
            self._log = None


def stop_group(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace_s``."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # stragglers of the group
