"""What CI reads says what happened: the last JSON line and JUnit follow the exit code, gates
and baselines are checked against the planned variants before anything starts, and
``harness compare`` exits 1 on a regression and 2 when the runs share no variant."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import CLI, ROOT


def harness(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "OPENAI_API_KEY": ""},
    )


def last_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_folder(path: Path, variants: dict[str, tuple[int, int]]) -> Path:
    """A run folder with, per variant label, (sessions, corrupted sessions) of one turn each."""
    path.mkdir(parents=True)
    rows = []
    for label, (n, bad) in variants.items():
        factor, level = label.split("=")
        for s in range(n):
            corrupted = s < bad
            rows.append(
                {
                    "run_id": path.name, "variant": label, "factors": {factor: level},
                    "repeat": 0, "session": s, "turn": 0, "attempt": 0,
                    "label": "token_salad" if corrupted else "ok_text",
                    "corrupted": corrupted, "transport_error": None, "content": "x",
                }
            )  # fmt: skip
    (path / "turns.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (path / "run.json").write_text(
        json.dumps(
            {
                "run_id": path.name,
                "variants": [{"label": v, "factors": dict([v.split("=")])} for v in variants],
            }
        )
    )
    return path


def test_a_gate_naming_a_variant_not_planned_fails_before_anything_starts(
    tmp_path: Path,
) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run", "--ab", "index_k=fp8,bf16", "--out", str(out), "--no-progress",
        "--fail-if", "turn_corruption_rate[index_k=bf17] > 0.1",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "no variant 'index_k=bf17' is planned" in proc.stderr
    assert "index_k=fp8, index_k=bf16" in proc.stderr
    assert not out.exists()  # nothing started
    result = last_json(proc)
    assert (result["passed"], result["exit_code"]) == (False, 2)


def test_a_baseline_sharing_no_variant_is_an_error(tmp_path: Path) -> None:
    base = run_folder(tmp_path / "base", {"kv=f16": (10, 0)})
    assert harness("report", str(base)).returncode == 0
    out = tmp_path / "r"
    proc = harness(
        "run", "--ab", "index_k=fp8,bf16", "--baseline", str(base), "--out", str(out),
        "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "none of this run's variants (index_k=fp8, index_k=bf16) is in it" in proc.stderr
    assert not out.exists()
    # the same gate on a run made earlier
    other = run_folder(tmp_path / "other", {"index_k=fp8": (10, 0)})
    proc = harness("report", str(other), "--baseline", str(base))
    assert proc.returncode == 2, proc.stderr
    assert "none of this run's variants (index_k=fp8) is in it" in proc.stderr


def test_compare_exits_1_on_a_regression_2_when_nothing_is_shared(tmp_path: Path) -> None:
    a = run_folder(tmp_path / "a", {"kv=f16": (40, 0), "kv=q8": (40, 1)})
    b = run_folder(tmp_path / "b", {"kv=f16": (40, 0), "kv=q8": (40, 20)})
    same = run_folder(tmp_path / "same", {"kv=f16": (40, 0), "kv=q8": (40, 1)})
    apart = run_folder(tmp_path / "apart", {"kv=q4": (40, 0)})
    regressed = harness("compare", str(a), str(b))
    assert regressed.returncode == 1, regressed.stderr
    assert "REGRESSION" in regressed.stdout
    steady = harness("compare", str(a), str(same))
    assert steady.returncode == 0, steady.stderr
    assert "No significant regression" in steady.stdout
    none = harness("compare", str(a), str(apart))
    assert none.returncode == 2, none.stderr
    assert "share no variant" in none.stderr
    assert "No significant regression" not in none.stdout


@pytest.mark.slow
def test_the_last_line_and_junit_fail_an_exit_3_run(tmp_path: Path) -> None:
    out, junit = tmp_path / "r", tmp_path / "junit.xml"
    proc = harness(
        "run", "--sessions", "6", "--turns", "6", "--max-context", "12000", "--speed", "0.2",
        "--run-timeout", "3", "--out", str(out), "--no-progress", "--junit", str(junit),
        "--fail-if", "session_corruption_rate > 0.99",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    result = last_json(proc)
    assert result["passed"] is False
    assert result["exit_code"] == 3
    assert result["failed_gates"] == 0  # the gate held; the run did not
    assert "run timeout" in str(result["error"])
    text = junit.read_text()
    assert 'failures="1"' in text
    assert 'name="run"' in text
    assert "exit code 3" in text


@pytest.mark.parametrize("args", [["--sessions", "0"], ["--sesions", "3"]])
def test_an_argument_error_of_a_run_ends_stdout_with_the_json_line(args: list[str]) -> None:
    proc = harness("run", *args)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1  # one line
    doc = last_json(proc)
    assert doc["exit_code"] == 2
    assert doc["passed"] is False
    assert args[0] in str(doc["error"])


def test_report_checks_a_gate_on_an_unknown_variant_before_rebuilding(tmp_path: Path) -> None:
    run = run_folder(tmp_path / "r", {"k=a": (3, 0)})
    proc = harness("report", str(run), "--fail-if", "session_corruption_rate[k=zz] > 0.1")
    assert proc.returncode == 2, proc.stderr
    assert "no variant 'k=zz'" in proc.stderr
    assert not (run / "report.md").exists()  # nothing rebuilt first
    assert last_json(proc)["exit_code"] == 2
