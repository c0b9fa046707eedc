"""Shared fixtures: a real ``harness sim`` endpoint on 127.0.0.1, port 0, in a thread.

``sim_url``: the base URL ("http://127.0.0.1:PORT") of a sim with the default knobs at a fast
speed. ``make_sim(**overrides)``: start more sims with other ``SimConfig`` fields; all are
shut down at the end of the test. ``make_sim_server(**overrides)`` is the same but returns the
running server (``.url``, ``.app.state.sim``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import uvicorn

from harness.sim.app import create_app
from harness.sim.config import SimConfig

FAST = 200.0  # sim speed in tests: delays are ~ms


class _RunningSim:
    def __init__(self, config: SimConfig) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(1024)
        self.port = self.sock.getsockname()[1]
        self.app = create_app(config)
        self.server = uvicorn.Server(
            uvicorn.Config(
                self.app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2
            )
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the sim did not start")
            time.sleep(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def make_sim_server() -> Iterator[Callable[..., _RunningSim]]:
    """Factory: ``make_sim_server(error_rate=0.3, ...) -> the running sim``."""
    running: list[_RunningSim] = []

    def start(**overrides: Any) -> _RunningSim:
        overrides.setdefault("speed", FAST)
        sim = _RunningSim(SimConfig(**overrides))
        sim.start()
        running.append(sim)
        return sim

    yield start
    for sim in running:
        sim.stop()


@pytest.fixture
def make_sim(make_sim_server: Callable[..., _RunningSim]) -> Callable[..., str]:
    """Factory: ``make_sim(index_k="fp8", force_fault="salad", ...) -> base URL``."""

    def start(**overrides: Any) -> str:
        return make_sim_server(**overrides).url

    return start


@pytest.fixture
def sim_url(make_sim: Callable[..., str]) -> str:
    """Base URL of a sim with the default knobs (bf16, HiCache on, top-k v2), fast."""
    return make_sim()
