"""A fixed corruption rate in one variant and none in the other, through the shipped
simulator target's ``fault_rate`` factor (``--fault-rate``): the simulator injects at that rate
whatever the load, the exact oracles find exactly what it injected, the report says how many
turns the difference took, and a gate on the oracles fails the command (exit 1).

The rate is 2 in 100 so that a small run sees a few dozen injected turns; the production-rate
version (3 in 10,000, 27,000 turns a variant) is measured in docs/oracles.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.stats import clopper_pearson
from harness.record.rundir import ORACLE_PASSKEY_FILE, ORACLE_REPLAY_FILE
from harness.record.turns import read_rows, read_turns
from tests.cli.test_cli_faults import harness

RATE = 0.02
BASE, TREATED = "fault_rate=0,deterministic=on", f"fault_rate={RATE},deterministic=on"


def _injected(r: dict[str, Any]) -> bool:
    return r.get("sim_injected") not in (None, "none")


@pytest.mark.slow
def test_a_fixed_rate_against_none(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = harness(
        "run", "--ab", f"fault_rate=0,{RATE}", "--ab", "deterministic=on", "--sessions", "60",
        "--turns", "8", "--max-context", "16000", "--speed", "1000", "--seed", "5",
        "--oracle", "replay", "--passkeys", "--no-progress", "--out", str(out),
        "--fail-if", "replay_diverged_turns > 0",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "replay_diverged_turns" in proc.stderr

    turns = read_turns(out / "turns.jsonl")
    by: dict[str, list[dict[str, Any]]] = {BASE: [], TREATED: []}
    for t in turns:
        by[t["variant"]].append(t)
    assert not [t for t in by[BASE] if _injected(t)]
    sent = [t for t in by[TREATED] if t["label"] != "transport_error"]
    hits = sum(map(_injected, sent))
    lo, hi = clopper_pearson(hits, len(sent), 0.999)
    assert lo <= RATE <= hi, (hits, len(sent))  # the rate, as the seed draws it
    assert hits >= 5

    for name, wrong in ((ORACLE_REPLAY_FILE, {"diverged"}), (ORACLE_PASSKEY_FILE, {"wrong"})):
        rows = read_rows(out / name)
        assert rows, name
        bad = [r for r in rows if r["status"] in wrong | {"missing"}]
        seen = [r for r in rows if _injected(r)]
        assert all(_injected(r) for r in bad), name  # precision 1.0
        assert len([r for r in seen if r in bad]) >= 0.95 * len(seen), name
    replayed = read_rows(out / ORACLE_REPLAY_FILE)
    assert len([r for r in replayed if r["status"] == "diverged"]) >= 5
    # compared token by token (the sessions asked for the ids), and each diverged send has
    # the judge's verdict on its loaded continuation
    assert {r["compared"] for r in replayed} == {"tokens"}
    diverged = [r for r in replayed if r["status"] == "diverged"]
    assert all(r["token_index"] >= 0 for r in diverged)
    assert all(r.get("judge_verdict") in ("implausible", "plausible") for r in diverged)

    summary = json.loads((out / "summary.json").read_text())
    [turn] = [c for c in summary["comparisons"] if c["unit"] == "turn"]
    assert turn["onset"]["turns_compared"] == min(len(by[BASE]), len(by[TREATED]))
    md = (out / "report.md").read_text()
    assert "How many turns it took" in md
