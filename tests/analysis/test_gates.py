from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from harness.analysis import gates
from harness.analysis.gates import GateResult
from harness.errors import UsageError


def variant(label: str, k: int, n: int, **kw: Any) -> dict[str, Any]:
    v: dict[str, Any] = {
        "label": label, "factors": {}, "sessions": n, "corrupted_sessions": k,
        "session_corruption_rate": k / n if n else None, "session_corruption_ci": [0.0, 1.0],
        "turn_corruption_rate": k / (4 * n) if n else None, "transport_errors": 0,
        "transport_error_rate": 0.0, "itl_p50_s": None, "labels": {"ok_text": n},
    }  # fmt: skip
    v.update(kw)
    return v


def summary(*variants: dict[str, Any], run_id: str = "run-1") -> dict[str, Any]:
    return {"run_id": run_id, "verdict": "v", "variants": list(variants), "comparisons": []}


S = summary(variant("k=a", 0, 40), variant("k=b", 7, 40, transport_error_rate=0.25))


@pytest.mark.parametrize(
    ("expr", "metric", "op", "threshold", "scope"),
    [
        ("session_corruption_rate > 0.01", "session_corruption_rate", ">", 0.01, None),
        ("turn_corruption_rate[index_k=bf16] >= 0.05", "turn_corruption_rate", ">=", 0.05,
         "index_k=bf16"),
        ("  transport_error_rate>.2 ", "transport_error_rate", ">", 0.2, None),
        ("corrupted_sessions != 0", "corrupted_sessions", "!=", 0.0, None),
        ("session_corruption_rate <= 1e-3", "session_corruption_rate", "<=", 0.001, None),
        ("session_corruption_rate > 2.5%", "session_corruption_rate", ">", 0.025, None),
        ("sessions < 10", "sessions", "<", 10.0, None),
        ("sessions == 40", "sessions", "==", 40.0, None),
        ("x[a=1, b=2] < -1", "x", "<", -1.0, "a=1, b=2"),
    ],
)  # fmt: skip
def test_parse_gate(expr: str, metric: str, op: str, threshold: float, scope: str | None) -> None:
    g = gates.parse_gate(expr)
    assert (g.metric, g.op, g.variant) == (metric, op, scope)
    assert g.threshold == pytest.approx(threshold)


@pytest.mark.parametrize(
    "expr",
    ["", "session_corruption_rate", "session_corruption_rate >> 1", "> 0.1", "rate > high",
     "rate => 0.1", "rate[] > 0.1", "rate > 0.1 and x < 2", "1rate > 0"],
)  # fmt: skip
def test_parse_gate_rejects_with_accepted_form(expr: str) -> None:
    with pytest.raises(UsageError, match="accepted form is METRIC OP NUMBER"):
        gates.parse_gate(expr)


def test_unscoped_gate_applies_to_every_variant() -> None:
    res = gates.evaluate_gates(S, ["session_corruption_rate > 0.01"])
    assert [(r.variant, r.passed) for r in res] == [("k=a", True), ("k=b", False)]
    assert res[1].value == pytest.approx(7 / 40)
    assert res[1].message.startswith("FAILED: session_corruption_rate = 0.175 in k=b")
    assert all(r.name == "session_corruption_rate > 0.01" for r in res)


def test_scoped_gate_and_operators() -> None:
    res = gates.evaluate_gates(S, ["transport_error_rate[k=b] >= 0.25"])
    assert [(r.variant, r.passed) for r in res] == [("k=b", False)]
    cases = {"<": False, "<=": True, "==": True, "!=": False, ">": False, ">=": True}
    for op, fails in cases.items():
        (r,) = gates.evaluate_gates(S, [f"corrupted_sessions[k=b] {op} 7"])
        assert r.passed is not fails, op


def test_null_metric_is_skipped_not_failed() -> None:
    res = gates.evaluate_gates(S, ["itl_p50_s > 0.1"])
    assert all(r.skipped and r.passed and r.value is None for r in res)


def test_bad_metric_variant_or_type() -> None:
    with pytest.raises(UsageError, match="unknown metric 'sesion_corruption_rate'.*session_corr"):
        gates.evaluate_gates(S, ["sesion_corruption_rate > 0"])
    with pytest.raises(UsageError, match="no variant 'k=z'.*k=a, k=b"):
        gates.evaluate_gates(S, ["sessions[k=z] > 0"])
    with pytest.raises(UsageError, match="labels is not a number"):
        gates.evaluate_gates(S, ["labels > 0"])
    # a bad expression anywhere rejects the lot before anything is judged
    with pytest.raises(UsageError):
        gates.evaluate_gates(S, ["sessions > 0", "sessions >>> 0"])


def test_check_exprs_before_a_run() -> None:
    (g,) = gates.check_exprs(["session_corruption_ci_lo > 0"])
    assert g.metric == "session_corruption_ci_lo"
    with pytest.raises(UsageError, match="unknown metric 'corruption'"):
        gates.check_exprs(["corruption > 0.1"])


def test_baseline_gate() -> None:
    before = summary(variant("k=a", 0, 40), variant("k=b", 7, 40), run_id="nightly-1")
    now = summary(variant("k=a", 9, 40), variant("k=b", 8, 40), variant("k=c", 3, 10))
    res = {r.variant: r for r in gates.baseline_gate(now, before)}
    assert not res["k=a"].passed  # 0/40 -> 9/40: one-sided Fisher p ~ 0.001
    assert "nightly-1" in res["k=a"].message
    assert res["k=b"].passed  # 7/40 -> 8/40 is noise
    assert res["k=c"].skipped
    assert res["k=c"].passed
    # an improvement never fails
    assert gates.all_passed(gates.baseline_gate(before, now))


def test_write_junit(tmp_path: Path) -> None:
    results = [
        GateResult("g1", "k=a", True, 0.0, "passed"),
        GateResult("g1", "k=b", False, 0.2, "FAILED: <too high> & more"),
        GateResult("g2", "k=b", True, None, "no value", skipped=True),
    ]
    path = gates.write_junit(tmp_path / "junit.xml", results)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("harness.k=a", "g1"), ("harness.k=b", "g1"), ("harness.k=b", "g2")]  # fmt: skip
    failure = cases[1].find("failure")
    assert failure is not None
    assert failure.get("message") == "FAILED: <too high> & more"
    assert cases[0].find("failure") is None
    assert cases[2].find("skipped") is not None


def test_result_line() -> None:
    res = gates.evaluate_gates(S, ["session_corruption_rate > 0.01"])
    line = gates.result_line(S, res)
    assert "\n" not in line
    doc = json.loads(line)
    assert doc["passed"] is False
    assert doc["failed_gates"] == 1
    assert doc["variants"]["k=b"]["corrupted_sessions"] == 7
    assert [g["passed"] for g in doc["gates"]] == [True, False]
    assert json.loads(gates.result_line(S, []))["passed"] is True
    nan = summary(variant("k=a", 0, 0, session_corruption_rate=float("nan")))
    assert (
        json.loads(gates.result_line(nan, []))["variants"]["k=a"]["session_corruption_rate"] is None
    )
