"""A two-factor run through the llama.cpp target file: real servers launched per variant."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from harness.record.turns import read_turns
from tests.cli.test_cli import harness
from tests.servers.test_llamacpp import _need_engine


@pytest.mark.slow
def test_run_against_llamacpp_variants(tmp_path: Path) -> None:
    _need_engine()
    out = tmp_path / "r"
    proc = harness(
        "run", "--target", "scenarios/targets/llamacpp.toml",
        "--scenario", "scenarios/chat_docs.toml", "--sessions", "3", "--turns", "2",
        "--ab", "slots=1,8", "--no-stream", "--out", str(out), "--no-progress",
        timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    turns = read_turns(out / "turns.jsonl")
    assert {t["variant"] for t in turns} == {"slots=1", "slots=8"}
    # (a send that met a connection llama.cpp had closed is a ``dropped`` row, then re-sent)
    turns = [t for t in turns if not str(t["transport_error"]).startswith("dropped:")]
    assert not any(t["transport_error"] for t in turns)
    assert all(t["prompt_tokens"] and t["completion_tokens"] for t in turns)
    summary = json.loads((out / "summary.json").read_text())
    assert [v["sessions"] for v in summary["variants"]] == [3, 3]
    assert (out / "metrics.jsonl").exists()  # llama.cpp's /metrics was scraped
    logs = sorted(p.name for p in (out / "servers").iterdir())
    assert logs == ["slots-1.log", "slots-8.log"]
    assert _servers_left() == []


def _servers_left() -> list[str]:
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "-m harness.llamacpp" in cmd and "--port-file" not in cmd:  # launched by a target
            left.append(cmd)
    return left
