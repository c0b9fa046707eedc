"""A worker's log records travel to the parent, which logs them through its own handlers
(above its progress display), instead of writing over the display from another process."""

from __future__ import annotations

import io
import logging
import pickle

import pytest

from harness.drive.driver import Progress
from harness.pool import parent
from harness.pool.child import Channel, LogsToParent
from harness.pool.protocol import HEADER, LogLine


async def test_a_workers_records_become_messages_to_the_parent() -> None:
    out = io.BytesIO()
    channel = Channel(out)
    local = logging.StreamHandler(io.StringIO())
    handler = LogsToParent(channel, "worker 2/3", [local])
    logger = logging.getLogger("harness.test.worker")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("event-loop lag p99 %d ms", 140)
        channel.flush()
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    data = out.getvalue()
    (size,) = HEADER.unpack(data[: HEADER.size])
    messages = pickle.loads(data[HEADER.size : HEADER.size + size])
    assert messages == [
        LogLine(logging.WARNING, "harness.test.worker", "worker 2/3: event-loop lag p99 140 ms")
    ]
    assert local.stream.getvalue() == ""  # type: ignore[attr-defined]


def test_without_a_loop_a_worker_logs_locally() -> None:
    stream = io.StringIO()
    local = logging.StreamHandler(stream)
    handler = LogsToParent(Channel(io.BytesIO()), "worker 1/2", [local])
    handler.handle(logging.makeLogRecord({"msg": "after the loop", "levelno": logging.WARNING}))
    assert "after the loop" in stream.getvalue()


def test_the_parent_logs_what_a_worker_sent(caplog: pytest.LogCaptureFixture) -> None:
    feed = parent._Feed.__new__(parent._Feed)
    feed.progress, feed.transcripts, feed.writer = Progress(), None, None  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING):
        feed._take([LogLine(logging.WARNING, "harness.drive.driver", "worker 1/2: lag")])
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("harness.drive.driver", logging.WARNING, "worker 1/2: lag")
    ]
