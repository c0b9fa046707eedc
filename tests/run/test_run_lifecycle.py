"""Run lifecycle through the CLI: dry-run, repeats, Ctrl-C, resume, run timeout."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from harness.record.turns import read_turns
from tests.cli.test_cli import CLI, ROOT, harness
from tests.standins import sim_processes

SMALL = ["--sessions", "6", "--turns", "6", "--max-context", "12000", "--no-progress"]


def ctrl_c_reaches_it() -> None:
    """In the child: SIGINT back to its default (pytest run in the background ignores it, and
    a child would inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run", "--ab", "index_k=fp8,bf16", "--repeats", "2", "--dry-run", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr
    order = [line for line in proc.stdout.splitlines() if "index_k=" in line]
    assert order, proc.stdout
    assert "harness.sim" in proc.stdout  # the command that would be launched
    assert not out.exists()


@pytest.mark.slow
def test_repeats_are_interleaved_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run",
        *SMALL,
        "--sessions",
        "3",
        "--ab",
        "index_k=fp8,bf16",
        "--repeats",
        "2",
        "--speed",
        "50",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((out / "run.json").read_text())
    assert [(o["variant"], o["repeat"]) for o in meta["order"]] == [
        ("index_k=fp8", 0),
        ("index_k=bf16", 0),
        ("index_k=fp8", 1),
        ("index_k=bf16", 1),
    ]
    seen = {(t["variant"], t["repeat"]) for t in read_turns(out / "turns.jsonl")}
    assert seen == {
        ("index_k=fp8", 0),
        ("index_k=bf16", 0),
        ("index_k=fp8", 1),
        ("index_k=bf16", 1),
    }
    summary = json.loads((out / "summary.json").read_text())
    assert [v["sessions"] for v in summary["variants"]] == [6, 6]


@pytest.mark.slow
def test_ctrl_c_keeps_every_turn_and_resume_finishes_the_run(tmp_path: Path) -> None:
    out = tmp_path / "r"
    seed = "515151"
    proc = subprocess.Popen(
        [
            *CLI,
            "run",
            *SMALL,
            "--ab",
            "index_k=fp8,bf16",
            "--speed",
            "2",
            "--seed",
            seed,
            "--out",
            str(out),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    deadline = time.monotonic() + 60
    turns = out / "turns.jsonl"
    while time.monotonic() < deadline:  # wait until some turns are on disk
        if turns.exists() and len(turns.read_text().splitlines()) >= 8:
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    rows = read_turns(turns)
    assert rows
    # the turns in flight are recorded as cancelled (one whose answer had come says it was
    # stopped while the answer was classified)
    stopped = "cancelled: the run was stopped"
    assert any((r["transport_error"] or "").startswith(stopped) for r in rows)
    assert (out / "summary.json").exists()  # the report covers what was done
    assert sim_processes(f"--seed {seed}") == []

    done_before = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
    again = harness("run", "--resume", str(out))
    assert again.returncode == 0, again.stderr
    done = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
    keys = Counter((d["variant"], d["repeat"], d["session"]) for d in done)
    assert len(keys) == 12  # every session of both variants finished
    assert max(keys.values()) == 1  # none was run twice
    assert done[: len(done_before)] == done_before
    rows = read_turns(turns)
    per_session = Counter((r["variant"], r["session"]) for r in rows if r["turn"] == 0)
    assert set(per_session) == {(k[0], k[2]) for k in keys}
    assert all(not r["transport_error"] for r in rows)  # cancelled rows were set aside
    assert (out / "turns.interrupted.jsonl").exists()


@pytest.mark.slow
def test_run_timeout_stops_the_run_with_exit_code_3(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = harness("run", *SMALL, "--speed", "0.2", "--run-timeout", "3", "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    assert "run timeout" in proc.stderr
    assert (out / "turns.jsonl").exists()
