"""Session transcripts: the exact requests and responses, stored as deltas (transcripts.jsonl).

A session's history only grows, so each request is stored as the messages appended since the
session's previous request (``messages``) plus the total count (``n``): request ``seq`` of a
session is rebuilt by concatenating the deltas of rows ``0..seq`` and keeping the first ``n``
messages. Disk use per session is its final history, not the sum of every request (a session
of 28 turns growing to 80k tokens stores about 80k tokens, not 1.1M).

Rows (one JSON object per line, keyed by ``variant``/``repeat``/``session``):

* ``{"kind": "session", ..., "keys": [...], "params": {...}, "model", "stream", "dialect"}``:
  once per session, before its first request; ``params`` is the request body without
  ``messages`` and ``keys`` its key order.
* ``{"kind": "request", ..., "seq", "turn", "attempt", "n", "messages": [delta],
  "params": {...} | null, "context": ref, "response": {...}}``: one per send, written once
  the response is in. ``params`` is only present when it differs from the session's.
  ``context`` is what the verdict read next to the output (a span of an earlier row's
  delta, or the literal text), so a replayed output is judged exactly as in the run.

Memory stays bounded: a session's rows are held (as references to the session's own message
dicts) until the session ends; they are written as soon as a turn of the session is
corrupted (so a crash keeps them), or for every session with ``keep_all``; the rows of clean
finished sessions are dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from harness.errors import UsageError
from harness.record import safejson
from harness.record.payload import HistoryEncoder
from harness.record.turns import JsonlAppender, jsonl_rows


def chat_payload(
    body: dict[str, Any], model: str, stream: bool, history: HistoryEncoder | None = None
) -> bytes:
    """The exact bytes sent for one chat request (transcripts rebuild them with this too);
    ``history`` keeps a growing history's messages encoded (the same bytes, made faster)."""
    payload = dict(body, model=body.get("model", model), stream=stream)
    if stream:
        payload["stream_options"] = {"include_usage": True}
    if history is not None:
        data = history.encode(payload)
        if data is not None:
            return data
    return safejson.dumps(payload)  # (a lone surrogate in the history is sent escaped)


def wire_payload(body: dict[str, Any], model: str, stream: bool) -> bytes:
    """The bytes ``ChatClient.chat`` sends for ``body``."""
    return chat_payload(body, model, stream)


def _joined(messages: list[dict[str, Any]]) -> str:
    return "\n".join(m["content"] for m in messages if isinstance(m.get("content"), str))


@dataclass
class _SessionState:
    header: dict[str, Any]
    recorded: int = 0  # messages stored so far
    seq: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)
    live: bool = False  # rows go to disk as they come
    context: str = ""
    context_ref: dict[str, Any] | None = None


@dataclass
class Entry:
    """One send in progress (returned by ``sent``, completed by ``answered``)."""

    key: int
    row: dict[str, Any]


class TranscriptLog:
    """Records the requests of the sessions of one variant run into ``path`` (appended)."""

    def __init__(
        self,
        path: Path,
        base: dict[str, Any],
        *,
        model: str,
        stream: bool,
        dialect: str,
        keep_all: bool = False,
        sink: Callable[[bytes], None] | None = None,
    ) -> None:
        self.path = path
        self._sink = sink  # where encoded rows go instead of ``path`` (a worker process)
        self.base: dict[str, Any] = {k: base[k] for k in ("variant", "repeat") if k in base}
        self.model = model
        self.stream = stream
        self.dialect = dialect
        self.keep_all = keep_all
        self._sessions: dict[int, _SessionState] = {}
        self._fh: JsonlAppender | None = None
        self.written_sessions: set[int] = set()

    # ---- recording ---------------------------------------------------------------------

    def sent(
        self, session: int, turn: int, attempt: int, body: dict[str, Any], context: str
    ) -> Entry:
        """Note the request about to be sent (``body`` as built by the session)."""
        messages: list[dict[str, Any]] = body["messages"]
        params = {k: v for k, v in body.items() if k != "messages"}
        st = self._sessions.get(session)
        if st is None:
            header: dict[str, Any] = {
                "kind": "session",
                **self.base,
                "session": session,
                "keys": list(body),
                "params": params,
                "model": self.model,
                "stream": self.stream,
                "dialect": self.dialect,
            }
            st = self._sessions[session] = _SessionState(header, live=self.keep_all)
            if st.live:
                self._write(header)
        delta = messages[st.recorded :]
        row: dict[str, Any] = {
            "kind": "request",
            **self.base,
            "session": session,
            "seq": st.seq,
            "turn": turn,
            "attempt": attempt,
            "n": len(messages),
            "messages": delta,
            "params": None if params == st.header["params"] else params,
            "context": self._context_ref(st, delta, context),
        }
        st.recorded = len(messages)
        st.seq += 1
        return Entry(session, row)

    def _context_ref(
        self, st: _SessionState, delta: list[dict[str, Any]], context: str
    ) -> dict[str, Any] | None:
        if not context:
            ref = None
        elif context == st.context and st.context_ref is not None:
            ref = st.context_ref
        else:
            joined = _joined(delta)
            at = joined.rfind(context)
            ref = (
                {"seq": st.seq, "start": at, "end": at + len(context)}
                if at >= 0
                else {"text": context}
            )
        st.context, st.context_ref = context, ref
        return ref

    def answered(self, entry: Entry, response: dict[str, Any], corrupted: bool) -> None:
        """The response of a send is in: keep the row (write it if the session is kept)."""
        st = self._sessions[entry.key]
        entry.row["response"] = response
        if corrupted and not st.live:
            st.live = True
            self._write(st.header)
            for row in st.rows:
                self._write(row)
            st.rows.clear()
        if st.live:
            self._write(entry.row)
        else:
            st.rows.append(entry.row)

    def finished(self, session: int) -> None:
        """The session ended (or was cancelled): drop what was not written."""
        st = self._sessions.pop(session, None)
        if st is not None and st.live:
            self.written_sessions.add(session)

    @property
    def held_sessions(self) -> int:
        """Sessions whose rows are held in memory (running, not yet written)."""
        return sum(1 for st in self._sessions.values() if not st.live)

    def _write(self, row: dict[str, Any]) -> None:
        line = safejson.dumps(row) + b"\n"
        if self._sink is not None:
            self._sink(line)
        else:
            self.write_line(line)

    def write_line(self, line: bytes) -> None:
        """Append one encoded row (a worker's, or this log's own) and flush it."""
        if self._fh is None:
            self._fh = JsonlAppender(self.path)
        self._fh.append(line)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()


# ---- reading ---------------------------------------------------------------------------


@dataclass
class Transcript:
    """One session's recorded requests, able to rebuild any of them exactly."""

    header: dict[str, Any]
    rows: list[dict[str, Any]]  # request rows, in send order

    @property
    def key(self) -> tuple[str, int, int]:
        h = self.header
        return (str(h.get("variant", "")), int(h.get("repeat", 0)), int(h["session"]))

    def find(self, turn: int, attempt: int | None = None) -> dict[str, Any]:
        for row in self.rows:
            if row["turn"] == turn and (attempt is None or row["attempt"] == attempt):
                return row
        raise UsageError(
            f"session {self.key[2]} has no recorded request for turn {turn}"
            + (f" attempt {attempt}" if attempt is not None else "")
            + f" (recorded turns: {sorted({r['turn'] for r in self.rows})})"
        )

    def first_corrupted(self) -> dict[str, Any] | None:
        for row in self.rows:
            if (row.get("response") or {}).get("corrupted"):
                return row
        return None

    def messages(self, seq: int) -> list[dict[str, Any]]:
        history: list[dict[str, Any]] = []
        for row in self.rows[: seq + 1]:
            history.extend(row["messages"])
        return history[: self.rows[seq]["n"]]

    def body(self, seq: int) -> dict[str, Any]:
        """The request body of row ``seq`` as the session built it (key order included)."""
        params = self.rows[seq].get("params") or self.header["params"]
        body: dict[str, Any] = {}
        for key in self.header["keys"]:
            body[key] = self.messages(seq) if key == "messages" else params[key]
        for key, value in params.items():
            body.setdefault(key, value)
        return body

    def wire(self, seq: int, stream: bool | None = None) -> bytes:
        """The exact bytes that were sent for row ``seq``."""
        s = self.header["stream"] if stream is None else stream
        return wire_payload(self.body(seq), self.header["model"], s)

    def context(self, seq: int) -> str | None:
        ref = self.rows[seq].get("context")
        if not ref:
            return None
        if "text" in ref:
            return str(ref["text"])
        joined = _joined(self.rows[ref["seq"]]["messages"])
        return joined[ref["start"] : ref["end"]]


def iter_transcripts(path: Path) -> Iterator[Transcript]:
    """Every session transcript of a transcripts.jsonl (torn lines skipped)."""
    found: dict[tuple[str, int, int], Transcript] = {}
    if not path.exists():
        return iter(())
    for _, row in jsonl_rows(path, orjson.loads):
        key = (str(row.get("variant", "")), int(row.get("repeat", 0)), int(row["session"]))
        if row.get("kind") == "session":
            found[key] = Transcript(row, [])
        elif key in found:
            found[key].rows.append(row)
    for t in found.values():
        t.rows.sort(key=lambda r: r["seq"])
    return iter(found.values())


def load_transcripts(path: Path) -> dict[tuple[str, int, int], Transcript]:
    return {t.key: t for t in iter_transcripts(path)}
