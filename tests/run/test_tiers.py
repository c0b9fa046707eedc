"""The verdict's tiers end to end against the simulator: the judge confirms suspects after the
load by default, the headline counts structural + confirmed and says so; with the judge off
(or a server that cannot score) it rests on the text detector and says that instead. And a
reasoning model's text, wherever the server puts it, is never counted as corruption."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.cli.main import main
from harness.record.turns import read_turns
from tests.standins.openai import OpenAIStandin

ROOT = Path(__file__).resolve().parents[2]
#: sure to corrupt about half the turns (the race's odds capped), with every kind drawn
HEAVY = 1e6


def _run(url: str, out: Path, *extra: str, sessions: int = 12, turns: int = 6) -> tuple[int, str]:
    args = ["run", "--endpoint", url, "--sessions", str(sessions), "--turns", str(turns),
            "--out", str(out), "--no-progress", *extra]  # fmt: skip
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        code = main(args)
    return code, stdout.getvalue()


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


def test_the_headline_counts_structural_and_confirmed_turns(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=HEAVY, seed=2)
    code, printed = _run(url, tmp_path / "on")
    assert code == 0
    [v] = _summary(tmp_path / "on")["variants"]
    rows = read_turns(tmp_path / "on" / "turns.jsonl")
    flagged = [r for r in rows if r["corrupted"]]
    # (a loop that runs to the end is confirmed by its own text, at classification)
    assert {r["tier"] for r in flagged} <= {"structural", "suspect", "confirmed"}
    assert v["suspect_turns"] == sum(r["tier"] in ("suspect", "confirmed") for r in flagged) > 0
    assert v["structural_turns"] == sum(r["tier"] == "structural" for r in flagged)
    # the judge scored the suspects after the load, and only the confirmed ones count
    judged = [r for r in rows if r.get("judge_confirmed") is not None]
    assert {(r["session"], r["turn"], r["attempt"]) for r in flagged} <= {
        (r["session"], r["turn"], r["attempt"]) for r in judged
    }
    assert v["headline_basis"] == "structural+confirmed"
    assert v["corrupted_turns"] == v["structural_turns"] + v["confirmed_turns"]
    assert v["confirmed_turns"] == sum(
        bool(r.get("judge_confirmed")) or r["tier"] == "confirmed"
        for r in flagged
        if r["tier"] != "structural"
    )
    # the simulator's ground truth: a confirmed turn is an injected one
    for r in flagged:
        if r["tier"] == "confirmed" or (r["tier"] == "suspect" and r.get("judge_confirmed")):
            assert r["sim_injected"] != "none"
    assert "rates count structural + confirmed turns" in printed

    code, printed = _run(make_sim(fault_scale=HEAVY, seed=2), tmp_path / "off", "--judge", "off")
    [v] = _summary(tmp_path / "off")["variants"]
    assert v["suspect_turns"] > 0
    assert v["headline_basis"] == "structural+suspect"
    assert v["corrupted_turns"] == v["structural_turns"] + v["suspect_turns"]
    assert not (tmp_path / "off" / "judge.jsonl").exists()
    assert "the text detector alone" in printed
    assert "measured false alarms" in printed
    report = (tmp_path / "off" / "report.md").read_text()
    assert "## How the corrupted turns were found" in report


def test_a_server_that_cannot_score_leaves_the_headline_on_the_detector(tmp_path: Path) -> None:
    """The stand-in answers every turn with salad and cannot score a given text."""
    salad = "Par 设置 데이터 ->मेंToString()المwrite_through скийする فيщий dtype데이터 <｜User｜>("
    with OpenAIStandin(answer=salad) as server:
        scenario = str(ROOT / "scenarios" / "chat_docs.toml")
        code, printed = _run(
            server.url, tmp_path / "r", "--scenario", scenario, sessions=2, turns=2
        )
    summary = _summary(tmp_path / "r")
    [v] = summary["variants"]
    assert v["suspect_turns"] > 0
    assert v["headline_basis"] == "structural+suspect"
    assert v["corrupted_turns"] == v["suspect_turns"] + v["structural_turns"]
    assert summary["headline"]["detector_false_alarms"]["rate"] < 0.01
    assert "the text detector alone" in printed


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("where", ["field", "content", "template"])
def test_a_reasoning_model_is_not_corruption(
    where: str, stream: bool, make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8", reasoning=where)
    extra = [] if stream else ["--no-stream"]
    code, printed = _run(url, tmp_path / "r", *extra, sessions=4, turns=4)
    assert code == 0
    rows = read_turns(tmp_path / "r" / "turns.jsonl")
    assert rows
    assert not [r for r in rows if r["corrupted"]]
    calls = [r for r in rows if r["tool_calls"]]
    assert calls  # the tool calls after the reasoning were parsed as usual
    [v] = _summary(tmp_path / "r")["variants"]
    assert v["corrupted_sessions"] == 0
    if where == "field":
        assert all(r["reasoning"] for r in rows)
        assert "reasoning_in_content_turns" not in v
        assert "--reasoning-parser" not in printed
    else:
        assert all("</think>" in r["content"] for r in rows)
        assert v["reasoning_in_content_turns"] == len(rows)
        assert printed.count("--reasoning-parser") == 1  # said once
