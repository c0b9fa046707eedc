"""The messages between the parent and its worker processes, and their one wire format.

Each message travels in a frame: a 4-byte big-endian length, then a pickle (both ends are this
package on the same Python). Parent to worker: the ``Job`` first, then ``Grow`` messages.
Worker to parent: the ``READY`` bytes once (imported, waiting for its job), then frames that
each hold a list of messages, one frame per turn of the worker's event loop: ``Turn``,
``TranscriptRow``, ``SessionEnd``, ``LogLine``, and last ``Report``, or ``Failed``.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from harness.drive.load import Load

HEADER = struct.Struct(">I")  # the length of the pickle that follows
READY = b"harness-worker-ready\n"  # a worker's first bytes: imported, waiting for its job


@dataclass(frozen=True)
class TranscriptSpec:
    """The ``TranscriptLog`` settings; a worker's log sends its rows to the parent's."""

    model: str
    stream: bool
    dialect: str
    keep_all: bool = False


@dataclass(frozen=True)
class Job:
    """Everything one worker needs (sent pickled on its stdin): its shard of the variant's
    load, with its part of the permits."""

    worker: int
    workers: int
    board: str  # the in-flight board's file
    load: Load
    transcripts: TranscriptSpec | None
    log_level: int = logging.WARNING


class Grow(NamedTuple):
    """Parent to worker: ``permits`` more requests in flight (another worker's spare ones)."""

    permits: int


class Turn(NamedTuple):
    """One finished turn: its ``turns.jsonl`` line and what the progress counts."""

    line: bytes
    corrupted: bool
    transport_error: bool  # a failure of the server's (a cancelled turn is none)
    repeat: int
    session: int
    suspect: bool = False  # the text detector alone flagged it (the progress shows it apart)


class TranscriptRow(NamedTuple):
    """One encoded transcript row, for the parent's transcript log."""

    line: bytes


class SessionEnd(NamedTuple):
    """A session ran to its end, and why it ended."""

    session: int
    ended: str | None


class Report(NamedTuple):
    """The worker's self-report: its last message."""

    report: dict[str, Any]


class LogLine(NamedTuple):
    """A log record of the worker, for the parent to log (above its progress display)."""

    level: int
    logger: str
    message: str


class Failed(NamedTuple):
    """The worker failed (the traceback is in its own log); or, with ``kind``, its variant
    cannot go on (the ``HarnessError`` class its drive raised: ``EndpointRefused``,
    ``ServerUnanswering``), which the parent raises again."""

    error: str
    kind: str = ""
    whole_run: bool = False


def encode(message: Any) -> bytes:
    """One frame: a ``Job``, a ``Grow``, or a list of the worker's messages."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next frame's message; ``asyncio.IncompleteReadError`` once the other end closed."""
    size = HEADER.unpack(await reader.readexactly(HEADER.size))[0]
    return pickle.loads(await reader.readexactly(size))
