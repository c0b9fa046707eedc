"""A run folder: the name of every file in it, and the bookkeeping ``--resume`` reads.

Everything a run leaves behind is written as it happens, so a run that dies halfway keeps
every finished turn. ``sessions.jsonl`` notes each session that ran to its end: a resumed run
skips those, and sets aside the turns of the others (``turns.interrupted.jsonl``, kept, not
counted) before running them again from their start.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.errors import EnvironmentFailure, UsageError
from harness.record.turns import jsonl_rows

TURNS_FILE = "turns.jsonl"  # one line per finished turn (record.turns)
INTERRUPTED_FILE = "turns.interrupted.jsonl"  # turns of sessions a resume runs again
TRANSCRIPTS_FILE = "transcripts.jsonl"  # the exact requests (record.transcripts)
RUN_FILE = "run.json"  # the run's options and plan
SESSIONS_FILE = "sessions.jsonl"  # one line per session that ran to its end
OUTCOMES_FILE = "outcomes.json"  # one entry per finished variant
METRICS_FILE = "metrics.jsonl"  # the server's Prometheus numbers over time
SELF_REPORT_FILE = "selfreport.jsonl"  # the harness's own lag and CPU, per variant load
CONFIRM_FILE = "confirm.jsonl"  # corrupted turns re-sent alone
REFERENCE_FILE = "reference.jsonl"  # sessions re-run one at a time after the load
CANARY_FILE = "canary.jsonl"  # --canary: teacher-forced scores of the probes (run.canary_runner)
JUDGE_FILE = "judge.jsonl"  # --confirm: teacher-forced scores of judged turns (run.judge)
REFERENCE_ENDS_FILE = "reference_sessions.jsonl"  # which of those ran to their end
# the exact oracles (analysis.oracles): one row per checked send, keyed like confirm.jsonl
ORACLE_REPLAY_FILE = "oracle_replay.jsonl"  # --oracle replay: each send re-sent alone
ORACLE_PASSKEY_FILE = "oracle_passkey.jsonl"  # --passkeys: each asked-for passkey, checked
ORACLE_PASSKEY_ALONE_FILE = "oracle_passkey_alone.jsonl"  # the same asks with no load
ORACLE_ALARMS_FILE = "oracle_alarms.jsonl"  # the server's own alarms (spec accept, kv canary)
KV_CANARY_LINES_FILE = "kv_canary_lines.jsonl"  # the log's canary lines, kept as they are read
SUMMARY_FILE = "summary.json"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
TIDY_FILE = "turns"  # .parquet, or .csv without pyarrow
PLOTS_DIR = "plots"
SERVERS_DIR = "servers"  # one log per launched server
#: the target file as the run used it: resume and replay launch this copy (or a file the user
#: names), never a path that run.json names (a run folder is data)
TARGET_COPY = "target.toml"
#: what run.json and every printed command hold in place of a secret's value
MASK = "***"
SERVER_FACTS_FILE = "server_facts.jsonl"  # what each variant's server reported of itself
CLOCK_FILE = "clock.json"  # a shard's start against --start-at, its clock against the server's

SessionKey = tuple[str, int, int]  # (variant, repeat, session)


class _File:
    """A file of the run folder as a read-only attribute: ``run.turns`` is the folder's
    ``turns.jsonl``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, run: RunDir, owner: type[RunDir] | None = None) -> Path:
        return run.path / self.name


@dataclass(frozen=True)
class RunDir:
    """One run folder."""

    path: Path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    turns = _File(TURNS_FILE)
    transcripts = _File(TRANSCRIPTS_FILE)
    run_file = _File(RUN_FILE)
    sessions = _File(SESSIONS_FILE)
    outcomes = _File(OUTCOMES_FILE)
    clock = _File(CLOCK_FILE)

    def server_log(self, name: str) -> Path:
        return self.path / SERVERS_DIR / name

    def prepare(self) -> None:
        """Create the folder for a new run; one that holds anything is refused, one that
        cannot be written is an ``EnvironmentFailure``."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--out {self.path} is a file, not a folder; choose another --out")
        if self.path.exists() and any(self.path.iterdir()):
            raise UsageError(
                f"output folder {self.path} exists and is not empty; choose another --out "
                f"(or continue it with --resume {self.path})"
            )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".harness-write-check"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise EnvironmentFailure.writing(self.path, exc) from None

    def write_meta(self, meta: dict[str, Any], target: Path | None = None) -> None:
        """run.json, and a copy of the run's target file (``TARGET_COPY``)."""
        try:
            if target is not None:
                shutil.copyfile(target, self.path / TARGET_COPY)
            self.run_file.write_text(json.dumps(meta, indent=2) + "\n")
        except OSError as exc:
            raise EnvironmentFailure.writing(self.run_file, exc) from None

    def target_file(self, meta: dict[str, Any], named: Path | None) -> Path | None:
        """The target file to launch again for this folder: the one the user names, else
        the copy kept in it; never a path read from run.json (a crafted folder must not name
        what the harness runs). None: the run used no target file."""
        if named is not None:
            return named
        copy = self.path / TARGET_COPY
        if copy.is_file():
            return copy
        if meta.get("target"):
            raise UsageError(
                f"{self.path} keeps no copy of its target file ({TARGET_COPY}): name the file "
                f"to launch with --target FILE (run.json says {meta['target']})"
            )
        return None

    def read_meta(self, flag: str | None = None) -> dict[str, Any]:
        """run.json; a folder without one is not a run folder (``flag``: the option named it)."""
        if not self.run_file.is_file():
            where = f"{flag} {self.path}: not" if flag else f"{self.path} is not"
            raise UsageError(f"{where} a run folder (no {RUN_FILE} in it)")
        meta: dict[str, Any] = json.loads(self.run_file.read_text())
        return meta

    def mark_meta(self, **fields: Any) -> None:
        """Set fields of run.json (``interrupted``: the signal that cut the run short, or
        None once a run, resumed or not, went to its end); no run.json, nothing to mark."""
        try:
            meta = json.loads(self.run_file.read_text())
        except (OSError, ValueError):
            return
        meta.update(fields)
        self.write_meta(meta)

    def finished_sessions(self) -> set[SessionKey]:
        """(variant, repeat, session) of every session that ran to its end."""
        done: set[SessionKey] = set()
        if not self.sessions.exists():
            return done
        for line in self.sessions.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError, KeyError):
                row = json.loads(line)
                done.add((row["variant"], row["repeat"], row["session"]))
        return done

    def set_aside_unfinished(self, done: set[SessionKey]) -> int:
        """Move the turns of sessions that did not finish to turns.interrupted.jsonl (kept, not
        counted); their sessions run again from the start. Returns the number of rows moved."""
        path = self.turns
        if not path.exists():
            return 0
        keep: list[dict[str, Any]] = []
        moved: list[dict[str, Any]] = []
        for _, rec in jsonl_rows(path):
            key = (rec.get("variant", ""), rec.get("repeat", 0), rec.get("session", -1))
            (keep if key in done else moved).append(rec)
        if moved:
            with open(self.path / INTERRUPTED_FILE, "a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in moved)
            tmp = path.with_suffix(".jsonl.tmp")
            with open(tmp, "w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in keep)
            os.replace(tmp, path)
        return len(moved)


def unmasked_target_vars(saved: list[str], given: list[str], what: str) -> list[str]:
    """The --target-var items of a run again: run.json masks secret ones (``NAME=***``),
    which must be given again on the command line."""
    mine = {item.partition("=")[0] for item in given}
    out = [item for item in saved if item.partition("=")[0] not in mine]
    missing = [i.partition("=")[0] for i in out if i.partition("=")[2] == MASK]
    if missing:
        raise UsageError(
            f"{what}: --target-var {missing[0]} was masked in run.json; give it again "
            f"(--target-var {missing[0]}=VALUE), or have the target file read it with "
            f"{{env:NAME}}"
        )
    return out + list(given)
