"""The judge: --confirm's teacher-forced scores of flagged and sampled turns, checked against
the simulator's ground truth; ``harness classify --judge URL`` on saved outputs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.analysis import judge as rule
from harness.cli.main import main
from harness.record.rundir import JUDGE_FILE
from harness.record.turns import read_turns
from harness.report.build import write_report
from harness.run.judge import sampled
from tests.run.test_replay import LOAD_SCALE, _fault_run


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


async def test_judge_confirms_what_the_simulator_injected(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(fault_scale=LOAD_SCALE)
    await _fault_run(url, tmp_path, 40, confirm=True, judge_sample=1.0)
    turns = read_turns(tmp_path / "turns.jsonl")
    flagged = [t for t in turns if t["corrupted"]]
    judged = _rows(tmp_path / JUDGE_FILE)
    assert flagged
    assert len(judged) >= 0.95 * len(turns)  # every turn, but the empty ones
    scored = [t for t in turns if "judge_nll" in t]
    assert len(scored) == len([j for j in judged if "judge_nll" in j])
    assert {(t["session"], t["turn"], t["attempt"]) for t in flagged} <= {
        (t["session"], t["turn"], t["attempt"]) for t in scored
    }
    confirmed = [t for t in scored if t["judge_confirmed"]]
    assert confirmed
    # against the ground truth: every confirmed turn was injected, no clean turn confirmed
    assert all(t["sim_injected"] not in (None, "none") for t in confirmed)
    clean = [t for t in scored if t["sim_injected"] == "none"]
    assert len(clean) > 100
    assert not [t for t in clean if t["judge_confirmed"]]
    [v] = write_report(tmp_path)["variants"]
    j = v["judge"]
    assert j["sim_precision"] == 1.0
    assert j["sim_false_positives"] == 0
    assert 0 < v["confirmed_session_corruption_rate"] <= v["session_corruption_rate"]
    assert "## Judge: teacher-forced confirmation" in (tmp_path / "report.md").read_text()


async def test_judge_samples_passed_turns_by_seed(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim(index_k="fp8")
    await _fault_run(url, tmp_path, 12, confirm=True, judge_sample=0.3)
    turns = read_turns(tmp_path / "turns.jsonl")
    judged = _rows(tmp_path / JUDGE_FILE)
    keys = {(j["session"], j["turn"], j["attempt"]) for j in judged}
    want = {
        (t["session"], t["turn"], t["attempt"])
        for t in turns
        if sampled(1, (t["variant"], t["repeat"], t["session"], t["turn"], t["attempt"]), 0.3)
    }
    assert keys == want
    assert 0.15 * len(turns) < len(keys) < 0.45 * len(turns)
    assert not [j for j in judged if j["flagged"]]


def test_window_nll_and_threshold() -> None:
    mean, worst = rule.window_nll([-0.1] * 20 + [-9.0] * 4 + [-0.1] * 20, window=8)
    assert mean == pytest.approx((0.1 * 40 + 36) / 44)
    assert worst == pytest.approx((36 + 0.4) / 8)
    assert rule.threshold([0.3] * 3) == rule.ABS_FLOOR  # too few healthy references
    assert rule.threshold([0.3, 0.31, 0.29, 0.3, 0.32, 5.0]) == rule.ABS_FLOOR
    wide = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert rule.threshold(wide) > 6.0


def _chat(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": "m", "messages": messages, "stream": False, "seed": 5}
    resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=10)
    resp.raise_for_status()
    message: dict[str, Any] = resp.json()["choices"][0]["message"]
    return message


def test_classify_judge_scores_saved_outputs(make_sim: Callable[..., str], tmp_path: Path) -> None:
    url = make_sim(index_k="fp8")
    lines = []
    for i in range(6):
        messages = [{"role": "user", "content": f"Question {i}: summarise the report in a line."}]
        answer = _chat(url, messages)
        lines.append({"id": f"ok{i}", "text": answer.get("content") or "", "source": "server",
                      "messages": messages})  # fmt: skip
    bad = dict(lines[0], id="changed")
    words = bad["text"].split()
    bad["text"] = " ".join(words[: len(words) // 2] + ["zebra", "quantum", "marmalade"] * 3)
    lines.append(bad)
    lines.append({"id": "no-prompt", "text": "hello"})
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert main(["classify", str(src), "-o", str(out), "--judge", url]) == 0
    got = {r["id"]: r for r in _rows(out)}
    assert set(got) == {x["id"] for x in lines}
    assert all(not got[f"ok{i}"]["judge_confirmed"] for i in range(6))
    assert got["changed"]["judge_confirmed"]
    assert got["changed"]["judge_nll_worst"] > got["ok0"]["judge_nll_worst"] + 2
    assert "judge_nll" not in got["no-prompt"]  # nothing to score it after
    assert got["ok0"]["label"] == "ok_text"


def test_classify_judge_against_a_server_that_cannot_score(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    url = make_sim()
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "hi", "context": "say hi"}) + "\n")
    code = main(["classify", str(src), "--judge", url, "--scoring-api", "llamacpp"])
    assert code == 3
