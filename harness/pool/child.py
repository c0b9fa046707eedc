"""One worker process (``python -m harness.pool.child``): drives its shard of a variant's sessions.

Started by ``harness.pool.parent.WorkerPool``. It reads one ``Job`` (``harness.pool.protocol``) on
stdin, runs ``drive()`` on its shard with its own client, and sends back on stdout, in one
batch per turn of its event loop: every finished turn's ``turns.jsonl`` line with its
counts, transcript rows, each session's end, and at last its self-report. When its stdin
closes (the parent stopped it, or died) it cancels its ``drive()``: the turns in flight are
recorded as cancelled and sent like the others. Until then the parent may send it more
requests in flight (``Grow``), when another worker has fewer sessions left than its share.
Ctrl-C reaches it as it reaches the parent; it ignores SIGINT and waits for the parent to stop
it, so its turns are not cut off. Anything else written to stdout goes to stderr.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from typing import IO, cast

from harness.client.output import server_failure
from harness.drive import judging
from harness.drive.driver import Progress
from harness.drive.inflight import InflightBoard
from harness.drive.load import LocalDriver, Sinks
from harness.drive.permits import Permits
from harness.errors import HarnessError
from harness.pool.protocol import (
    READY,
    Failed,
    Grow,
    Job,
    LogLine,
    Report,
    SessionEnd,
    TranscriptRow,
    Turn,
    encode,
    read_frame,
)
from harness.record import safejson
from harness.record.rundir import TRANSCRIPTS_FILE
from harness.record.transcripts import TranscriptLog
from harness.record.turns import TurnRecord, TurnWriter
from harness.verdict.turn import SUSPECT

log = logging.getLogger(__name__)

Message = Turn | TranscriptRow | SessionEnd | LogLine | Report | Failed


class Channel:
    """Messages to the parent, batched: one frame per turn of the event loop."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.pending: list[Message] = []
        self.scheduled = False
        self.broken = False

    def send(self, msg: Message) -> None:
        self.pending.append(msg)
        if not self.scheduled:
            self.scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.scheduled = False
        if not self.pending:
            return
        data = encode(self.pending)
        self.pending = []
        if self.broken:
            return
        try:
            self.out.write(data)
            self.out.flush()
        except (BrokenPipeError, ValueError):  # the parent is gone; stdin closes too
            self.broken = True


class LogsToParent(logging.Handler):
    """Log records as ``LogLine`` messages to the parent, which
    logs them through its own handlers (above its progress display); without a running
    loop, or once the parent is gone, through this process's own handlers (stderr)."""

    def __init__(self, channel: Channel, who: str, local: list[logging.Handler]) -> None:
        super().__init__()
        self.channel, self.who, self.local = channel, who, local

    def emit(self, record: logging.LogRecord) -> None:
        try:
            asyncio.get_running_loop()
            running = not self.channel.broken
        except RuntimeError:
            running = False
        if running:
            self.channel.send(
                LogLine(record.levelno, record.name, f"{self.who}: {record.getMessage()}")
            )
        else:
            for h in self.local:
                h.handle(record)


class ForwardWriter:
    """The ``TurnWriter`` the sessions see: each record goes to the parent as its line."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.count = 0

    def write(self, record: TurnRecord) -> None:
        self.channel.send(
            Turn(
                safejson.dumps(record) + b"\n",
                bool(record.get("corrupted")),
                # a send the server failed on its own output's bytes is corrupted only
                server_failure(record.get("transport_error")) and not record.get("corrupted"),
                record.get("repeat", 0),
                record["session"],
                bool(record.get("corrupted")) and record.get("tier") == SUSPECT,
            )
        )
        self.count += 1


async def work(job: Job, channel: Channel) -> None:
    """Drive the job's sessions under its permits; always end with the self-report
    (``Report``)."""
    load = job.load
    transcripts = None
    if job.transcripts is not None:
        t = job.transcripts
        transcripts = TranscriptLog(
            Path(TRANSCRIPTS_FILE),  # never opened: the rows go to the parent's log
            load.base,
            model=t.model,
            stream=t.stream,
            dialect=t.dialect,
            keep_all=t.keep_all,
            sink=lambda line: channel.send(TranscriptRow(line)),
        )
    board = InflightBoard(job.board, job.worker, job.workers)
    progress = Progress()
    if load.options.judges is None:  # the cores shared by the workers' judging processes
        load = replace(
            load, options=replace(load.options, judges=judging.auto_processes(job.workers))
        )
    sinks = Sinks(
        cast(TurnWriter, ForwardWriter(channel)),
        progress,
        transcripts,
        on_session_end=lambda index, why: channel.send(SessionEnd(index, why)),
    )
    try:
        await LocalDriver(board=board).run(load, sinks)
    finally:
        board.close()
        report = dict(progress.harness_self or {})
        report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
        channel.send(Report(report))
        channel.flush()


async def serve(out: IO[bytes]) -> int:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    try:
        job: Job = await read_frame(reader)
    except asyncio.IncompleteReadError:
        return 0  # stopped before it was given a job
    logging.basicConfig(
        level=job.log_level,
        format=f"%(levelname)s worker {job.worker + 1}/{job.workers} %(name)s: %(message)s",
    )
    channel = Channel(out)
    root = logging.getLogger()
    local = list(root.handlers)
    for h in local:  # log records go to the parent, which shows them above its display
        root.removeHandler(h)
    root.addHandler(LogsToParent(channel, f"worker {job.worker + 1}/{job.workers}", local))
    task = asyncio.create_task(work(job, channel))
    stop = asyncio.create_task(listen(reader, job.load.permits))  # at EOF: the parent says stop
    await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    if not task.done():
        task.cancel()
    stop.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
    except HarnessError as exc:  # the variant cannot go on (refused, no longer answering)
        channel.send(Failed(str(exc), type(exc).__name__, getattr(exc, "whole_run", False)))
        channel.flush()
        return 1
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the variant
        traceback.print_exc()
        channel.send(Failed(f"{type(exc).__name__}: {exc}"))
        channel.flush()
        return 1
    return 0


async def listen(reader: asyncio.StreamReader, permits: Permits) -> None:
    """The parent's messages after the job, until its end of stdin closes: ``Grow(n)``
    gives this worker ``n`` more requests in flight (permits another worker can no longer
    use)."""
    while True:
        try:
            msg = await read_frame(reader)
        except asyncio.IncompleteReadError:
            return
        if isinstance(msg, Grow):
            permits.grow(msg.permits)


def main() -> int:
    # the parent stops us, after Ctrl-C, SIGTERM or SIGHUP too (a closed terminal sends SIGHUP
    # to the whole process group; the parent records what we send until it stops us)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints must not corrupt the frames
    out.write(READY)
    out.flush()
    return asyncio.run(serve(out))


if __name__ == "__main__":
    sys.exit(main())
