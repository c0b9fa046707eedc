"""A two-factor matrix on the simulator: report, plots, JUnit and exit codes for CI gates."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tests.cli.test_cli import harness

VARIANTS = [
    "index_k=fp8,hicache=on",
    "index_k=fp8,hicache=off",
    "index_k=bf16,hicache=on",
    "index_k=bf16,hicache=off",
]


@pytest.mark.slow
def test_two_factor_matrix_with_gates(tmp_path: Path) -> None:
    out, junit = tmp_path / "r", tmp_path / "junit.xml"
    proc = harness(
        "run", "--sessions", "4", "--turns", "4", "--max-context", "10000", "--speed", "40",
        "--ab", "index_k=fp8,bf16", "--ab", "hicache=on,off", "--out", str(out),
        "--no-progress", "--fail-if", "session_corruption_rate > 0.99",
        "--fail-if", "transport_error_rate > 0.2", "--junit", str(junit),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [v["label"] for v in summary["variants"]] == VARIANTS
    assert {c["b"] for c in summary["comparisons"]} == set(VARIANTS[1:])
    html = (out / "report.html").read_text()
    assert all(v in html for v in VARIANTS)
    assert "data:image/png;base64," in html  # plots embedded: the file stands alone
    assert (out / "plots" / "corruption_by_variant.png").read_bytes()[:4] == b"\x89PNG"
    cases = ET.parse(junit).getroot().iter("testcase")
    assert sum(1 for _ in cases) == 2 * len(VARIANTS)  # one per variant and gate
    assert json.loads(proc.stdout.strip().splitlines()[-1])["passed"] is True

    failing = harness("report", str(out), "--fail-if", "turns >= 1", "--junit", str(junit))
    assert failing.returncode == 1
    root = ET.parse(junit).getroot()
    assert len(root.findall(".//failure")) == len(VARIANTS)
