"""``--canary``: probes scored teacher-forced alone, under load and alone again, against real
simulators (launched as the run launches them, and in-process on a loopback port)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.analysis import canary_deviations as analysis
from harness.cli.main import main
from harness.drive.driver import Progress
from harness.record.rundir import CANARY_FILE
from harness.record.turns import read_turns
from harness.report.build import write_report
from harness.run.execute import execute, write_run_json
from harness.run.options import RunOptions
from harness.workload.canary_probes import LONG_SHARES, probes, session_probe
from tests.run.endpoint_options import endpoint_options
from tests.run.test_replay import small_scenario

ROOT = Path(__file__).resolve().parents[2]


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run_dir / CANARY_FILE).read_text().splitlines()]


def _sim_target(tmp: Path, *extra: str) -> Path:
    """The simulator's target file with extra simulator flags (the race made likelier)."""
    text = (ROOT / "scenarios" / "targets" / "sim.toml").read_text()
    launch = '"--model", "{model}"'
    assert launch in text
    text = text.replace(launch, launch + "".join(f', "{x}"' for x in extra))
    text = text.replace('"{python}"', json.dumps(sys.executable))
    path = tmp / "sim.toml"
    path.write_text(text)
    return path


def test_probes_reach_the_scenario_maximum() -> None:
    scenario = small_scenario(4, max_context=16000)
    got = probes(scenario)
    assert [p.name for p in got[:3]] == ["prose", "code", "dsml"]
    longest = max(p.approx_tokens for p in got)
    assert 0.9 * 16000 < longest <= 16000 * 1.02
    assert len(got) == 3 + len(LONG_SHARES)
    assert "echo hello-repro" in got[2].continuation


def test_canary_separates_the_race_from_fp8(tmp_path: Path) -> None:
    target = _sim_target(tmp_path, "--fault-scale", "200")  # most long probes race
    out = tmp_path / "run"
    code = main([
        "run", "--target", str(target), "--sessions", "40", "--turns", "12", "--speed", "1",
        "--ab", "index_k=fp8,bf16", "--canary", "--canary-rate", "10", "--out", str(out),
        "--fail-if", "canary_deviating_share > 0.05",
    ])  # fmt: skip
    assert code == 1  # the gate fails bf16, and only bf16
    summary = json.loads((out / "summary.json").read_text())
    fp8, bf16 = summary["variants"]
    for v in (fp8, bf16):
        c = v["canary"]
        assert set(c) >= {"probes", "scored", "deviating_share", "max_kl", "noise_floor_kl"}
        assert 6 <= c["probes"] <= 8  # the fixed six, and up to two of the sessions' own
        assert c["scored"] >= 15
        assert c["alone_outliers"] == 0  # alone, nothing races
        assert c["sim_false_deviations"] == 0  # no deviation the simulator did not inject
        assert 0 < c["share_of_requests"] < 0.5
        assert v["canary_max_kl"] == c["max_kl"]
    assert fp8["canary"]["deviating"] == fp8["canary"]["sim_raced"] == 0
    assert fp8["canary"]["max_kl"] < analysis.KL_FLOOR
    assert bf16["canary"]["sim_raced"] > 0
    assert bf16["canary"]["sim_recall"] == 1.0  # every raced score deviates
    assert bf16["canary"]["max_kl"] > 100 * bf16["canary"]["noise_floor_kl"]
    [session_cmp] = [c for c in summary["comparisons"] if c["unit"] == "session"]
    assert session_cmp["canary_p_value"] < 0.05
    result = json.loads((out / "gates.json").read_text()) if (out / "gates.json").exists() else None
    if result is not None:
        failed = [g["variant"] for g in result if not g.get("passed", True)]
        assert failed == ["index_k=bf16"]
    plot = out / "plots" / "canary.png"
    assert plot.exists()
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def _run(url: str, out: Path, **opts: Any) -> RunOptions:
    scenario = small_scenario(12, turns=4, max_context=8000)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - a test
    options = endpoint_options(scenario, out, url, 12, **opts)
    write_run_json(options, "r1")
    await execute(options, "r1", Progress())
    return options


def _workload(run_dir: Path) -> list[tuple[Any, ...]]:
    return sorted(
        (r["session"], r["turn"], r["attempt"], r.get("content"), json.dumps(r.get("tool_calls")))
        for r in read_turns(run_dir / "turns.jsonl")
    )


async def test_canary_leaves_the_sessions_workload_unchanged(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    plain, canary = tmp_path / "plain", tmp_path / "canary"
    await _run(make_sim(index_k="fp8", speed=5.0), plain)
    await _run(make_sim(index_k="fp8", speed=5.0), canary, canary=True, canary_rate=50.0)
    assert _workload(plain) == _workload(canary)
    rows = _rows(canary)
    phases = {r["phase"] for r in rows}
    assert phases == {"alone_before", "load", "alone_after"}
    alone = [r for r in rows if r["phase"] == "alone_before"]
    assert len(alone) == 3 * 6  # every probe three times: the noise floor
    assert all(r["inflight"] == 0 for r in alone)
    # the sessions' own healthy turns become probes during the load (scored under load from
    # then on, when the load lasts), with their alone score after it
    own = {r["probe"] for r in rows if r["probe"].startswith("session_")}
    assert own
    for name in own:
        assert "alone_after" in {r["phase"] for r in rows if r["probe"] == name}
    [v] = write_report(canary)["variants"]
    assert v["canary"]["requests"] == len(rows)
    assert not (plain / CANARY_FILE).exists()


async def test_a_server_that_cannot_score_turns_the_canary_off_once(
    make_sim: Callable[..., str], tmp_path: Path
) -> None:
    # the simulator has no llama.cpp /tokenize shape: the canary says why, once, and the
    # run goes on
    await _run(make_sim(index_k="fp8"), tmp_path, canary=True, scoring_api="llamacpp")
    rows = _rows(tmp_path)
    assert [r["phase"] for r in rows] == ["off"]
    assert "tokenize" in rows[0]["error"]
    [v] = write_report(tmp_path)["variants"]
    assert v["canary"]["scored"] == 0
    assert v["canary"]["off"] == rows[0]["error"]
    assert v["turns"] == 12 * 4


def test_session_probe_is_a_healthy_turn_cut_in_two() -> None:
    text = "The build finished and every test passed; the report lists the slow ones. " * 3
    rec = {"label": "ok_text", "content": text, "corrupted": False, "attempt": 0}
    probe = session_probe(rec, 0)
    assert probe is not None
    assert probe.prompt + probe.continuation == text
    assert abs(len(probe.prompt) - len(text) / 2) < 20
    assert session_probe({**rec, "corrupted": True, "label": "token_salad"}, 0) is None
    assert session_probe({**rec, "attempt": 1}, 0) is None  # a re-send: not the workload's
    assert session_probe({**rec, "content": "short"}, 0) is None


def test_k3_and_topk_kl() -> None:
    assert analysis.k3([-1.0, -2.0], [-1.0, -2.0]) == 0.0
    assert analysis.k3([-1.0], [-1.1]) == pytest.approx(0.1**2 / 2, rel=0.05)
    with pytest.raises(ValueError, match="same tokens"):
        analysis.k3([-1.0], [])
    same = [{"1": -0.1, "2": -2.5}]
    assert analysis.topk_kl(same, same) == pytest.approx(0.0)
    assert analysis.topk_kl(same, [{"1": -2.5, "2": -0.1}]) > 1.0
