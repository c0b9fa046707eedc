"""Dialects end to end: ``harness run`` against ``harness sim --dialect X`` for every dialect
the simulator writes, the dialect said out loud, and a server whose tool parser leaks."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import labels as L
from harness.cli.main import main
from harness.record.turns import read_turns
from harness.sim.speaker import DEFAULT_MODELS, spoken

ROOT = Path(__file__).resolve().parents[2]
#: sure to corrupt about half the turns (the race's odds capped), with every kind drawn
HEAVY = 1e6


def _run(url: str, out: Path, *extra: str, sessions: int = 20, turns: int = 6) -> int:
    args = ["run", "--endpoint", url, "--sessions", str(sessions), "--turns", str(turns),
            "--out", str(out), "--no-progress", *extra]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(args)


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


def _patient_scenario(tmp_path: Path) -> Path:
    """The shipped scenario with room for re-sends: at the capped odds half the turns are
    corrupted, and a session whose three sends all were would end "attempts exhausted"."""
    shipped = (ROOT / "scenarios" / "coding_agent.toml").read_text()
    path = tmp_path / "patient.toml"
    path.write_text(shipped.replace("max_attempts = 3 ", "max_attempts = 12 "))
    return path


@pytest.mark.parametrize("dialect", spoken())
def test_every_dialect_end_to_end(
    dialect: str, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(dialect=dialect, model=DEFAULT_MODELS[dialect], fault_scale=HEAVY, seed=3)
    out = tmp_path / "run"
    scenario = str(_patient_scenario(tmp_path))
    assert _run(url, out, "--dialect", dialect, "--scenario", scenario) == 0
    rows = read_turns(out / "turns.jsonl")
    clean = [r for r in rows if r["sim_injected"] == "none"]
    injected = [r for r in rows if r["sim_injected"] not in ("none", None)]
    envelope = [r for r in injected if r["sim_injected"] in ("envelope", "json")]
    kinds = Counter(r["sim_injected"] for r in rows)
    assert len(clean) >= 40, kinds
    assert len(envelope) >= 5, kinds
    # no false corruption: every clean turn is a healthy tool call or answer
    assert [r["label"] for r in clean if r["corrupted"]] == []
    assert {r["label"] for r in clean} <= {L.OK_TOOL_CALL, L.OK_TEXT}
    found = [r for r in envelope if r["corrupted"]]
    assert len(found) / len(envelope) >= 0.95, [
        (r["sim_injected"], r["label"], r["content"][-200:]) for r in envelope if not r["corrupted"]
    ]
    v = _summary(out)["variants"][0]
    assert v["sim_recall"] >= 0.95
    assert v["sim_precision"] >= 0.95
    assert v["dialect"] == dialect
    assert v["dialect_from"] == "option"
    assert all(r["dialect"] == dialect for r in rows)


@pytest.mark.parametrize("dialect", spoken())
def test_a_leaking_parser_is_parser_leaks_in_every_dialect(
    dialect: str, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(dialect=dialect, model="m", fault_scale=0.0, tool_parser="off")
    out = tmp_path / "run"
    assert _run(url, out, "--dialect", dialect, sessions=4, turns=2) == 0
    rows = read_turns(out / "turns.jsonl")
    assert [(r["label"], r["evidence"].get("signals")) for r in rows if r["corrupted"]] == []
    assert {r["label"] for r in rows} == {L.PARSER_LEAK}
    assert {r["evidence"]["dialect"] for r in rows} <= {dialect, "glm45", "glm47"}


@pytest.mark.parametrize("dialect", ["dsml-v4", "hermes"])
def test_auto_decides_from_the_served_model_name(
    dialect: str, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(dialect=dialect, model=DEFAULT_MODELS[dialect], fault_scale=0.0)
    out = tmp_path / "run"
    assert _run(url, out, sessions=3, turns=3) == 0
    meta = json.loads((out / "run.json").read_text())
    assert meta["dialect"] == "auto"
    assert meta["dialects"]["default"] == {
        "dialect": dialect, "setting": "auto", "from": "model name",
        "model": DEFAULT_MODELS[dialect],
    }  # fmt: skip
    v = _summary(out)["variants"][0]
    assert (v["dialect"], v["dialect_from"]) == (dialect, "model name")
    assert v["labels"] == {L.OK_TOOL_CALL: 9}
    report = (out / "report.md").read_text()
    assert f"Tool-call dialect: {dialect} (from the model name)" in report
    assert f"{dialect} (from the model name)" in (out / "report.html").read_text()


def test_auto_settles_on_the_first_markup_when_the_name_does_not_tell(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(dialect="hermes", model="acme/house-model", fault_scale=0.0, tool_parser="off")
    out = tmp_path / "run"
    assert _run(url, out, sessions=3, turns=2) == 0
    rows = read_turns(out / "turns.jsonl")
    assert {r["label"] for r in rows} == {L.PARSER_LEAK}
    # the first turn read the markup with auto; from then on every turn is read as hermes
    first = min(rows, key=lambda r: r["sent_at"])
    assert first["dialect"] in ("auto", "hermes")
    assert Counter(r["dialect"] for r in rows)["hermes"] >= len(rows) - 3
    v = _summary(out)["variants"][0]
    assert (v["dialect"], v["dialect_from"]) == ("hermes", "markup")


@pytest.mark.parametrize("dialect", spoken())
def test_auto_settles_on_the_dialect_the_markup_shows(
    dialect: str, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """A model name that does not tell, a parser that leaks every call, faults everywhere:
    the first markup (often a near miss) settles the dialect the simulator speaks, including
    the versions that only their layout tells apart and Llama 4's bare call lists."""
    url = make_sim(
        dialect=dialect, model="acme/house-model", fault_scale=HEAVY, tool_parser="off", seed=2
    )
    out = tmp_path / "run"
    _run(url, out, sessions=6, turns=4)
    v = _summary(out)["variants"][0]
    assert (v["dialect"], v["dialect_from"]) == (dialect, "markup")
    rows = read_turns(out / "turns.jsonl")
    assert {r["dialect"] for r in rows} <= {"auto", dialect}


@pytest.mark.parametrize("dialect", ["glm47", "deepseek-v31", "mistral-v11"])
def test_auto_tells_a_version_from_the_layout_of_a_near_miss(
    dialect: str, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    """The server parses the good calls: the first markup in content is a broken call, the
    same markup in either version of the family but for its layout."""
    url = make_sim(dialect=dialect, model="acme/house-model", fault_scale=HEAVY, seed=2)
    out = tmp_path / "run"
    _run(url, out, sessions=6, turns=4)
    v = _summary(out)["variants"][0]
    assert (v["dialect"], v["dialect_from"]) == (dialect, "markup")


@pytest.fixture
def leaking_qwen(tmp_path: Path) -> Iterator[str]:
    """``harness sim`` as a Qwen3 server whose tool parser fails: a real process on port 0."""
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness.sim",
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--dialect",
            "hermes",
            "--tool-parser",
            "off",
            "--speed",
            "200",
            "--fault-scale",
            "0",
            "--log-level",
            "warning",
        ],  # fmt: skip
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert proc.poll() is None, "the sim exited"
            assert time.monotonic() < deadline, "the sim did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(port_file.read_text())}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_qwen_server_whose_parser_leaks(leaking_qwen: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    gate = "sessions_without_tool_calls > 0"
    args = ["run", "--endpoint", leaking_qwen, "--sessions", "4", "--turns", "3",
            "--out", str(out), "--no-progress", "--fail-if", gate]  # fmt: skip
    err = io.StringIO()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(err):
        code = main(args)
    assert code == 1  # the gate on sessions without tool calls fails the run
    rows = read_turns(out / "turns.jsonl")
    assert rows
    assert {r["label"] for r in rows} == {L.PARSER_LEAK}
    assert all(r["evidence"]["dialect"] == "hermes" for r in rows)
    assert all("hermes" in r["evidence"]["reason"] for r in rows)
    summary = _summary(out)
    v = summary["variants"][0]
    assert (v["dialect"], v["dialect_from"]) == ("hermes", "model name")
    assert v["sessions_without_tool_calls"] == 4
    assert v["tool_call_share"] == 0.0
    assert any("4 of 4 sessions got no tool call" in w for w in summary["warnings"])
    said = err.getvalue() + printed.getvalue()
    assert "dialect hermes (from the model name Qwen/Qwen3-8B)" in said
    assert "warning: default: 4 of 4 sessions got no tool call" in said
    assert "Warnings" in (out / "report.md").read_text()
