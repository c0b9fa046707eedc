"""The self-report of a real run reaches summary.json and the report."""

from __future__ import annotations

import json
from pathlib import Path

from harness.report.build import write_report
from tests.cli.test_cli import harness


def test_run_reports_the_harness_own_cost(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = harness(
        "run",
        "--sessions",
        "4",
        "--turns",
        "4",
        "--max-context",
        "10000",
        "--speed",
        "40",
        "--out",
        str(out),
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    (me,) = summary["variants"][0]["harness_self"]
    assert me["turns"] > 0
    assert me["loop_lag_ms"]["samples"] > 0
    assert me["send_lag_ms"]["samples"] == me["turns"]  # every request's send was seen
    # every answer was judged off the event loop (harness.drive.judging), none on it
    assert me["judge_wait_ms"]["samples"] == me["turns"]
    # whether this machine kept up is its own business: the report says what the rows say
    rows = [json.loads(x) for x in (out / "selfreport.jsonl").read_text().splitlines()]
    assert summary["harness_saturated"] == [r["variant"] for r in rows if r["saturated"]]
    assert "## The harness itself" in (out / "report.md").read_text()
    # the load asked, as sent and as the simulator's /metrics saw it
    (variant,) = summary["variants"]
    assert variant["load"]["asked"] == 4
    assert variant["load"]["harness_inflight_p50"] <= 4
    assert "## The load the server saw" in (out / "report.md").read_text()

    # a saturated load is called out in both reports
    rows[0].update(saturated=True, warnings=["event-loop lag p99 900 ms > 100 ms"])
    (out / "selfreport.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = write_report(out)
    assert summary["harness_saturated"] == ["default"]
    assert "the harness was itself saturated" in (out / "report.md").read_text()
    assert "the harness was itself saturated" in (out / "report.html").read_text()
