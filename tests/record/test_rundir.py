"""RunDir: the run folder's files and the bookkeeping --resume reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.record.rundir import INTERRUPTED_FILE, RunDir


def test_prepare_refuses_a_folder_with_something_in_it(tmp_path: Path) -> None:
    RunDir(tmp_path / "new").prepare()
    assert (tmp_path / "new").is_dir()
    (tmp_path / "new" / "x").write_text("")
    with pytest.raises(UsageError, match="exists and is not empty"):
        RunDir(tmp_path / "new").prepare()


def test_read_meta_says_which_flag_named_a_folder_that_is_no_run(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^--resume .*: not a run folder \(no run.json in it\)"):
        RunDir(tmp_path).read_meta("--resume")
    with pytest.raises(UsageError, match=r"is not a run folder \(no run.json in it\)"):
        RunDir(tmp_path).read_meta()
    RunDir(tmp_path).write_meta({"run_id": "r1"})
    assert RunDir(tmp_path).read_meta()["run_id"] == "r1"


def test_unfinished_sessions_are_set_aside_and_finished_ones_kept(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    run.sessions.write_text(
        json.dumps({"variant": "a", "repeat": 0, "session": 1, "ended": "done"}) + "\n{torn\n"
    )
    rows = [{"variant": "a", "repeat": 0, "session": s, "turn": t} for s in (1, 2) for t in (0, 1)]
    run.turns.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"variant": "a", "ses')
    done = run.finished_sessions()
    assert done == {("a", 0, 1)}
    assert run.set_aside_unfinished(done) == 2
    kept = [json.loads(x) for x in run.turns.read_text().splitlines()]
    moved = [json.loads(x) for x in (tmp_path / INTERRUPTED_FILE).read_text().splitlines()]
    assert {r["session"] for r in kept} == {1}
    assert len(kept) == 2
    assert {r["session"] for r in moved} == {2}
    assert len(moved) == 2
    assert RunDir(tmp_path / "none").set_aside_unfinished(done) == 0
