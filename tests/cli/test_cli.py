"""The whole flow through the command line: real subprocesses, real simulator servers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.record.turns import read_turns
from tests.standins import sim_processes

CLI = [sys.executable, "-m", "harness.cli"]
ROOT = Path(__file__).resolve().parents[2]


def harness(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "OPENAI_API_KEY": "sk-test-secret-0001"},
    )


@pytest.mark.slow
def test_run_two_variants_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "run"
    seed = "424242"  # marks this test's simulator processes
    proc = harness(
        "run",
        "--sessions",
        "8",
        "--turns",
        "8",
        "--max-context",
        "16000",
        "--ab",
        "index_k=fp8,bf16",
        "--speed",
        "40",
        "--seed",
        seed,
        "--out",
        str(out),
        "--no-progress",
        "--fail-if",
        "session_corruption_rate[index_k=fp8] > 0.5",
        "--junit",
        str(tmp_path / "junit.xml"),
    )
    assert proc.returncode == 0, proc.stderr
    assert "index_k=bf16" in proc.stdout  # the per-variant table is printed
    result = json.loads(proc.stdout.strip().splitlines()[-1])  # the machine-readable line
    assert result["passed"] is True
    assert "testcase" in (tmp_path / "junit.xml").read_text()
    turns = read_turns(out / "turns.jsonl")
    assert {t["variant"] for t in turns} == {"index_k=fp8", "index_k=bf16"}
    required = {
        "run_id",
        "variant",
        "factors",
        "session",
        "turn",
        "inflight",
        "prompt_tokens",
        "cached_tokens",
        "completion_tokens",
        "ttft_s",
        "latency_s",
        "finish_reason",
        "label",
        "corrupted",
        "transport_error",
        "sim_injected",
        "content",
        "reasoning",
        "tool_calls",
    }
    assert all(required <= set(t) for t in turns)
    assert max(t["inflight"] for t in turns) > 1  # sessions really ran concurrently
    summary = json.loads((out / "summary.json").read_text())
    assert [v["label"] for v in summary["variants"]] == ["index_k=fp8", "index_k=bf16"]
    assert summary["variants"][0]["factors"] == {"index_k": "fp8"}
    assert summary["comparisons"][0]["unit"] == "session"
    assert 0 <= summary["comparisons"][0]["p_value"] <= 1
    md = (out / "report.md").read_text()
    # the report opens with what was run, and says how the labels agreed with the simulator
    head = md.split("## Verdict")[0]
    assert "## What was run" in head
    assert f"--seed {seed}" in head  # the command line as typed
    assert "- **harness version**: `0.1.0`" in head
    assert "- **dialect**: `dsml-v4`" in head
    assert "- **seed**: 424242" in head
    assert "- **server of index_k=bf16**: `sim`" in head
    assert "## The simulator's own accuracy" in md
    run_meta = json.loads((out / "run.json").read_text())
    assert run_meta["duration_s"] > 0
    assert run_meta["finished_at"]
    pngs = list((out / "plots").glob("*.png"))
    assert pngs
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert (out / "servers" / "index_k-bf16.log").exists()
    assert sim_processes(f"--seed {seed}") == []  # nothing left running
    # the report rebuilds from the folder, and a gate that holds fails the command
    again = harness("report", str(out), "--fail-if", "turns < 1000000")
    assert again.returncode == 1, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["passed"] is False
    assert "gate failed" in again.stderr
    # the API key never lands in the run folder
    for path in out.rglob("*"):
        if path.is_file():
            assert b"sk-test-secret-0001" not in path.read_bytes(), path


def test_unknown_factor_is_a_usage_error(tmp_path: Path) -> None:
    proc = harness("run", "--ab", "colour=red,blue", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "factor 'colour' is not defined in this target file" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


def test_bad_level_is_a_usage_error(tmp_path: Path) -> None:
    proc = harness("run", "--ab", "index_k=fp4,bf16", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "has no level 'fp4'" in proc.stderr


def test_unreachable_endpoint_is_an_infrastructure_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = harness(
        "run",
        "--endpoint",
        f"http://127.0.0.1:{port}",
        "--sessions",
        "2",
        "--out",
        str(tmp_path / "r"),
        "--no-progress",
    )
    assert proc.returncode == 3, proc.stderr
    assert "is the server up on that port?" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_existing_output_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "turns.jsonl").write_text("")
    proc = harness("run", "--sessions", "2", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "exists and is not empty" in proc.stderr


def test_bad_scenario_file(tmp_path: Path) -> None:
    bad = tmp_path / "s.toml"
    bad.write_text('name = "x"\nsessions = 0\n[[tools]]\nname = "f"\nkind = "echo"\n')
    proc = harness("run", "--scenario", str(bad), "--out", str(tmp_path / "r"))
    assert proc.returncode == 2
    assert "'sessions' must be at least 1" in proc.stderr
