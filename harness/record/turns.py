"""One row per turn: the TurnRecord, its append-only JSONL writer, and readers.

``turns.jsonl`` is written one line per finished turn, each in one system call, so a run
that dies keeps every turn it finished. A write that fails half-way (a full disk) is cut back
to the last whole line; a torn line left by a crash is ended before the next append; readers
skip it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypedDict

from harness.errors import EnvironmentFailure
from harness.record import safejson

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
    corrupted: bool  # what the verdict flagged (the headline counts by tier: analysis.tiers)
    tier: str  # how a corrupted verdict was reached: "structural" | "suspect" ("" if healthy)
    noncanonical: bool
    transport_error: str | None  # None, or "kind: message"
    http_status: int | None
    sim_injected: str | None  # ground truth header from `harness sim`; never read by verdict
    content: str
    reasoning: str
    tool_calls: list[dict[str, Any]]  # [{"name": str, "arguments": object-or-raw-string}]
    evidence: dict[str, Any]
    dialect: str  # the tool-call dialect the turn was classified with ("auto": undecided)
    dialect_from: str  # where the variant's dialect came from (harness.workload.dialect)
    workload: str  # the scenario's workload ("tools" | "chat")


def open_append(path: Path) -> IO[bytes]:
    """An append-only JSONL file, unbuffered (each write is one system call); a torn last
    line (a crash, a full disk mid-write) is ended first, so the next line never merges
    with it and a reader skips only the torn one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh: IO[bytes] = open(path, "ab", buffering=0)  # noqa: SIM115 - the caller closes it
        if os.fstat(fh.fileno()).st_size:
            with open(path, "rb") as tail:
                tail.seek(-1, os.SEEK_END)
                if tail.read(1) != b"\n":
                    fh.write(b"\n")
    except OSError as exc:
        raise EnvironmentFailure.writing(path, exc) from None
    return fh


class JsonlAppender:
    """Whole lines appended to a file, or none: a write that fails half-way (a full disk)
    is cut back to the last whole line and raises ``EnvironmentFailure``; so does every
    write after it (dropped, counted in ``dropped``: nothing that follows a lost row can
    count as written), so a stopping run never tears the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fh = open_append(path)
        self._size = os.fstat(self._fh.fileno()).st_size
        self.broken = False
        self.dropped = 0

    def append(self, data: bytes, count: int = 1) -> bool:
        """Write ``data`` (``count`` whole lines); False when the file is broken."""
        if self.broken:
            self.dropped += count
            raise EnvironmentFailure(f"cannot write {self.path}: an earlier write failed")
        view = memoryview(data)
        try:
            while view:
                wrote = self._fh.write(view)
                view = view[wrote or 0 :]
        except OSError as exc:
            self.broken = True
            self.dropped += count
            with contextlib.suppress(OSError):
                os.ftruncate(self._fh.fileno(), self._size)
            raise EnvironmentFailure.writing(self.path, exc) from None
        self._size += len(data)
        return True

    def sync(self) -> None:
        if not self._fh.closed and not self.broken:
            with contextlib.suppress(OSError):
                os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self.sync()
            self._fh.close()


class TurnWriter:
    """Append-only JSONL writer; each record is written whole in one call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._out = JsonlAppender(path)
        self.count = 0

    def write(self, record: TurnRecord) -> None:
        """Append one record; ``safejson.Unencodable`` (nothing written) when it cannot be
        encoded, ``EnvironmentFailure`` when the file cannot be written."""
        if self._out.append(safejson.dumps(record) + b"\n"):
            self.count += 1

    def write_lines(self, lines: bytes, count: int) -> None:
        """``count`` records already encoded, one per line (from a worker process)."""
        if self._out.append(lines, count):
            self.count += count

    def sync(self) -> None:
        self._out.sync()

    def close(self) -> None:
        self._out.close()

    def __enter__(self) -> TurnWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def jsonl_rows(
    path: Path, loads: Callable[[bytes], Any] = json.loads
) -> Iterator[tuple[bytes, Any]]:
    """Each line of a JSONL file of a run folder with its value (``loads``); a torn or invalid
    line is logged and skipped, a blank one passed over."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                value = loads(raw)
            except json.JSONDecodeError:  # (orjson's is one too)
                log.warning("%s:%d: unreadable line skipped (torn write?)", path, lineno)
                continue
            yield raw, value


def iter_turns(path: Path, *, text: bool = False) -> Iterator[TurnRecord]:
    """Yield the records of a turns.jsonl; a torn or invalid line is logged and skipped."""
    for raw, rec in jsonl_rows(path):
        # an escaped surrogate in the line (a lone one, or a pair: checked in the value)
        yield safejson.printable(rec) if text and b"\\ud" in raw.lower() else rec


def read_turns(path: Path, *, text: bool = False) -> list[TurnRecord]:
    """The records of a turns.jsonl; ``text``: made printable (safejson.printable) for the
    writers that need UTF-8 (the report, parquet, JUnit)."""
    return list(iter_turns(path, text=text))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of any JSONL file of a run folder ([] when there is none), torn lines skipped."""
    return [dict(r) for r in iter_turns(path)] if path.exists() else []


def turns_frame(path: Path) -> Any:
    """A pandas DataFrame with one row per turn (long text columns kept)."""
    import pandas as pd

    return pd.DataFrame.from_records(read_turns(path))
