"""One worker process (``python -m harness.pool.child``): drives its shard of a variant's sessions.

Started by ``harness.pool.parent.WorkerPool``. It reads one ``Job`` (a length-prefixed pickle) on
stdin, runs ``drive()`` on its shard with its own client, and sends back on stdout, in one
batch per turn of its event loop: every finished turn's ``turns.jsonl`` line with its
counts, transcript rows, each session's end, and at last its self-report. When its stdin
closes (the parent stopped it, or died) it cancels its ``drive()``: the turns in flight are
recorded as cancelled and sent like the others. Until then the parent may send it more
requests in flight (``GROW``), when another worker has fewer sessions left than its share.
Ctrl-C reaches it as it reaches the parent; it ignores SIGINT and waits for the parent to stop
it, so its turns are not cut off. Anything else written to stdout goes to stderr.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import pickle
import resource
import signal
import struct
import sys
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import orjson

from harness.client.chat import ChatClient
from harness.drive.driver import DriveOptions, Progress, drive
from harness.drive.session import ACTIVE_TRANSCRIPTS, SessionPlan
from harness.drive.trace_session import sessions_for
from harness.record.transcripts import TRANSCRIPTS_FILE, TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.workload.scenario import Scenario

log = logging.getLogger(__name__)

HEADER = struct.Struct(">I")  # the length of the pickle that follows
READY = b"harness-worker-ready\n"  # a worker's first bytes: imported, waiting for its job
GROW = "grow"  # the parent's message: more requests in flight for this worker


@dataclass(frozen=True)
class ClientSpec:
    """How a worker builds its client (``ChatClient``; ``RawClient`` around it in raw mode)."""

    base_url: str
    model: str
    api_key: str | None = None
    max_connections: int = 256
    request_timeout: float = 120.0
    api: str = "chat"
    drop_bos: bool = False  # raw mode: the server adds its own BOS (rawmode.check_rendering)


@dataclass(frozen=True)
class SessionSource:
    """How a worker builds its sessions (``trace_session.sessions_for``)."""

    workload: Path | None = None
    mode: str = "replay"
    pace: str = "recorded"
    api: str = "chat"
    seed: int = 1


@dataclass(frozen=True)
class TranscriptSpec:
    """The ``TranscriptLog`` settings; a worker's log sends its rows to the parent's."""

    model: str
    stream: bool
    dialect: str
    keep_all: bool = False


@dataclass(frozen=True)
class Job:
    """Everything one worker needs (sent pickled on its stdin)."""

    worker: int
    workers: int
    board: str  # the in-flight board's file
    client: ClientSpec
    scenario: Scenario
    plans: tuple[SessionPlan, ...]
    base: dict[str, Any]
    options: DriveOptions
    source: SessionSource
    transcripts: TranscriptSpec | None
    log_level: int = logging.WARNING


class InflightBoard:
    """Requests in flight per worker, one 8-byte slot each in a file every worker maps."""

    def __init__(self, path: str, slot: int, slots: int) -> None:
        with open(path, "r+b") as fh:
            self._map = mmap.mmap(fh.fileno(), 8 * slots)
        self._view = memoryview(self._map).cast("q")
        self.slot = slot

    @staticmethod
    def create(slots: int) -> str:
        """A zeroed board file for ``slots`` workers; the caller removes it."""
        fd, path = tempfile.mkstemp(prefix="harness-inflight-")
        with os.fdopen(fd, "wb") as fh:
            fh.write(bytes(8 * slots))
        return path

    def publish(self, own: int) -> int:
        """Set this worker's count; return the total over all workers."""
        self._view[self.slot] = own
        return sum(self._view)

    def close(self) -> None:
        self._view.release()
        self._map.close()


class Channel:
    """Messages to the parent, batched: one frame per turn of the event loop."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.pending: list[tuple[Any, ...]] = []
        self.scheduled = False
        self.broken = False

    def send(self, msg: tuple[Any, ...]) -> None:
        self.pending.append(msg)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if not self.pending:
            return
        data = pickle.dumps(self.pending, protocol=pickle.HIGHEST_PROTOCOL)
        self.pending = []
        if self.broken:
            return
        try:
            self.out.write(HEADER.pack(len(data)))
            self.out.write(data)
            self.out.flush()
        except (BrokenPipeError, ValueError):  # the parent is gone; stdin closes too
            self.broken = True


class ForwardWriter:
    """The ``TurnWriter`` the sessions see: each record goes to the parent as its line."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.count = 0

    def write(self, record: TurnRecord) -> None:
        self.channel.send(
            (
                "t",
                orjson.dumps(record) + b"\n",
                bool(record.get("corrupted")),
                bool(record.get("transport_error")),
                record.get("repeat", 0),
                record["session"],
            )
        )
        self.count += 1


async def work(job: Job, channel: Channel, limit: asyncio.Semaphore) -> None:
    """Drive the job's sessions, every send holding ``limit``; always end with the
    self-report (``("r", report)``)."""
    spec = job.client
    client = ChatClient(
        spec.base_url,
        model=spec.model,
        api_key=spec.api_key,
        max_connections=spec.max_connections,
        request_timeout=spec.request_timeout,
    )
    sessions_client: Any = client
    if spec.api != "chat":
        from harness.drive.rawmode import RawClient

        sessions_client = RawClient(client, spec.api, job.scenario.dialect, spec.drop_bos)
    src = job.source
    plans = list(job.plans)
    _, make = sessions_for(src.workload, src.mode, src.pace, src.api, job.scenario, src.seed, plans)
    transcripts = None
    if job.transcripts is not None:
        t = job.transcripts
        transcripts = TranscriptLog(
            Path(TRANSCRIPTS_FILE),  # never opened: the rows go to the parent's log
            job.base,
            model=t.model,
            stream=t.stream,
            dialect=t.dialect,
            keep_all=t.keep_all,
            sink=lambda line: channel.send(("x", line)),
        )
    board = InflightBoard(job.board, job.worker, job.workers)
    progress = Progress()
    token = ACTIVE_TRANSCRIPTS.set(transcripts)
    try:
        await drive(
            sessions_client,
            job.scenario,
            plans,
            cast(TurnWriter, ForwardWriter(channel)),
            job.base,
            job.options,
            progress,
            on_session_end=lambda index, why: channel.send(("s", index, why)),
            make_session=make,
            board=board,
            limit=limit,
        )
    finally:
        ACTIVE_TRANSCRIPTS.reset(token)
        with contextlib.suppress(Exception):
            await client.aclose()
        board.close()
        report = dict(progress.harness_self or {})
        report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        channel.send(("r", report))
        channel.flush()


async def serve(out: IO[bytes]) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
        job: Job = pickle.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError:
        return 0  # stopped before it was given a job
    logging.basicConfig(
        level=job.log_level,
        format=f"%(levelname)s worker {job.worker + 1}/{job.workers} %(name)s: %(message)s",
    )
    channel = Channel(out)
    limit = asyncio.Semaphore(job.options.concurrency)
    task = asyncio.create_task(work(job, channel, limit))
    stop = asyncio.create_task(listen(reader, limit))  # returns at EOF: the parent says stop
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
    stop.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the variant
        traceback.print_exc()
        channel.send(("e", f"{type(exc).__name__}: {exc}"))
        channel.flush()
        return 1
    return 0


async def listen(reader: asyncio.StreamReader, limit: asyncio.Semaphore) -> None:
    """The parent's messages after the job, until its end of stdin closes: ``(GROW, n)``
    gives this worker ``n`` more requests in flight (permits another worker can no longer
    use)."""
    while True:
        try:
            size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
            kind, n = pickle.loads(await reader.readexactly(size))
        except asyncio.IncompleteReadError:
            return
        if kind == GROW:
            for _ in range(n):
                limit.release()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us, after Ctrl-C too
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the frames
    out.write(READY)
    out.flush()
    return asyncio.run(serve(out))


if __name__ == "__main__":
    sys.exit(main())
