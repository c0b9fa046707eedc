"""``harness bisect``: levels in order, the search down the middle, the runs reused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.run.bisect import between, version_key


def test_levels_from_the_bad_end_to_the_good_one() -> None:
    levels = ["0.1.9", "0.1.10", "0.1.11", "0.1.12", "0.1.13"]
    assert between(levels, good="0.1.12", bad="0.1.10") == ["0.1.10", "0.1.11", "0.1.12"]
    assert between(levels, good="0.1.9", bad="0.1.11") == ["0.1.11", "0.1.10", "0.1.9"]
    with pytest.raises(UsageError, match="--good 0.2.0: not among the levels"):
        between(levels, good="0.2.0", bad="0.1.10")
    with pytest.raises(UsageError, match="the same level"):
        between(levels, good="0.1.10", bad="0.1.10")
    assert sorted(["0.1.10", "0.1.9", "0.2.0", "2026.4.8672.1"], key=version_key) == [
        "0.1.9", "0.1.10", "0.2.0", "2026.4.8672.1"
    ]  # fmt: skip


def _bisect(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "harness.cli.main", "bisect", "index_k",
           "--levels", "fp8,bf16", "--good", "fp8", "--bad", "bf16", "--alpha", "0.05",
           "--out", str(out), *extra, "--", "--demo", "--sessions", "48"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


@pytest.mark.slow
def test_the_simulators_bad_level_is_named_and_the_runs_reused(tmp_path: Path) -> None:
    """Against the simulator: index_k=bf16 (its injected corruption) is the bad level, fp8
    the good one; a second bisect over the same folder runs nothing again."""
    done = _bisect(tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["last_bad"], result["first_good"]) == ("bf16", "fp8")
    levels = {r["level"]: r for r in result["levels"]}
    assert levels["bf16"]["bad"]
    assert levels["bf16"]["p_value"] < 0.05
    assert not levels["fp8"]["bad"]
    assert (tmp_path / "index_k=bf16" / "summary.json").is_file()
    again = _bisect(tmp_path)
    assert again.returncode == 0
    assert "0 run now" in again.stdout
    assert all(r["reused"] for r in json.loads(again.stdout.strip().splitlines()[-1])["levels"])


def test_the_runs_own_ab_and_out_are_refused(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "harness.cli.main", "bisect", "index_k", "--levels",
           "fp8,bf16", "--good", "fp8", "--bad", "bf16", "--out", str(tmp_path), "--",
           "--ab", "index_k=fp8"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "sets --ab and --out of each run itself" in done.stderr
