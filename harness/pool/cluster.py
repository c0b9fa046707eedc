"""``--workers ray[:ADDRESS]``: the worker processes placed on the nodes of a Ray cluster.

The parent is the same (``harness.pool.parent``: it deals the sessions, writes every record,
counts the progress); only where its workers run changes. ``ClusterPool`` connects to the
cluster (``ray.init(address=...)``; ``ray`` alone: the cluster ``RAY_ADDRESS`` names, or a
local one), listens on a TCP port of its node, and starts one actor per worker, one CPU each,
spread over the nodes: the actor connects back, proves it was sent by this parent (a random
token), then runs ``python -m harness.pool.child`` with the connection as its standard input
and output, so the worker and its messages are those of ``--workers N`` on one host. Closing
the parent's side for writing is the worker's stop signal, as closing its stdin is locally.

Every node needs the harness installed (the same version) and must reach the server under
test and the parent's node. The in-flight board is a file on the parent's node: a worker on
another node counts in its records only its own requests in flight (``inflight``). Ray is an
optional dependency (``pip install -e '.[ray]'``), imported only here and only when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import subprocess
import sys
from typing import Any

from harness.errors import ConfigError
from harness.pool.parent import WorkerError, WorkerPool
from harness.pool.protocol import READY

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 120.0  # actors placed and connected back (a cold node starts a worker)


class _Host:
    """The Ray actor: one worker process on its node, its stdio the parent's connection."""

    def run(self, host: str, port: int, token: bytes) -> int:
        sock = socket.create_connection((host, port), timeout=30)
        sock.settimeout(None)
        sock.sendall(token)
        child = subprocess.Popen(
            [sys.executable, "-m", "harness.pool.child"], stdin=sock.fileno(), stdout=sock.fileno()
        )
        sock.close()  # the child holds its own copies
        return child.wait()


class _WriteHalf:
    """The parent's writing side of a worker's connection: ``close()`` only ends the writing
    (the worker's EOF, its stop signal); its messages still come back."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._closed = False

    def write(self, data: bytes) -> None:
        self._writer.write(data)

    async def drain(self) -> None:
        await self._writer.drain()

    def is_closing(self) -> bool:
        return self._closed or self._writer.is_closing()

    def close(self) -> None:
        if not self.is_closing():
            self._closed = True
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()


class RemoteWorker:
    """One worker process on a node, as the parent sees a local one."""

    def __init__(
        self, ray: Any, actor: Any, done: Any, reader: asyncio.StreamReader, writer: Any
    ) -> None:
        self._ray, self._actor, self._done = ray, actor, done
        self.stdout = reader
        self._writer = writer
        self.stdin = _WriteHalf(writer)
        self.returncode: int | None = None
        self.pid = -1  # not a pid of this host

    async def wait(self) -> int:
        if self.returncode is None:
            try:
                self.returncode = int(await asyncio.wrap_future(self._done.future()))
            except Exception as exc:  # noqa: BLE001 - a dead actor is a failed worker
                log.debug("worker actor ended: %s", exc)
                self.returncode = -1
            self._writer.close()
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self._ray.kill(self._actor)


class ClusterPool(WorkerPool):
    """Up to ``limit`` workers, one per CPU of the cluster, as Ray actors."""

    def __init__(self, address: str | None, limit: int) -> None:
        super().__init__(limit)
        self.address = address
        self.limit = limit
        self._ray: Any = None

    def _connect(self) -> Any:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "--workers ray needs Ray: pip install 'ray>=2.9' (or the project's [ray] extra)"
            ) from None
        if not ray.is_initialized():
            self._check_reachable()
            try:
                ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise ConfigError(f"--workers ray:{self.address or ''}: {exc}") from None
        resources: dict[str, float] = ray.cluster_resources()
        cpus = int(resources.get("CPU", 1))
        self.size = max(1, min(self.limit, cpus))
        return ray

    def _check_reachable(self) -> None:
        """Refuse at once an address where nothing listens (Ray itself retries for minutes)."""
        if not self.address or ":" not in self.address:
            return
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=10):
                pass
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"--workers ray:{self.address}: no Ray cluster answers there ({exc}); start one "
                "with `ray start --head` or give its address"
            ) from None

    async def start(self) -> None:
        if self.procs:
            return
        loop = asyncio.get_running_loop()
        ray = self._ray = await loop.run_in_executor(None, self._connect)
        host = ray.util.get_node_ip_address()
        tokens = [secrets.token_hex(16).encode() for _ in range(self.size)]
        arrived: dict[bytes, asyncio.Future[Any]] = {t: loop.create_future() for t in tokens}

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                got = await asyncio.wait_for(reader.readexactly(len(tokens[0])), 30)
            except (TimeoutError, asyncio.IncompleteReadError, OSError):
                got = b""
            waiting = arrived.get(got)
            if waiting is None or waiting.done():  # not one of ours
                writer.close()
                return
            waiting.set_result((reader, writer))

        server = await asyncio.start_server(accept, host, 0)
        port = server.sockets[0].getsockname()[1]
        actor_class = ray.remote(num_cpus=1, scheduling_strategy="SPREAD")(_Host)
        actors = [actor_class.remote() for _ in range(self.size)]
        runs = [a.run.remote(host, port, t) for a, t in zip(actors, tokens, strict=True)]
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                for actor, done, token in zip(actors, runs, tokens, strict=True):
                    reader, writer = await arrived[token]
                    ready = await reader.readexactly(len(READY))
                    if ready != READY:
                        raise WorkerError("a worker on the cluster did not start")
                    self.procs.append(RemoteWorker(ray, actor, done, reader, writer))
        except TimeoutError:
            for actor in actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor)
            raise WorkerError(
                f"{self.size - len(self.procs)} of {self.size} workers on the Ray cluster did "
                f"not connect back to {host}:{port} within {CONNECT_TIMEOUT_S:.0f}s"
            ) from None
        finally:
            server.close()
