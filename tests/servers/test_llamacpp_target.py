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


@pytest.mark.slow
def test_llamacpp_slots_are_verified_and_a_variable_it_ignores_is_caught(tmp_path: Path) -> None:
    """/props reports the slots: the shipped rules pass; levels that set a variable the
    server never reads leave both variants at the same slots, and the run says so."""
    _need_engine()
    common = ("--scenario", "scenarios/chat_docs.toml", "--sessions", "1", "--turns", "1",
              "--ab", "slots=1,8", "--no-stream", "--no-progress")  # fmt: skip
    good = harness("run", "--target", "scenarios/targets/llamacpp.toml", *common,
                   "--out", str(tmp_path / "good"), timeout=400)  # fmt: skip
    assert good.returncode == 0, good.stderr[-2000:]
    assert "warning" not in good.stderr
    summary = json.loads((tmp_path / "good" / "summary.json").read_text())
    assert summary["server_warnings"] == []
    said = {k: v["repeats"][0]["settings"] for k, v in summary["servers"]["variants"].items()}
    assert said == {"slots=1": {"props.total_slots": 1}, "slots=8": {"props.total_slots": 8}}

    shipped = Path("scenarios/targets/llamacpp.toml").read_text()
    ignored = shipped.replace('args = ["--parallel", "1"]', 'env = { LLAMACPP_SLOTS = "1" }')
    ignored = ignored.replace('args = ["--parallel", "8"]', 'env = { LLAMACPP_SLOTS = "8" }')
    assert ignored != shipped
    target = tmp_path / "ignored.toml"
    target.write_text(ignored)
    bad = harness("run", "--target", str(target), *common, "--out", str(tmp_path / "bad"),
                  timeout=400)  # fmt: skip
    assert bad.returncode == 0, bad.stderr[-2000:]
    assert "the server reports props.total_slots = 8, the target file expects '1'" in bad.stderr
    summary = json.loads((tmp_path / "bad" / "summary.json").read_text())
    warnings = summary["server_warnings"]
    assert any("differ only in slots" in w for w in warnings)
    assert "**Warning:**" in (tmp_path / "bad" / "report.md").read_text()
    assert _servers_left() == []


@pytest.mark.slow
def test_llamacpp_run_with_replay_and_passkeys_says_which_is_exact(tmp_path: Path) -> None:
    """--oracle replay and --passkeys on llama.cpp: the run completes; the replay is exact
    with one slot and the prompt cache off, and compares scores (the canary, turned on) with
    eight slots."""
    _need_engine()
    out = tmp_path / "r"
    shipped = Path("scenarios/coding_agent.toml").read_text()
    small = shipped.replace("start_context = 2000", "start_context = 300")
    small = small.replace("max_tokens = 1024", "max_tokens = 64").replace("steps = 26", "steps = 4")
    assert "start_context = 300" in small
    assert "max_tokens = 64" in small
    scenario = tmp_path / "agent.toml"
    scenario.write_text(small)
    proc = harness(
        "run", "--target", "scenarios/targets/llamacpp.toml", "--scenario", str(scenario),
        "--sessions", "2",
        "--turns", "2", "--max-context", "800", "--canary-rate", "0.2", "--ab", "slots=1,8",
        "--ab", "prompt_cache=off", "--no-stream", "--oracle", "replay", "--passkeys",
        "--out", str(out), "--no-progress",
        timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    by = {v["label"].split(",")[0]: v for v in summary["variants"]}
    one, eight = by["slots=1"]["oracles"]["replay"], by["slots=8"]["oracles"]["replay"]
    assert one["exact"] is True
    assert "one slot (--parallel 1) and --no-prompt-cache" in one["exact_reason"]
    assert eight["exact"] is False
    assert "canary" in by["slots=8"]  # the scores compared instead
    assert "canary" not in by["slots=1"]
    md = (out / "report.md").read_text()
    assert "replay exact: llama.cpp with one slot (--parallel 1) and --no-prompt-cache" in md
    assert "replay not exact" in md
    assert "## Passkeys (exact oracle)" in md  # (SmolLM2 may end its sessions before the ask)
    for v in summary["variants"]:
        p = v["oracles"]["passkey"]["loaded"]
        assert p["checked"] + p["not_asked"] + p["undecided"] >= 2  # each session: one or more
    assert _servers_left() == []
