"""The progress counts per variant and the lines that show them (terminal and CI logs)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.cli import progress as cli_progress
from harness.drive.driver import Progress, planned_turns
from harness.drive.session import SessionPlan

ROOT = Path(__file__).resolve().parents[2]


def plans(n: int, steps: int = 3, max_turns: int = 40) -> list[SessionPlan]:
    return [SessionPlan(i, i, "task", steps, max_turns, 2000, 8000) for i in range(n)]


def test_planned_turns_tighten_as_sessions_end() -> None:
    p = Progress()
    p.expect("b", plans(2))  # pending variants are known before they start
    p.begin("a", 0, plans(3))
    v = p.variants["a"]
    assert planned_turns(plans(1)[0]) == 4  # three tool steps and the answer
    assert (v.sessions, v.planned_turns, p.variants["b"].planned_turns) == (3, 12, 8)
    for _ in range(2):
        p.count(False, False, (0, 0))
    p.session_ended(0)  # ended after 2 turns: it counts for 2, not 4
    assert (v.turns, v.planned_turns, v.sessions_done) == (2, 10, 1)
    for _ in range(6):  # a session re-sending more than planned raises its count
        p.count(False, False, (0, 1))
    assert v.planned_turns == 12


def test_corrupted_sessions_rate_and_cancelled_apart() -> None:
    p = Progress()
    p.begin("a", 0, plans(4))
    for s in range(4):
        p.count(s == 1, False, (0, s))
    p.count(True, False, (0, 1))
    p.count(False, True, (0, 2))  # a transport error
    p.count(False, True, (0, 3), cancelled=True)  # stopped by the run: not the server's fault
    v = p.variants["a"]
    assert (len(v.corrupted_sessions), v.session_rate) == (1, 0.25)
    assert (v.transport_errors, v.cancelled, p.transport_errors) == (1, 1, 1)
    p.end()
    assert not v.running
    assert v.finished is not None


def test_suspect_sessions_are_shown_apart_from_corrupt_ones() -> None:
    p = Progress()
    p.begin("a", 0, plans(4))
    p.on_turn({"session": 0, "corrupted": True, "tier": "suspect"})
    p.on_turn({"session": 1, "corrupted": True, "tier": "structural"})
    p.on_turn({"session": 1, "corrupted": True, "tier": "suspect"})  # already corrupt
    p.on_turn({"session": 2, "corrupted": False})
    v = p.variants["a"]
    assert (len(v.corrupted_sessions), v.session_rate, v.corrupted_turns) == (1, 1 / 3, 1)
    line = cli_progress.variant_line(v, time.monotonic())
    assert "1 corrupt session (33.3%)" in line
    assert "1 more suspect" in line
    p.on_turn({"session": 0, "corrupted": True, "tier": "confirmed"})  # an oracle's verdict
    line = cli_progress.variant_line(v, time.monotonic())
    assert "2 corrupt sessions (66.7%)" in line
    assert "more suspect" not in line


def test_a_stopped_variant_says_stopped_with_what_was_planned_not_done() -> None:
    p = Progress()
    p.begin("a", 0, plans(2))  # 8 turns planned
    p.count(False, False, (0, 0))
    p.count(False, False, (0, 1), cancelled=True)  # Ctrl-C: the turn in flight cancelled
    p.session_ended(0)
    p.session_ended(1)
    p.end()
    line = cli_progress.variant_line(p.variants["a"], time.monotonic())
    assert "2/8 turns" in line
    assert "stopped after" in line
    assert "done" not in line.replace("sessions done", "")


def _counts() -> Any:
    p = Progress()
    p.begin("index_k=bf16,hicache=on", 0, plans(80, steps=26))
    for i in range(1234):
        p.count(i % 300 == 7, i % 500 == 3, (0, i % 80))
    for s in range(17):
        p.session_ended(s)
    return p.variants["index_k=bf16,hicache=on"]


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_narrow_lines_drop_fields_never_numbers(width: int) -> None:
    v = _counts()
    now = time.monotonic()
    full = cli_progress.variant_line(v, now)
    line = cli_progress.variant_line(v, now, width)
    assert len(line) <= width
    assert "1,234/" in line
    assert " turns" in line
    # every field kept is whole: its text is a field of the full line
    kept = line.split("  ")[-1].split(" · ")
    assert all(f in full for f in kept)
    if width >= 160:  # room for every field and a bar
        assert "corrupt sessions" in line
        assert "transport err" in line
        assert "ETA" in line
        assert "━" in line
    if width <= 60:
        assert "ETA" not in line
        assert "━" not in line


def test_the_view_lays_out_one_line_per_variant_and_the_run() -> None:
    p = Progress()
    p.expect("index_k=bf16", plans(2))
    p.begin("index_k=fp8", 0, plans(2))
    p.count(False, False, (0, 0))
    lines = cli_progress.ProgressView(p).lines(80)
    assert lines[0].startswith("run: 1/16 turns")
    assert lines[1].startswith("index_k=bf16")
    assert "waiting" in lines[1]
    assert "1/8 turns" in lines[2]
    assert "ETA" in lines[2]
    assert all(len(line) <= 80 for line in lines)
    narrow = cli_progress.ProgressView(p).lines(30)
    assert narrow[0] == "run: 1/16 turns · ETA 0:00"  # the load time gave way, not a number


def test_logs_go_through_the_display_console() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=100)
    root = logging.getLogger()
    before = list(root.handlers)
    with cli_progress.logs_through(console):
        logging.getLogger("harness.test").warning("server slow to answer")
    assert "server slow to answer" in buf.getvalue()
    assert root.handlers == before


async def test_without_a_terminal_a_line_per_variant_every_interval() -> None:
    p = Progress()
    written: list[str] = []

    async def work(announce: Any) -> str:
        p.begin("a", 0, plans(2))
        for i in range(8):
            p.count(False, False, (0, i % 2))
            await asyncio.sleep(0.15)
        p.end()
        announce("a: done")
        return "ok"

    assert await cli_progress.plain(p, work, written.append, interval_s=0.3) == "ok"
    running = [w for w in written if w.startswith("progress a") and "ETA" in w]
    assert len(running) >= 2
    # the variant's last line comes before the announcement that follows its end
    assert re.match(r"progress a +8/8 turns .*done in", written[-2])
    assert written[-1] == "a: done"


def test_help_and_version_import_no_heavy_module() -> None:
    code = (
        "import sys, harness.cli.main\n"
        "harness.cli.main.build_parser()\n"
        "heavy = {'pandas', 'scipy', 'matplotlib', 'numpy', 'rich', 'aiohttp', 'httpx'}\n"
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_help_shows_defaults_and_groups_and_typos_get_a_guess() -> None:
    from harness.cli.main import build_parser

    text = build_parser()._subparsers._group_actions[0].choices["run"].format_help()  # type: ignore[union-attr]
    for shown in ("--seed N", "(default: 1)", "(default: retry)", "(default: 120.0)",
                  "(default: abab)", "(default: 30.0)"):  # fmt: skip
        assert shown in text
    for group in ("workload:", "variants and servers:", "load and requests:", "run control:",
                  "output and progress:", "CI gates"):  # fmt: skip
        assert group in text
    typo = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--sesions", "3"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert typo.returncode == 2
    assert "did you mean --sessions?" in typo.stderr
    assert len(typo.stderr.strip().splitlines()) == 1
    sim = subprocess.run([sys.executable, "-m", "harness.cli", "sim", "--help"],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert "(default: 30000)" in sim.stdout
    assert "(default: bf16)" in sim.stdout
    cmd = subprocess.run([sys.executable, "-m", "harness.cli", "reprot", "x"],
                         capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert "did you mean report?" in cmd.stderr

    # every option of run sits in a group: the ungrouped section holds --help alone
    ungrouped = text.split("options:\n", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^  (--?[a-z-]+)", ungrouped, re.M) == ["-h"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ab", "index_k", "fp8,bf16"], "did you mean --ab index_k=fp8,bf16?"),
        (["--ab", "index_k:fp8,bf16"], "with '=' between the factor and its levels"),
        (["--fail-if", "session_corrupton_rate > 0.1"], "did you mean session_corruption_rate?"),
    ],
)
def test_argument_mistakes_say_what_was_meant(args: list[str], said: str) -> None:
    done = subprocess.run([sys.executable, "-m", "harness.cli", "run", *args, "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert done.returncode == 2
    assert said in done.stderr


def test_one_level_of_a_factor_is_said_to_compare_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--ab", "index_k=fp8", "--dry-run",
         "--out", str(tmp_path / "r")],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "--ab index_k=fp8 has one level" in done.stderr
    assert "nothing is compared on index_k" in done.stderr


@pytest.mark.slow
def test_ci_lines_count_the_turns_of_worker_processes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "run", "--sessions", "4", "--turns", "4",
         "--max-context", "9000", "--ab", "index_k=fp8,bf16", "--speed", "10", "--workers", "2",
         "--progress-interval", "0.3", "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]
    for variant in ("index_k=fp8", "index_k=bf16"):
        n = sum(r["variant"] == variant for r in rows)
        last = [line for line in proc.stderr.splitlines()
                if line.startswith(f"progress {variant} ")][-1]  # fmt: skip
        assert f" {n}/{n} turns · done in " in last
        assert "4/4 sessions done" in last
