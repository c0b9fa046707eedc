"""A launch target of the simulator with transport faults, and the records of runs against it
reduced to what does not depend on timing, so two runs of one plan compare equal."""

from __future__ import annotations

import json
from pathlib import Path

# the simulator with corruption off and transport faults on: its faults are drawn per
# conversation and send, so the same sessions get the same answers however they are spread
SIM_FAULTS_TARGET = """
name = "sim-faults"
mode = "launch"
model = "deepseek-ai/DeepSeek-V4-Flash"
warm_up = false
flush_cache = false
[launch]
command = ["{python}", "-m", "harness.sim", "--host", "{host}", "--port", "{port}",
           "--model", "{model}", "--index-k", "fp8"]
stop_grace_s = 5
[ready]
paths = ["/health"]
timeout_s = 60
interval_s = 0.2
[factors.errors.few]
args = ["--error-rate", "0.03"]
[factors.errors.many]
args = ["--error-rate", "0.15", "--bad-json-rate", "0.05"]
"""
#: what depends on timing and load, not on the plan
VOLATILE = {"run_id", "cached_tokens", "sent_at", "ttft_s", "itl_s", "latency_s", "inflight"}


def stable_turns(run: Path) -> list[dict[str, object]]:
    """The turns of a run directory without their VOLATILE fields, in plan order."""
    rows = [json.loads(line) for line in (run / "turns.jsonl").read_text().splitlines()]
    return sorted(
        ({k: v for k, v in r.items() if k not in VOLATILE} for r in rows),
        key=lambda r: (r["variant"], r["repeat"], r["session"], r["turn"], r["attempt"]),
    )


def headline(run: Path) -> tuple[object, list[dict[str, object]]]:
    """The verdict of a run's summary and, per variant, its counts and rates."""
    summary = json.loads((run / "summary.json").read_text())
    keys = ("label", "sessions", "corrupted_sessions", "session_corruption_rate", "turns",
            "corrupted_turns", "turn_corruption_rate", "transport_errors", "labels")  # fmt: skip
    rows = [{k: v.get(k) for k in keys} for v in summary["variants"]]
    return summary["verdict"], rows
