"""The server's own alarms: speculative-decoding acceptance per request, and SGLang's KV
canary lines in the server log.

``--oracle spec_accept``: the sessions ask for SGLang's ``meta_info`` (``return_meta_info``;
non-streamed requests only) and each answered send is judged by the rules of Z.ai's
production monitor: an average accept length (completion tokens / ``spec_verify_ct``) below
``min_length`` after more than ``min_tokens`` generated tokens (a KV mismatch: garbled text),
or an accept rate (``spec_accept_token_num / spec_draft_token_num``) above ``max_rate``
(degraded attention: repetition).

``--oracle kv_canary``: the server log (a launched server's, or ``--server-log FILE``) is read
as the run goes; every ``kv_canary violation`` line is tied to the sends in flight when it was
written (its own timestamp when it has one, else when it was read). Each line is kept in
``kv_canary_lines.jsonl`` as it is read (variant, repeat, when, the line), so a run stopped
before its after-load ties them loses none: the resume ties the kept lines that have no row
yet, without a server (run.afterload.write_alarms).

Both append to ``oracle_alarms.jsonl``, keyed like confirm.jsonl, ``alarm`` naming the
oracle (``spec_accept`` or ``kv_canary``; None for a spec-checked send with no alarm).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from harness.analysis.confirm import ROW_KEY, row_key
from harness.record.rundir import KV_CANARY_LINES_FILE, ORACLE_ALARMS_FILE, TRANSCRIPTS_FILE
from harness.record.transcripts import load_transcripts
from harness.record.turns import read_rows

CANARY = re.compile(r"kv_canary violation")
STAMP = re.compile(r"^\[?(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:\.\d+)?)")
POLL_S = 0.2


@dataclass(frozen=True)
class SpecRules:
    min_length: float = 1.4  # accept length below this after min_tokens: a KV mismatch
    min_tokens: int = 128
    max_rate: float = 0.96  # accept rate above this: degraded attention (repetition)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def spec_alarm(meta: Mapping[str, Any], rules: SpecRules) -> tuple[str | None, dict[str, Any]]:
    """(the alarm's reason or None, the numbers) of one request's meta_info."""
    tokens = _int(meta.get("completion_tokens"))
    steps = _int(meta.get("spec_verify_ct"))
    accepted = _int(meta.get("spec_accept_token_num"))
    drafted = _int(meta.get("spec_draft_token_num"))
    length = tokens / steps if tokens is not None and steps else None
    rate = accepted / drafted if accepted is not None and drafted else None
    numbers = {"completion_tokens": tokens, "accept_length": length, "accept_rate": rate}
    if (
        length is not None
        and tokens is not None
        and tokens > rules.min_tokens
        and length < rules.min_length
    ):
        return "accept_length", numbers
    if rate is not None and rate > rules.max_rate:
        return "accept_rate", numbers
    return None, numbers


def _spec_checked(run_dir: Path) -> set[tuple[Any, ...]]:
    return {row_key(r) for r in read_rows(run_dir / ORACLE_ALARMS_FILE) if "accept_length" in r}


def spec_rows(
    run_dir: Path, run_id: str, variant: str, repeat: int, rules: SpecRules
) -> list[dict[str, Any]]:
    """Judge every send of (variant, repeat) that carried meta_info and has no row yet (a
    resumed run writes only the missing ones); append the rows."""
    rows = []
    done = _spec_checked(run_dir)
    for (v, r, session), t in sorted(load_transcripts(run_dir / TRANSCRIPTS_FILE).items()):
        if (v, r) != (variant, repeat):
            continue
        for row in t.rows:
            meta = (row.get("response") or {}).get("meta_info")
            if not isinstance(meta, Mapping) or "spec_verify_ct" not in meta:
                continue
            key = (v, r, session, row["turn"], row["attempt"])
            if key in done:
                continue
            why, numbers = spec_alarm(meta, rules)
            out: dict[str, Any] = {"run_id": run_id, **dict(zip(ROW_KEY, key, strict=True))}
            out.update(alarm="spec_accept" if why else None, reason=why, **numbers,
                       sim_injected=(row.get("response") or {}).get("sim_injected"))  # fmt: skip
            rows.append(out)
    _append(run_dir, rows)
    return rows


def _append(run_dir: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    with open(run_dir / ORACLE_ALARMS_FILE, "a", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def line_time(line: str, read_at: float) -> tuple[float, float]:
    """(when the line was written, how sure): its own timestamp (local time), else when read."""
    m = STAMP.match(line.strip())
    if m:
        text = m.group(1).replace("T", " ")
        with contextlib.suppress(ValueError):
            fmt = "%Y-%m-%d %H:%M:%S.%f" if "." in text else "%Y-%m-%d %H:%M:%S"
            return datetime.strptime(text, fmt).timestamp(), 0.05 if "." in text else 1.0
    return read_at, POLL_S * 2


@dataclass
class LogWatch:
    """Reads a growing server log from where it stood at the start; keeps canary lines, each
    appended to ``keep`` (kv_canary_lines.jsonl) with ``tag`` (variant, repeat) as read."""

    path: Path
    keep: Path | None = None
    tag: dict[str, Any] = field(default_factory=dict)
    lines: list[tuple[float, float, str]] = field(default_factory=list)
    _pos: int = 0
    _rest: bytes = b""
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        with contextlib.suppress(OSError):
            self._pos = self.path.stat().st_size
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            self.read()
            await asyncio.sleep(POLL_S)

    def read(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                data = fh.read()
        except OSError:
            return
        self._pos += len(data)
        now = time.time()
        *whole, self._rest = (self._rest + data).split(b"\n")
        found = []
        for raw in whole:
            line = raw.decode("utf-8", "replace")
            if CANARY.search(line):
                at, slack = line_time(line, now)
                found.append((at, slack, line.strip()[-300:]))
        self.lines += found
        if found and self.keep is not None:
            with open(self.keep, "a", encoding="utf-8") as fh:
                for at, slack, line in found:
                    row = {**self.tag, "at": at, "slack": slack, "line": line}
                    fh.write(json.dumps(row, ensure_ascii=False) + "\n")

    async def stop(self) -> list[tuple[float, float, str]]:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.read()
        return self.lines


def kept_lines(run_dir: Path, variant: str, repeat: int) -> list[tuple[float, float, str]]:
    """The canary lines the watch kept for (variant, repeat), in the order read."""
    return [
        (float(r["at"]), float(r.get("slack") or 0.0), str(r["line"]))
        for r in read_rows(run_dir / KV_CANARY_LINES_FILE)
        if r.get("variant") == variant and r.get("repeat") == repeat and "at" in r
    ]


def _recorded(run_dir: Path, variant: str, repeat: int) -> set[tuple[Any, Any]]:
    return {(r.get("at"), r.get("line")) for r in read_rows(run_dir / ORACLE_ALARMS_FILE)
            if r.get("alarm") == "kv_canary_line" and r.get("variant") == variant
            and r.get("repeat") == repeat}  # fmt: skip


def canary_rows(
    lines: Iterable[tuple[float, float, str]],
    turns: Iterable[Mapping[str, Any]],
    run_id: str,
    variant: str,
    repeat: int,
    run_dir: Path,
) -> list[dict[str, Any]]:
    """One row per (canary line, send in flight when it was written); appended. A line
    already recorded (the same time and text) is left out: the after-load of a resumed run
    or of a later round writes only new lines."""
    seen = _recorded(run_dir, variant, repeat)
    lines = [x for x in lines if (x[0], x[2]) not in seen]
    mine = [t for t in turns
            if t.get("variant") == variant and int(t.get("repeat", 0)) == repeat
            and t.get("sent_at") is not None]  # fmt: skip
    rows: list[dict[str, Any]] = []
    for i, (at, slack, line) in enumerate(lines):
        tied = len(rows)
        for t in mine:
            start = float(t["sent_at"])
            end = start + float(t.get("latency_s") or 0.0)
            if start - slack <= at <= end + slack:
                key = tuple(t.get(k) for k in ROW_KEY)
                out: dict[str, Any] = {"run_id": run_id, **dict(zip(ROW_KEY, key, strict=True))}
                out.update(alarm="kv_canary", line_index=i, line=line, at=at,
                           sim_injected=t.get("sim_injected"))  # fmt: skip
                rows.append(out)
        # the line itself (no send key): counted even when no send was in flight
        rows.append({"run_id": run_id, "variant": variant, "repeat": repeat, "session": None,
                     "turn": None, "attempt": None, "alarm": "kv_canary_line", "line_index": i,
                     "line": line, "at": at, "sends": len(rows) - tied})  # fmt: skip
    _append(run_dir, rows)
    return rows
