"""SIGTERM and SIGHUP sent to a real ``harness run`` take the Ctrl-C path: the turns in flight
recorded as cancelled, the launched server's process group stopped, the report written and
marked interrupted, the resume hint, exit 128 + the signal's number."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.record.turns import read_turns
from tests.cli.test_cli import CLI, ROOT
from tests.standins import sim_pids

SMALL = ["--sessions", "6", "--turns", "6", "--max-context", "12000", "--no-progress"]


def gone(pid: int, wait_s: float = 10.0) -> bool:
    """The process has exited and been reaped (or is a zombie no one waits for yet)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_takes_the_ctrl_c_path(tmp_path: Path, sig: int, code: int) -> None:
    out = tmp_path / "r"
    seed = str(626262 + sig)
    junit = tmp_path / "junit.xml"
    proc = subprocess.Popen(
        [*CLI, "run", *SMALL, "--speed", "1", "--seed", seed, "--out", str(out)]
        + ["--junit", str(junit)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    turns = out / "turns.jsonl"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # some turns done, the others in flight
        if turns.exists() and len(turns.read_text().splitlines()) >= 4:
            break
        time.sleep(0.2)
    servers = sim_pids(f"--seed {seed}")
    assert len(servers) == 1, servers
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=90)
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr
    assert f"interrupted by {signal.Signals(sig).name}" in stderr
    assert f"harness run --resume {out}" in stderr
    assert gone(servers[0]), "the launched server outlived the harness"
    rows = read_turns(turns)
    assert any(str(r["transport_error"]).startswith("cancelled:") for r in rows)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] == signal.Signals(sig).name
    assert summary["verdict"].startswith("INTERRUPTED")
    (variant,) = summary["variants"]
    assert variant["cancelled_turns"] > 0
    assert variant["transport_errors"] == 0  # the cancelled turns are nobody's fault
    assert "INTERRUPTED" in (out / "report.md").read_text()
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["passed"] is False
    assert result["exit_code"] == code
    assert result["interrupted"] == signal.Signals(sig).name
    assert 'failures="1"' in junit.read_text()
    # `harness report` says so too
    again = subprocess.run(
        [*CLI, "report", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert "was interrupted (" in again.stderr
    assert json.loads((out / "summary.json").read_text())["interrupted"]


@pytest.mark.slow
def test_ctrl_c_while_the_report_is_written_keeps_the_turns_and_says_how_to_rebuild(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [*CLI, "run", "--sessions", "2", "--turns", "2", "--speed", "50", "--no-progress"]
        + ["--out", str(out)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    said = []
    for line in proc.stderr:  # the load is over when the report starts
        said.append(line)
        if line.startswith("writing the report"):
            proc.send_signal(signal.SIGINT)
            break
    stdout, stderr = proc.communicate(timeout=90)
    stderr = "".join(said) + stderr
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert f"harness report {out}" in stderr  # how to write it after all
    assert read_turns(out / "turns.jsonl")  # the turns are kept
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 130
    assert result["interrupted"] == "SIGINT"
    again = subprocess.run(
        [*CLI, "report", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert (out / "report.md").is_file()
