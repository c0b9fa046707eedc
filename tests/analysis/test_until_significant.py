"""--until-significant: rounds of sessions until the comparison is decided or the budget spent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.test_cli import harness

TARGET = """
name = "sim"
mode = "launch"
model = "m"
[launch]
command = ["{python}", "-m", "harness.sim", "--host", "{host}", "--port", "{port}"]
[ready]
paths = ["/health"]
timeout_s = 60
[factors.build.clean]
args = ["--index-k", "fp8"]
[factors.build.broken]
args = ["--force-fault", "salad"]
"""
SMALL = ["--sessions", "4", "--turns", "2", "--max-context", "6000", "--speed", "40",
         "--no-progress", "--on-corruption", "stop"]  # fmt: skip


@pytest.mark.slow
def test_stops_once_decided(tmp_path: Path) -> None:
    target = tmp_path / "t.toml"
    target.write_text(TARGET)
    out = tmp_path / "r"
    one_turn = [*SMALL[:2], "--turns", "1", *SMALL[4:]]  # a session a turn: counts as sessions
    proc = harness(
        "run",
        *one_turn,
        "--target",
        str(target),
        "--ab",
        "build=clean,broken",
        "--until-significant",
        "--max-sessions",
        "12",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    # 4 vs 4 sessions cannot reach p < 0.05/3; 8 vs 8 (0 against 8 corrupted) does
    assert "undecided" in proc.stderr
    assert "every comparison decided" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [v["sessions"] for v in summary["variants"]] == [8, 8]
    # round 2 ran backwards (broken, clean): the broken build's server, which ended round 1,
    # stayed up into round 2; three servers started for four blocks
    assert proc.stderr.count("starting the server") == 3
    assert "build=broken: the server stays up" in proc.stderr
    starts = (out / "servers" / "build-broken.log").read_text().count("=== ")
    assert starts == 1
    assert (out / "servers" / "build-clean.log").read_text().count("=== ") == 2
    blocks = json.loads((out / "outcomes.json").read_text())
    order = [o["label"] for o in blocks]
    assert order == ["build=clean", "build=broken", "build=broken", "build=clean"]


def test_the_dry_run_counts_every_round_s_server_starts(tmp_path: Path) -> None:
    target = tmp_path / "t.toml"
    target.write_text(TARGET)
    proc = harness(
        "run", "--target", str(target), "--ab", "build=clean,broken", "--sessions", "4",
        "--until-significant", "--max-sessions", "20", "--dry-run",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # 5 rounds of 2 blocks; each round after the first goes on with the last block's server
    assert "up to 5 rounds of 2 blocks" in proc.stdout
    assert "6 server starts at most; start-up alone may take up to 6 min" in proc.stdout


@pytest.mark.slow
def test_spends_the_budget_when_nothing_differs(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run",
        *SMALL,
        "--ab",
        "index_k=fp8,bf16",
        "--until-significant",
        "--max-sessions",
        "8",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    assert "budget spent" in proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [v["sessions"] for v in summary["variants"]] == [8, 8]


def test_the_decision_tests_turns_clustered_in_sessions(tmp_path: Path) -> None:
    from harness.analysis import sequential, stats

    def write(bad_sessions: int, bad_each: int) -> Path:
        rows = [{"variant": "a", "repeat": 0, "session": s, "turn": t, "corrupted": False,
                 "transport_error": None} for s in range(40) for t in range(10)]  # fmt: skip
        for s in range(40):
            for t in range(10):
                bad = s < bad_sessions and t < bad_each
                rows.append({"variant": "b", "repeat": 0, "session": s, "turn": t,
                             "corrupted": bad, "transport_error": None})  # fmt: skip
        path = tmp_path / f"t{bad_sessions}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path

    # 10 corrupted turns of 400 against none: spread over ten sessions, decided
    spread = write(10, 1)
    decided, why = sequential.decision(spread, ["a", "b"], look=1, looks=2, alpha=0.05)
    assert decided, why
    # the same 10 in one session: as good as one corrupted session, undecided
    assert stats.fisher_exact(10, 400, 0, 400) < 0.025
    packed = write(1, 10)
    decided, why = sequential.decision(packed, ["a", "b"], look=1, looks=2, alpha=0.05)
    assert not decided
    assert why.startswith("undecided at p < 0.025: b p=")


def test_needs_a_budget(tmp_path: Path) -> None:
    proc = harness("run", "--until-significant", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "needs --max-sessions" in proc.stderr
