"""``harness run --oracle replay --passkeys`` from the command line: two variants of the
simulator in its deterministic mode, its race on in one (bf16) and absent in the other (fp8);
each oracle finds exactly what the simulator injected, summary.json carries the rates per
variant, and a gate on them fails the command (exit 1)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.analysis.oracles import oracle_evidence
from harness.record.rundir import ORACLE_PASSKEY_FILE, ORACLE_REPLAY_FILE
from harness.record.turns import read_rows
from tests.cli.test_cli_faults import harness, target_file

FACTORS = """
[factors.index_k.fp8]
args = ["--index-k", "fp8"]
[factors.index_k.bf16]
args = ["--index-k", "bf16"]
"""


def _injected(r: dict[str, Any]) -> bool:
    return r.get("sim_injected") not in (None, "none")


@pytest.mark.slow
def test_replay_and_passkeys_on_two_variants(tmp_path: Path) -> None:
    target = target_file(
        tmp_path, FACTORS, ("--enable-deterministic-inference", "--fault-scale", "9600")
    )
    out = tmp_path / "run"
    proc = harness(
        "run", "--target", str(target), "--ab", "index_k=fp8,bf16", "--sessions", "30",
        "--turns", "8", "--max-context", "16000", "--speed", "200", "--seed", "5",
        "--oracle", "replay", "--passkeys", "--no-progress", "--out", str(out),
        "--fail-if", "replay_diverged_turns > 0",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    by = {v["label"]: v for v in summary["variants"]}
    fp8, bf16 = by["index_k=fp8"], by["index_k=bf16"]
    assert fp8["replay_diverged_turns"] == 0
    assert bf16["replay_diverged_turns"] > 0
    assert fp8["passkey_wrong_rate"] == 0.0
    for v in (fp8, bf16):
        o = v["oracles"]
        assert o["replay"]["exact"] is True
        assert o["replay"]["extra_requests"] > 0
        assert o["passkey"]["extra_requests"] > 0
        assert o["passkey"]["load_share"] is not None
    for name in (ORACLE_REPLAY_FILE, ORACLE_PASSKEY_FILE):
        rows = read_rows(out / name)
        bad = [r for r in rows if r["status"] in ("diverged", "wrong", "missing")]
        seen = [r for r in rows if _injected(r)]
        assert all(_injected(r) for r in bad), name  # precision 1.0
        assert len([r for r in seen if r in bad]) >= 0.95 * len(seen), name
        assert not [r for r in rows if r["variant"] == "index_k=fp8" and _injected(r)]
    assert oracle_evidence(out)
    md = (out / "report.md").read_text()
    assert "## Replay alone (exact oracle)" in md
    assert "## Passkeys (exact oracle)" in md
