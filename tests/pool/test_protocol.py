"""The parent/worker messages survive their frame format, each as its own named type."""

from __future__ import annotations

import asyncio

import pytest

from harness.pool.protocol import (
    HEADER,
    Failed,
    Grow,
    Report,
    SessionEnd,
    TranscriptRow,
    Turn,
    encode,
    read_frame,
)


async def test_frames_round_trip_in_order_and_end_at_eof() -> None:
    batch = [
        Turn(b'{"session": 3}\n', True, False, 1, 3),
        TranscriptRow(b'{"k": 1}\n'),
        SessionEnd(3, "done"),
        Report({"saturated": False}),
        Failed("KeyError: 'x'"),
    ]
    reader = asyncio.StreamReader()
    reader.feed_data(encode(batch) + encode(Grow(4)))
    reader.feed_eof()
    got = await read_frame(reader)
    assert got == batch
    assert [type(m) for m in got] == [Turn, TranscriptRow, SessionEnd, Report, Failed]
    assert got[0].session == 3
    assert got[0].corrupted
    assert got[2].ended == "done"
    grow = await read_frame(reader)
    assert isinstance(grow, Grow)
    assert grow.permits == 4
    with pytest.raises(asyncio.IncompleteReadError):
        await read_frame(reader)


def test_a_frame_is_its_length_then_its_body() -> None:
    frame = encode(Grow(1))
    assert HEADER.unpack(frame[: HEADER.size])[0] == len(frame) - HEADER.size
