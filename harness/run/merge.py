"""``harness merge``: the run folders of a run's shards (``harness run --shard I/K``) made
into one, as if one process had run it.

The shards must belong to one plan (the same ``plan_id`` in their run.json: scenario, factors,
sessions, seed, K) and each index may appear once. Every turn, finished session, transcript,
server metric, self-report row and exact oracle row (``--oracle``, ``--passkeys``) is carried
over (turns in a fixed order, with the merged run's id); the summary, statistics, plots and
report are then rebuilt from them by the same code as ``harness report``. A missing shard, or
one that did not finish (no end recorded in its run.json, or an exit code other than 0), is
named in ``merge.json`` and fails the merge as infrastructure, after the folder is written
from what there is.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError
from harness.record import safejson
from harness.record.rundir import (
    METRICS_FILE,
    ORACLE_ALARMS_FILE,
    ORACLE_PASSKEY_ALONE_FILE,
    ORACLE_PASSKEY_FILE,
    ORACLE_REPLAY_FILE,
    OUTCOMES_FILE,
    SELF_REPORT_FILE,
    SERVERS_DIR,
    SESSIONS_FILE,
    TRANSCRIPTS_FILE,
    TURNS_FILE,
    RunDir,
)

MERGE_FILE = "merge.json"
#: the exact oracles' rows (each shard checks its own sessions on its own servers)
ORACLE_FILES = (
    ORACLE_REPLAY_FILE, ORACLE_PASSKEY_FILE, ORACLE_PASSKEY_ALONE_FILE, ORACLE_ALARMS_FILE,
)  # fmt: skip


@dataclass
class MergeResult:
    out: Path
    count: int  # K
    present: list[int]  # the shard indexes merged
    missing: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)  # index -> why
    turns: int = 0
    largest_offset_s: float | None = None  # the largest clock offset seen between shards

    @property
    def complete(self) -> bool:
        return not self.missing and not self.failed

    def problems(self) -> list[str]:
        out = [f"shard {i}/{self.count} is missing" for i in self.missing]
        out += [f"shard {i}/{self.count} {why}" for i, why in sorted(self.failed.items())]
        return out


@dataclass(frozen=True)
class _Shard:
    path: Path
    meta: dict[str, Any]
    index: int
    count: int
    clock: dict[str, Any] | None


def _read_shard(path: Path) -> _Shard:
    meta = RunDir(path).read_meta()
    shard = meta.get("shard")
    if not isinstance(shard, dict):
        raise UsageError(f"{path}: not a shard's run folder (its run.json has no shard; "
                         "run it with harness run --shard I/K)")  # fmt: skip
    clock = None
    if RunDir(path).clock.is_file():
        clock = json.loads(RunDir(path).clock.read_text())
    return _Shard(path, meta, int(shard["index"]), int(shard["count"]), clock)


def _iter_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    if not path.is_file():
        return
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                row = safejson.loads(raw) if raw.strip() else None
            except json.JSONDecodeError:
                continue  # a torn last line (a shard that died mid-write)
            if isinstance(row, dict):
                yield row


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return list(_iter_jsonl(path))


def _write_jsonl(path: Path, rows: Iterable[dict[str, Any]], *, empty: bool = False) -> None:
    """The rows, one a line (no file when there is none, unless ``empty``)."""
    fh = open(path, "wb") if empty else None  # noqa: SIM115 - closed below
    try:
        for r in rows:
            if fh is None:
                fh = open(path, "wb")  # noqa: SIM115 - opened at the first row, closed below
            fh.write(safejson.dumps(r) + b"\n")
    finally:
        if fh is not None:
            fh.close()


def _merge_turns(
    paths: list[Path], out: Path, run_id: str, key: Callable[[dict[str, Any]], Any]
) -> int:
    """Every turn of the shards' turns.jsonl files in one, in ``key``'s order (ties: in the
    shards' order, then their lines'), with the merged run's id; the turns written. Only each
    row's key and place are held (two passes over the files), so a merge of hundreds of
    thousands of turns is not held in memory."""
    places: list[tuple[Any, int, int]] = []
    for n, path in enumerate(paths):
        if not path.is_file():
            continue
        with open(path, "rb") as fh:
            at = 0
            for raw in fh:
                start, at = at, at + len(raw)
                try:
                    row = safejson.loads(raw) if raw.strip() else None
                except json.JSONDecodeError:
                    continue  # a torn last line (a shard that died mid-write)
                if isinstance(row, dict):
                    places.append((key(row), n, start))
    places.sort()
    with contextlib.ExitStack() as stack:
        files = [stack.enter_context(open(p, "rb")) if p.is_file() else None for p in paths]
        dst = stack.enter_context(open(out, "wb"))
        for _key, n, start in places:
            src = files[n]
            assert src is not None
            src.seek(start)
            row = safejson.loads(src.readline())
            row["run_id"] = run_id
            dst.write(safejson.dumps(row) + b"\n")
    return len(places)


def _why_failed(shard: _Shard) -> str | None:
    finished = shard.meta.get("finished")
    if not isinstance(finished, dict):
        return "did not finish (no end in its run.json: it crashed or is still running)"
    code = finished.get("exit_code")
    if code not in (0, None):
        reason = finished.get("reason")
        return f"ended with exit code {code}" + (f" ({reason})" if reason else "")
    return None


def merge_shards(dirs: list[Path], out: Path, expect: int | None = None) -> MergeResult:
    """Write one run folder at ``out`` from the shard folders ``dirs`` (its run id: the first
    shard's, with ``-merged``)."""
    shards = [_read_shard(d) for d in dirs]
    plans = {s.meta.get("plan_id") for s in shards}
    if len(plans) > 1:
        raise UsageError(
            "these folders are shards of different runs (their plan ids differ: "
            + ", ".join(f"{s.path}={s.meta.get('plan_id')}" for s in shards)
            + "); give the shards of one run, made with the same command and seed"
        )
    counts = {s.count for s in shards}
    if len(counts) > 1:
        raise UsageError(f"the shards disagree on K: {sorted(counts)}")
    count = counts.pop()
    if expect is not None and expect != count:
        raise UsageError(f"--shards {expect}, but the shards are slices of {count}")
    seen: dict[int, Path] = {}
    for s in shards:
        if s.index in seen:
            raise UsageError(f"shard {s.index}/{count} given twice: {seen[s.index]} and {s.path}")
        seen[s.index] = s.path
    shards.sort(key=lambda s: s.index)
    run_id = f"{shards[0].meta.get('run_id', 'run')}-merged"
    result = MergeResult(out, count, [s.index for s in shards])
    result.missing = [i for i in range(1, count + 1) if i not in seen]
    for s in shards:
        why = _why_failed(s)
        if why:
            result.failed[s.index] = why

    RunDir(out).prepare()
    first = shards[0].meta
    order = {(o["variant"], o["repeat"]): n for n, o in enumerate(first.get("order") or [])}

    def turn_key(r: dict[str, Any]) -> tuple[Any, ...]:
        where = order.get((r.get("variant"), r.get("repeat", 0)), len(order))
        return (where, r.get("session", 0), r.get("turn", 0), r.get("attempt", 0))

    result.turns = _merge_turns([s.path / TURNS_FILE for s in shards], out / TURNS_FILE,
                                run_id, turn_key)  # fmt: skip
    sessions = [r for s in shards for r in _jsonl(s.path / SESSIONS_FILE)]
    sessions.sort(key=turn_key)
    _write_jsonl(out / SESSIONS_FILE, sessions, empty=True)
    for name in (TRANSCRIPTS_FILE, METRICS_FILE, SELF_REPORT_FILE):
        _write_jsonl(out / name, (dict(r, shard=s.index) for s in shards
                                  for r in _iter_jsonl(s.path / name)))  # fmt: skip
    for name in ORACLE_FILES:  # keyed by the plan's session ids: no two shards share one
        _write_jsonl(out / name, (dict(r, run_id=run_id, shard=s.index) for s in shards
                                  for r in _iter_jsonl(s.path / name)))  # fmt: skip
    _merge_outcomes(shards, out)
    for s in shards:
        logs = s.path / SERVERS_DIR
        if logs.is_dir():
            for log in sorted(logs.iterdir()):
                dest = out / SERVERS_DIR / f"shard-{s.index}-{log.name}"
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, dest)

    offsets = [float(o) for s in shards if (o := _clock(s, "server_offset_s")) is not None]
    if len(offsets) > 1:
        result.largest_offset_s = round(max(offsets) - min(offsets), 3)
    lateness = [float(late) for s in shards if (late := _clock(s, "late_s")) is not None]
    meta = {k: v for k, v in first.items() if k not in ("shard", "finished", "run_id")}
    meta["run_id"] = run_id
    meta["merged"] = {
        "shards": count,
        "present": result.present,
        "missing": result.missing,
        "failed": {str(k): v for k, v in result.failed.items()},
        "from": [
            {"index": s.index, "dir": str(s.path), "run_id": s.meta.get("run_id"),
             "clock": s.clock, "finished": s.meta.get("finished")}
            for s in shards
        ],
        "largest_clock_offset_s": result.largest_offset_s,
        "latest_start_s": max(lateness) if lateness else None,
    }  # fmt: skip
    RunDir(out).write_meta(meta)
    (out / MERGE_FILE).write_text(json.dumps(meta["merged"], indent=2) + "\n")
    return result


def _clock(shard: _Shard, key: str) -> Any:
    return shard.clock.get(key) if shard.clock else None


def _merge_outcomes(shards: list[_Shard], out: Path) -> None:
    merged: dict[tuple[str, int], dict[str, Any]] = {}
    for s in shards:
        path = s.path / OUTCOMES_FILE
        if not path.is_file():
            continue
        for o in json.loads(path.read_text()):
            key = (o["label"], o["repeat"])
            row = merged.setdefault(
                key, {"label": o["label"], "repeat": o["repeat"], "sessions": 0, "ended": {},
                      "wall_s": 0.0, "error": None}
            )  # fmt: skip
            row["sessions"] += o.get("sessions", 0)
            for why, n in (o.get("ended") or {}).items():
                row["ended"][why] = row["ended"].get(why, 0) + n
            row["wall_s"] = max(row["wall_s"], o.get("wall_s") or 0.0)
            if o.get("error"):
                row["error"] = "; ".join(
                    filter(None, [row["error"], f"shard {s.index}: {o['error']}"])
                )
    (out / OUTCOMES_FILE).write_text(json.dumps(list(merged.values()), indent=2) + "\n")
