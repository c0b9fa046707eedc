"""A run stopped by a signal during its after-load work (the replay oracle, the passkeys' lone
re-sends) and resumed: the resumed run does the lone work left undone, redoes none of what is
recorded, and ends with the report an uninterrupted run of the same plan makes.

The simulator in its deterministic mode with an exact fault rate (a seeded draw per
conversation and send) gives the same turns on every run of a seed, so the uninterrupted run
is the ground truth of the resumed one: the same rows in every oracle file, the same
``oracles`` and rates per variant in summary.json, the same sections of report.md (but those
with timings).

The stops fall in the first variant's after-load, the healthy one (fault_rate=0): the
simulator tells a lone re-send from a first send by its memory of the prompts it answered,
so on the fresh server of a resumed run a re-send of an injected send would draw the same
fault again (docs/oracles.md, "Resume"), where a deterministic server alone has no race."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.confirm import row_key
from harness.record.rundir import (
    JUDGE_FILE,
    KV_CANARY_LINES_FILE,
    ORACLE_ALARMS_FILE,
    ORACLE_PASSKEY_ALONE_FILE,
    ORACLE_PASSKEY_FILE,
    ORACLE_REPLAY_FILE,
)
from harness.record.turns import read_rows
from tests.cli.test_cli import CLI, ROOT, harness
from tests.standins import sim_processes

SEED = "737373"
RUN = [
    "run", "--ab", "fault_rate=0,0.05", "--ab", "deterministic=on", "--sessions", "16",
    "--turns", "6", "--max-context", "12000", "--speed", "1000", "--seed", SEED,
    "--oracle", "replay", "--passkeys", "--no-progress",
]  # fmt: skip
FILES = (ORACLE_REPLAY_FILE, ORACLE_PASSKEY_FILE, ORACLE_PASSKEY_ALONE_FILE, JUDGE_FILE)
#: the report's sections that hold no timing, run id or path
SAME = (
    "Variants", "Comparisons with the baseline", "How the corrupted turns were found",
    "Judge: teacher-forced confirmation", "Replay alone (exact oracle)",
    "Passkeys (exact oracle)", "The simulator's own accuracy",
)  # fmt: skip
TIMING = re.compile(r"_s$|_p\d+|harness_self|^load$|live_tokens|^ttft|^itl|^latency")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    proc = harness(*RUN, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _keys(run: Path, name: str) -> Counter[tuple[Any, ...]]:
    return Counter(row_key(r) for r in read_rows(run / name))


#: the lines of the onset (in the order the turns completed: a matter of timing)
ONSET = re.compile(r"^.*(turns each \(p =|significant from turn).*$", re.M)


def _sections(run: Path) -> dict[str, str]:
    parts = re.split(r"^## ", ONSET.sub("", (run / "report.md").read_text()), flags=re.M)[1:]
    return {p.split("\n", 1)[0]: p for p in parts}


def _untimed(v: dict[str, Any]) -> dict[str, Any]:
    return {k: x for k, x in v.items() if not TIMING.search(k)}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("watched", "rows"),
    [(ORACLE_REPLAY_FILE, 20), (ORACLE_PASSKEY_ALONE_FILE, 4)],
    ids=["during-the-replay", "during-the-passkeys-alone"],
)
def test_a_run_stopped_after_its_load_finishes_its_lone_work_on_resume(
    tmp_path: Path, uninterrupted: Path, watched: str, rows: int
) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*CLI, *RUN, "--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )
    path = out / watched
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and len(path.read_bytes().splitlines()) >= rows:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # (the Ctrl-C path: tests/run/test_run_signals.py)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-3000:]
    before = {name: (out / name).read_bytes() if (out / name).exists() else b"" for name in FILES}
    whole = {name: _keys(uninterrupted, name) for name in FILES}
    assert sum(_keys(out, watched).values()) < sum(whole[watched].values())  # cut short
    assert sim_processes(f"--seed {SEED}") == []

    again = harness("run", "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "left after it: " in again.stderr
    for name in FILES:
        got = _keys(out, name)
        assert max(got.values(), default=1) == 1, name  # nothing done twice
        assert got == whole[name], name  # and nothing left undone
        assert (out / name).read_bytes().startswith(before[name]), name  # the rows kept
    mine = json.loads((out / "summary.json").read_text())
    theirs = json.loads((uninterrupted / "summary.json").read_text())
    assert mine["interrupted"] is None
    for a, b in zip(mine["variants"], theirs["variants"], strict=True):
        assert a["oracles"] == b["oracles"], a["label"]
        assert _untimed(a) == _untimed(b), a["label"]
    untimed = [[{k: x for k, x in c.items() if k != "onset"} for c in s["comparisons"]]
               for s in (mine, theirs)]  # fmt: skip
    assert untimed[0] == untimed[1]  # ("onset": in the order the turns completed)
    report, reference = _sections(out), _sections(uninterrupted)
    for title in SAME:
        assert report[title] == reference[title], title


@pytest.mark.slow
def test_a_judge_cut_short_is_finished_by_a_resume(tmp_path: Path, uninterrupted: Path) -> None:
    """The judge's rows of a finished run cut back to their first three (as a stop during the
    judge leaves them): --resume scores the others, on a fresh server, and only them. (Their
    scores are not compared: the simulator scores a text against its memory of the answers it
    gave, which a fresh simulator lacks; a real model's scores need no memory.)"""
    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    rows = (out / JUDGE_FILE).read_bytes().splitlines(keepends=True)
    assert len(rows) > 3
    (out / JUDGE_FILE).write_bytes(b"".join(rows[:3]))
    again = harness("run", "--resume", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"fault_rate=0\.05[^:]*: the load is done; left after it: judge\n",
                     again.stderr)  # fmt: skip
    assert again.stderr.count("left after it:") == 1  # the healthy variant: nothing
    got = _keys(out, JUDGE_FILE)
    assert got == _keys(uninterrupted, JUDGE_FILE)
    assert max(got.values()) == 1
    assert (out / JUDGE_FILE).read_bytes().startswith(b"".join(rows[:3]))
    assert all("judge_nll" in r for r in read_rows(out / JUDGE_FILE))  # each one scored


@pytest.mark.slow
def test_a_judge_that_found_the_server_cannot_score_is_not_left_for_a_resume(
    tmp_path: Path,
) -> None:
    """The default judge, flagged turns, a simulator that cannot score (``--scoring off``):
    the judge records that it cannot score there, and a resume of the finished run finds no
    work left, so it starts no server (before, the judge's turns stayed "left" on every
    resume, each starting that variant's server again for nothing)."""
    out = tmp_path / "run"
    run = ["run", "--ab", "fault_rate=0.3", "--ab", "scoring=off", "--sessions", "6",
           "--turns", "4", "--max-context", "12000", "--speed", "1000", "--seed", "747474",
           "--no-progress", "--out", str(out)]  # fmt: skip
    first = harness(*run)
    assert first.returncode in (0, 1), first.stderr[-3000:]
    assert "the judge is off: the server cannot score a given text" in first.stderr
    rows = read_rows(out / JUDGE_FILE)
    marks = [r for r in rows if r.get("cannot_score")]
    assert len(marks) == 1, rows
    assert len(rows) == 1, rows  # no turn scored
    assert marks[0]["variant"] == "fault_rate=0.3,scoring=off"
    assert "404" in marks[0]["cannot_score"]
    logs = {p.name: p.stat().st_size for p in (out / "servers").iterdir()}
    again = harness("run", "--resume", str(out))
    assert again.returncode == first.returncode, again.stderr[-3000:]
    assert "left after it" not in again.stderr
    assert {p.name: p.stat().st_size for p in (out / "servers").iterdir()} == logs  # none ran
    assert read_rows(out / JUDGE_FILE) == rows  # nothing tried again
    assert sim_processes("--seed 747474") == []


@pytest.mark.slow
def test_kv_canary_lines_a_stop_left_unwritten_are_tied_on_resume(tmp_path: Path) -> None:
    """``--oracle kv_canary`` keeps each violation line of the server's log in the run folder
    as it reads it, during the load. A finished run's alarm rows removed (as a stop between
    the load and its after-load leaves them): the resume ties the kept lines to the sends in
    flight again, the same rows as the first time, with no server started."""
    out = tmp_path / "run"
    seed = "757575"
    first = harness(
        "run", "--ab", "fault_rate=0.3", "--ab", "kv_canary=log", "--oracle", "kv_canary",
        "--judge", "off", "--sessions", "6", "--turns", "4", "--max-context", "12000",
        "--speed", "1000", "--seed", seed, "--no-progress", "--out", str(out),
    )  # fmt: skip
    assert first.returncode in (0, 1), first.stderr[-3000:]
    [log] = (out / "servers").iterdir()
    written = log.read_text().count("kv_canary violation")
    kept = read_rows(out / KV_CANARY_LINES_FILE)
    assert written > 0
    assert len(kept) == written  # every line kept as read
    rows = read_rows(out / ORACLE_ALARMS_FILE)
    assert sum(r["alarm"] == "kv_canary_line" for r in rows) == written
    assert any(r["alarm"] == "kv_canary" for r in rows)
    (out / ORACLE_ALARMS_FILE).unlink()
    size = log.stat().st_size
    again = harness("run", "--resume", str(out))
    assert again.returncode == first.returncode, again.stderr[-3000:]
    assert f"the load is done; kv canary: {written} violation lines" in again.stderr
    assert "left after it" not in again.stderr
    assert log.stat().st_size == size  # no server started
    assert read_rows(out / ORACLE_ALARMS_FILE) == rows
    summary = json.loads((out / "summary.json").read_text())
    assert [v["kv_canary_alarms"] for v in summary["variants"]] == [written]
    assert sim_processes(f"--seed {seed}") == []
