"""turns.jsonl as a frame in memory bounded by what the statistics need, not by the text.

A run of 200,000 turns writes about 160 MB of JSONL, most of it the answers' text (content,
reasoning, tool calls, evidence). The report's statistics need none of it but a few facts
(whether a turn called a tool, whether its content carried reasoning); the report quotes the
text of a few flagged turns. So the frame keeps:

- every scalar field of every row, repeated strings shared (one object per distinct value
  of a column: the variant, the label, the dialect...);
- the text fields only of the turns the verdict flagged (``label`` corrupted, ``corrupted``
  or a ``tier``): what the report quotes; the others get ``None``;
- what is derived from the text of every turn: ``tool_call_count``, ``reasoning_in_content``
  (the evidence's), and for a greedy run the stripped answer's length and digest
  (``content_chars``, ``content_digest``: what ``analysis.crossvariant`` compares);
- ``TEXT_AT``: the byte offset of the row's line, so that the text of any row is read back
  (``read_text``) for a row that the after-load findings flag and for the tidy export
  (``analysis.frames.write_tidy``), which reads it a chunk at a time.

``TEXT_KEPT`` says which rows carry their text.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from harness.labels import CORRUPTED_LABELS
from harness.record import safejson

log = logging.getLogger(__name__)

#: the fields that carry an answer's text
TEXT_FIELDS = ("content", "reasoning", "tool_calls", "evidence")
#: the column of each row's byte offset in turns.jsonl, and of whether its text is in the frame
TEXT_AT, TEXT_KEPT = "text_at", "text_kept"
#: columns derived from the text (dropped with it where the text is written out whole)
DERIVED = ("tool_call_count", "reasoning_in_content", "content_chars", "content_digest")


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each whole row of a turns.jsonl with its byte offset, made printable where it holds an
    escaped surrogate; a torn or invalid line is logged and skipped."""
    at = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, at = at, at + len(raw)
            if not raw.strip():
                continue
            try:
                row = safejson.loads(raw)
            except json.JSONDecodeError:
                log.warning("%s:%d: unreadable line skipped (torn write?)", path, lineno)
                continue
            if not isinstance(row, dict):
                log.warning("%s:%d: not a record, skipped", path, lineno)
                continue
            yield start, safejson.printable(row) if b"\\ud" in raw.lower() else row


def flagged(row: dict[str, Any]) -> bool:
    """Whether the verdict flagged the turn (its text is what the report quotes)."""
    return bool(row.get("label") in CORRUPTED_LABELS or row.get("corrupted") or row.get("tier"))


def digest(text: str) -> str:
    """A short digest of an answer's stripped text (equal texts, equal digests)."""
    data = text.strip().encode("utf-8", "surrogatepass")
    return hashlib.blake2b(data, digest_size=8).hexdigest()


#: rows gathered as Python lists before they become a frame's arrays (bounds the lists)
CHUNK_ROWS = 50_000


class _Columns:
    """Rows gathered column by column, each column's repeated values stored once; every
    ``CHUNK_ROWS`` rows made a frame (arrays), the frames joined at the end."""

    def __init__(self) -> None:
        self.cols: dict[str, list[Any]] = {}
        self.shared: dict[str, dict[Any, Any]] = {}
        self.n = 0
        self.frames: list[pd.DataFrame] = []

    def add(self, row: dict[str, Any]) -> None:
        for key, value in row.items():
            col = self.cols.get(key)
            if col is None:
                col = self.cols[key] = [None] * self.n
                self.shared.setdefault(key, {})
            if isinstance(value, str) and key not in TEXT_FIELDS:
                value = self.shared[key].setdefault(value, value)
            elif isinstance(value, dict) and key == "factors":
                frozen = tuple(sorted((str(k), str(v)) for k, v in value.items()))
                value = self.shared[key].setdefault(frozen, value)
            col.append(value)
        self.n += 1
        for col in self.cols.values():
            if len(col) < self.n:
                col.append(None)
        if self.n >= CHUNK_ROWS:
            self._flush()

    def _flush(self) -> None:
        if self.n:
            self.frames.append(pd.DataFrame(self.cols))
        self.cols, self.n = {}, 0

    def frame(self) -> pd.DataFrame:
        self._flush()
        if not self.frames:
            return pd.DataFrame()
        if len(self.frames) == 1:
            return self.frames[0]
        # a column all empty in one chunk (object) and numeric in another: numeric again
        out = pd.concat(self.frames, ignore_index=True)
        for name in out.columns:
            kinds = {str(f[name].dtype) for f in self.frames if name in f} - {"object"}
            numeric = bool(kinds) and kinds <= {"float64", "int64"}
            if out[name].dtype == object and numeric and _all_numbers(out[name]):
                out[name] = pd.to_numeric(out[name])
        return out


def _all_numbers(col: pd.Series) -> bool:
    return bool(col.map(lambda x: x is None or isinstance(x, int | float)).all())


def read_frame(path: Path, *, greedy: bool = False) -> pd.DataFrame:
    """The rows of a turns.jsonl, the text kept only where the verdict flagged the turn
    (module docstring); ``greedy``: add each answer's length and digest."""
    cols = _Columns()
    for at, row in _lines(path):
        keep = flagged(row)
        calls = row.get("tool_calls")
        evidence = row.get("evidence")
        content = row.get("content")
        row[TEXT_AT], row[TEXT_KEPT] = at, keep
        row["tool_call_count"] = len(calls) if isinstance(calls, list) else 0
        row["reasoning_in_content"] = (
            evidence.get("reasoning_in_content") if isinstance(evidence, dict) else None
        )
        if greedy and isinstance(content, str):
            row["content_chars"] = len(content.strip())
            row["content_digest"] = digest(content)
        if not keep:
            for name in TEXT_FIELDS:
                if name in row:
                    row[name] = None
        cols.add(row)
    return cols.frame()


def read_text(path: Path, offsets: Iterable[int]) -> dict[int, dict[str, Any]]:
    """The text fields of the rows at these byte offsets (``TEXT_AT``), printable."""
    out: dict[int, dict[str, Any]] = {}
    pos = -1
    with open(path, "rb") as fh:
        for at in sorted(set(offsets)):
            if at != pos:  # the next line is read where the last one ended: no seek
                fh.seek(at)
            raw = fh.readline()
            pos = at + len(raw)
            try:
                row = safejson.loads(raw)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                text = {k: row.get(k) for k in TEXT_FIELDS}
                out[at] = safejson.printable(text) if b"\\ud" in raw.lower() else text
    return out


def fill_text(df: pd.DataFrame, path: Path, rows: pd.Series) -> pd.DataFrame:
    """``df`` with the text read back for the ``rows`` (a boolean mask) that lack it."""
    if TEXT_AT not in df or TEXT_KEPT not in df:
        return df
    want = rows & ~df[TEXT_KEPT].astype(bool)
    if not want.any():
        return df
    found = read_text(path, df.loc[want, TEXT_AT].astype(int))
    df = df.copy()
    for name in TEXT_FIELDS:
        if name not in df:
            df[name] = None
        df[name] = df[name].astype(object)
    for idx, at in df.loc[want, TEXT_AT].astype(int).items():
        text = found.get(at)
        if text is None:
            continue
        for name in TEXT_FIELDS:
            df.at[idx, name] = text[name] if name != "content" else text[name] or ""
        df.at[idx, TEXT_KEPT] = True
    return df
