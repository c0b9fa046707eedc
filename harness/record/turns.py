"""One row per turn: the TurnRecord, its append-only JSONL writer, and readers.

``turns.jsonl`` is written one line per finished turn and flushed at once, so a run that
dies keeps every turn it finished. Readers skip a torn last line (a crash mid-write).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, TypedDict

import orjson

log = logging.getLogger(__name__)


class TurnRecord(TypedDict, total=False):
    run_id: str
    variant: str  # e.g. "index_k=bf16,hicache=on"
    factors: dict[str, str]
    repeat: int  # which repetition of the variant (0-based)
    session: int
    turn: int  # the turn index within the session (0-based)
    attempt: int  # 0 for the first send of a turn; re-sends after corruption count up
    inflight: int  # requests in flight (from this client) when this one was sent
    sent_at: float  # wall clock (unix seconds), a label only
    prompt_tokens: int | None
    cached_tokens: int | None
    completion_tokens: int | None
    ttft_s: float | None
    latency_s: float | None
    itl_s: float | None  # mean gap between streamed events after the first
    finish_reason: str | None
    label: str
    corrupted: bool
    noncanonical: bool
    transport_error: str | None  # None, or "kind: message"
    http_status: int | None
    sim_injected: str | None  # ground truth header from `harness sim`; never read by verdict
    content: str
    reasoning: str
    tool_calls: list[dict[str, Any]]  # [{"name": str, "arguments": object-or-raw-string}]
    evidence: dict[str, Any]


class TurnWriter:
    """Append-only JSONL writer; each record is written and flushed in one call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[bytes] = open(path, "ab")  # noqa: SIM115 - closed in close()
        self.count = 0

    def write(self, record: TurnRecord) -> None:
        self._fh.write(orjson.dumps(record) + b"\n")
        self._fh.flush()
        self.count += 1

    def write_lines(self, lines: bytes, count: int) -> None:
        """``count`` records already encoded, one per line (from a worker process)."""
        self._fh.write(lines)
        self._fh.flush()
        self.count += count

    def sync(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()

    def __enter__(self) -> TurnWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def iter_turns(path: Path) -> Iterator[TurnRecord]:
    """Yield the records of a turns.jsonl; a torn or invalid line is logged and skipped."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except json.JSONDecodeError:
                log.warning("%s:%d: unreadable line skipped (torn write?)", path, lineno)
                continue
            yield rec


def read_turns(path: Path) -> list[TurnRecord]:
    return list(iter_turns(path))


def turns_frame(path: Path) -> Any:
    """A pandas DataFrame with one row per turn (long text columns kept)."""
    import pandas as pd

    return pd.DataFrame.from_records(read_turns(path))
