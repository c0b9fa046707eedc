"""Several worker processes drive one variant's sessions; the parent stays the one writer.

``drive()`` runs every session on one event loop. A turn costs the harness 0.6-1.4 ms of
CPU there (stream parsing, classification, tools, the record: 2-3 times a bare client's), so
one loop tops out at a few hundred to about 1,600 streamed turns per second and lags by more
than a second at 2,000 sessions (docs/performance.md). ``WorkerDriver``, the
``LoadDriver`` (``harness.drive.load``) over processes, runs ``drive_workers()``: it splits
the variant's ``Load`` into shards, one per worker process (``harness.pool.child``), each with
its own event loop, client and ``LocalDriver``:

- **Shards.** Whole fork families (a fork waits for its parent in-process: see
  ``Session._fork``), dealt in turn; the variant's ``Permits`` are split over the shards in
  proportion to their sizes (at least 1 each), one part in each worker's ``Job``. There are
  never more workers than families or than the permits. When a worker has fewer sessions
  left than its part, the parent gives the rest to the workers whose sessions wait
  (``regrant``, a ``Grow``), so the variant keeps its concurrency to the end.
  (``harness.pool.dealing`` has these rules.)
- **Records.** A worker sends what a run writes as it happens: each finished turn as its
  encoded ``turns.jsonl`` line, the transcript rows, each session's end. The parent appends
  them to the one ``turns.jsonl`` (flushed per batch a worker sends: the turns that finished
  together), the transcripts log and, through ``on_session_end``, the sessions log; it counts
  the progress. Lines are whole because one process writes them.
- **In flight.** A memory-mapped file with one slot per worker (``InflightBoard``): each
  record's ``inflight`` is the variant's total, as with one process.
- **Self-report.** Each worker measures itself; the parent combines them
  (``selfreport.combine``).
- **Stopping.** When ``drive_workers()`` is cancelled (Ctrl-C, the server died, the run
  timeout) it closes each worker's stdin; the worker cancels its ``drive()`` (the turns in
  flight are recorded as cancelled), sends what is left and its report, and exits; the parent
  reads all of it, then re-raises. A worker that dies stops the others the same way and
  fails the variant (``WorkerError``). A worker whose parent dies sees its stdin close and
  stops too.

The messages between parent and worker, and their frames over the worker's stdin and stdout,
are ``harness.pool.protocol``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from harness.client.spec import ClientSpec
from harness.drive.inflight import InflightBoard
from harness.drive.load import Load, Sinks
from harness.drive.selfreport import SelfReport, combine
from harness.errors import EndpointRefused, HarnessError, InfrastructureError, ServerUnanswering
from harness.pool.dealing import (
    AUTO_MIN_CONCURRENCY,
    AUTO_PER_WORKER,
    auto_workers,
    effective_workers,
    regrant,
    shard,
    split_limit,
)
from harness.pool.protocol import (
    READY,
    Failed,
    Grow,
    Job,
    LogLine,
    Report,
    SessionEnd,
    TranscriptRow,
    TranscriptSpec,
    Turn,
    encode,
    read_frame,
)

__all__ = [
    "AUTO_MIN_CONCURRENCY",
    "AUTO_PER_WORKER",
    "ClientSpec",
    "InflightBoard",
    "WorkerError",
    "WorkerDriver",
    "WorkerPool",
    "auto_workers",
    "drive_workers",
    "effective_workers",
    "regrant",
    "shard",
    "split_limit",
]

log = logging.getLogger(__name__)

STOP_GRACE_S = 30.0  # a stopped worker has this long to send the rest and exit
_ROOT = str(Path(__file__).resolve().parents[2])  # where the workers import harness from


class WorkerStdin(Protocol):
    """Where the parent writes a worker's job and messages; ``close()`` tells it to stop."""

    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def close(self) -> None: ...
    def is_closing(self) -> bool: ...


class WorkerProcess(Protocol):
    """A worker as the parent drives it: a local process (``asyncio.subprocess.Process``), or
    one on a cluster node (``harness.pool.cluster.RemoteWorker``)."""

    @property
    def stdin(self) -> WorkerStdin | None: ...
    @property
    def stdout(self) -> asyncio.StreamReader | None: ...
    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    async def wait(self) -> int: ...
    def kill(self) -> None: ...


class WorkerError(InfrastructureError):
    """A worker process failed or died: the variant is stopped."""


class WorkerPool:
    """Worker processes started ahead (while the server starts), waiting for their job."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.procs: list[WorkerProcess] = []

    async def start(self) -> None:
        """Start the processes and wait until each has imported and says it is ready, so
        that the shards start together (safe to call again)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
        started = []
        while len(self.procs) < self.size:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "harness.pool.child",
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                env=env,
            )
            self.procs.append(proc)
            started.append(proc)
        for proc in started:
            assert proc.stdout is not None
            try:
                ready = await proc.stdout.readexactly(len(READY))
            except asyncio.IncompleteReadError:
                ready = b""
            if ready != READY:
                raise WorkerError(f"a worker process did not start (exit code {await proc.wait()})")

    def stop(self) -> None:
        """Tell every worker to stop (its stdin closes); safe to call twice."""
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()

    async def close(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the workers, wait for them, kill (by pid) those still running after grace."""
        self.stop()
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("worker process %d did not stop: killed", proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        self.procs = []


class _Grants:
    """The parent's view of each worker's limit and sessions left: when a worker can no
    longer use all its permits, the others get them (``regrant``, a ``Grow`` message)."""

    def __init__(self, limits: list[int], sizes: list[int], procs: list[WorkerProcess]) -> None:
        self.limits = list(limits)
        self.remaining = list(sizes)
        self.procs = procs[: len(limits)]

    def ended(self, worker: int) -> None:
        """One of ``worker``'s sessions ran to its end."""
        self.remaining[worker] -= 1
        if self.remaining[worker] >= self.limits[worker]:
            return  # every permit it has can still be used
        self.limits, grants = regrant(self.limits, self.remaining)
        for proc, n in zip(self.procs, grants, strict=True):
            if n and proc.stdin is not None and not proc.stdin.is_closing():
                with contextlib.suppress(ConnectionError):
                    proc.stdin.write(encode(Grow(n)))


class _Feed:
    """The parent's side of one worker: its messages into the writer, logs and counts."""

    def __init__(
        self,
        number: int,
        proc: WorkerProcess,
        sinks: Sinks,
        ended: dict[int, str | None],
        grants: _Grants,
    ) -> None:
        self.number = number
        self.grants = grants
        self.proc = proc
        self.writer = sinks.writer
        self.transcripts = sinks.transcripts
        self.progress = sinks.progress
        self.on_session_end = sinks.on_session_end
        self.ended = ended
        self.report: dict[str, Any] | None = None
        self.error: str | None = None
        self.stop: HarnessError | None = None

    async def run(self, total: int) -> None:
        assert self.proc.stdout is not None
        out = self.proc.stdout
        while True:
            try:
                messages = await read_frame(out)
            except asyncio.IncompleteReadError:
                break
            self._take(messages)
        code = await self.proc.wait()
        if self.stop is not None:
            raise self.stop
        if self.error is not None:
            raise WorkerError(f"worker {self.number} of {total} failed: {self.error}")
        if self.report is None:
            raise WorkerError(
                f"worker {self.number} of {total} exited (code {code}) before it finished"
            )

    def _take(self, messages: list[Any]) -> None:
        lines: list[bytes] = []
        count = self.progress.count
        for msg in messages:
            if type(msg) is Turn:
                lines.append(msg.line)
                key = (msg.repeat, msg.session)
                count(msg.corrupted, msg.transport_error, key, suspect=msg.suspect)
                continue
            if lines:  # the turns before a session's end are on disk before the end is
                self.writer.write_lines(b"".join(lines), len(lines))
                lines = []
            if isinstance(msg, TranscriptRow):
                if self.transcripts is not None:
                    self.transcripts.write_line(msg.line)
            elif isinstance(msg, SessionEnd):
                self.progress.session_ended(msg.session)
                self.ended[msg.session] = msg.ended
                if self.on_session_end is not None:
                    self.on_session_end(msg.session, msg.ended)
                self.grants.ended(self.number - 1)
            elif isinstance(msg, Report):
                self.report = msg.report
            elif isinstance(msg, Failed):
                self.error = msg.error
                if msg.kind:  # the variant cannot go on: the same error as in one process
                    self.stop = variant_stop(msg.error, msg.kind, msg.whole_run)
            elif isinstance(msg, LogLine):  # a log record of the worker: logged here
                logging.getLogger(msg.logger).log(msg.level, "%s", msg.message)
            if lines:  # the turns before it, written once it is handled
                self.writer.write_lines(b"".join(lines), len(lines))
                lines = []
        if lines:
            self.writer.write_lines(b"".join(lines), len(lines))


def variant_stop(message: str, kind: str, whole_run: bool) -> HarnessError:
    """The error a worker's ``drive()`` raised, raised again in the parent."""
    if kind == EndpointRefused.__name__:
        return EndpointRefused(message, whole_run=whole_run)
    if kind == ServerUnanswering.__name__:
        return ServerUnanswering(message)
    return InfrastructureError(message)


class WorkerDriver:
    """The ``LoadDriver`` (``harness.drive.load``) over worker processes: the pool starts
    while the server starts, drives one load, and is closed."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool

    async def start(self) -> None:
        await self.pool.start()

    async def run(self, load: Load, sinks: Sinks) -> dict[int, str | None]:
        return await drive_workers(self.pool, load, sinks)

    async def close(self) -> None:
        await self.pool.close()


async def drive_workers(
    workers: int | WorkerPool, load: Load, sinks: Sinks
) -> dict[int, str | None]:
    """``drive()`` over ``workers`` processes (a count, or a pool started ahead, used once and
    closed here): every session of one variant to its end, each worker with its shard of
    the sessions and its part of the permits. Returns how each session that ran to its end
    ended; the combined self-report is left in ``sinks.progress.harness_self`` (also when
    cancelled)."""
    pool = workers if isinstance(workers, WorkerPool) else WorkerPool(workers)
    progress = sinks.progress
    plans = list(load.plans)
    progress.sessions_total += len(plans)
    if not plans:
        await pool.close()
        return {}
    shards = shard(plans, min(pool.size, load.permits.count))
    parts = load.permits.split([len(s) for s in shards])
    ended: dict[int, str | None] = {}
    feeds: list[_Feed] = []
    board = InflightBoard.create(len(shards))
    me = SelfReport()
    me.start()
    cpu0 = time.process_time()
    tspec = None
    if (transcripts := sinks.transcripts) is not None:
        tspec = TranscriptSpec(
            transcripts.model, transcripts.stream, transcripts.dialect, transcripts.keep_all
        )
    try:
        await pool.start()
        grants = _Grants([p.count for p in parts], [len(s) for s in shards], pool.procs)
        for i, (part, permits) in enumerate(zip(shards, parts, strict=True)):
            # (the client has connections for the whole limit: permits of other workers may
            # come here)
            job = Job(
                worker=i,
                workers=len(shards),
                board=board,
                load=replace(load, plans=tuple(part), permits=permits),
                transcripts=tspec,
                log_level=logging.getLogger().getEffectiveLevel(),
            )
            proc = pool.procs[i]
            assert proc.stdin is not None
            data = encode(job)
            try:
                proc.stdin.write(data)
                await proc.stdin.drain()
            except ConnectionError:
                raise WorkerError(
                    f"worker {i + 1} of {len(shards)} exited before it was given its job"
                ) from None
            feeds.append(_Feed(i + 1, proc, sinks, ended, grants))
        for proc in pool.procs[len(shards) :]:  # more workers started than there are shards
            if proc.stdin is not None:
                proc.stdin.close()
        await _follow(pool, feeds, len(shards))
    finally:
        for part in shards[: len(feeds)]:
            for p in part:  # cancelled: counted as done, as drive()
                if p.index not in ended:
                    progress.session_ended(p.index)
        parent = me.stop()
        parent["cpu_s"] = time.process_time() - cpu0
        progress.harness_self = combine([f.report for f in feeds if f.report is not None], parent)
        with contextlib.suppress(OSError):
            os.unlink(board)
        await pool.close()
    return ended


async def _follow(pool: WorkerPool, feeds: list[_Feed], total: int) -> None:
    """Read every worker to its end. Cancelled, or one worker failing: stop them all, read
    what they still send, then raise."""
    tasks = [asyncio.create_task(f.run(total)) for f in feeds]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        pool.stop()
        await _drain(pool, tasks)
        raise
    failed = [t for t in done if t.exception() is not None]
    if failed:
        pool.stop()
        await _drain(pool, tasks)
        raise failed[0].exception()  # type: ignore[misc]


async def _drain(pool: WorkerPool, tasks: list[asyncio.Task[None]]) -> None:
    _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_S)
    if late:
        log.warning("%d worker(s) did not stop within %.0f s: killed", len(late), STOP_GRACE_S)
        for proc in pool.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        await asyncio.wait(late, timeout=STOP_GRACE_S)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            log.debug("worker ended: %s", t.exception())
