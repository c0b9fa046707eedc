"""The report's sections on the after-load pass: corrupted turns re-sent alone, divergence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.analysis.confirm import CONFIRMED_UNDER_LOAD, REPRODUCES_ALONE, UNDECIDED
from harness.analysis.summary import fmt_pct
from harness.report.tables import section


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """Report sections for the confirmation split and the divergence (empty if neither)."""
    out: list[str] = []
    conf = [v for v in summary.get("variants", []) if v.get("confirm")]
    if conf:
        out += section("Corrupted turns re-sent alone",
                       "Each corrupted turn was re-sent once on the idle server. Clean alone: the "
                       "corruption needed the load (a concurrency bug). Corrupted again: a model "
                       "or prompt problem.",
                       "variant", "corrupted turns", "clean alone (under load only)", "rate",
                       "corrupted alone", "rate", "undecided")  # fmt: skip
        for v in conf:
            c = v["confirm"]
            out.append(f"| {v['label']} | {c['confirmed']} | {c[CONFIRMED_UNDER_LOAD]} | "
                       f"{fmt_pct(c['turn_rate_under_load'])} | {c[REPRODUCES_ALONE]} | "
                       f"{fmt_pct(c['turn_rate_alone'])} | {c[UNDECIDED]} |")  # fmt: skip
    div = [v for v in summary.get("variants", []) if v.get("divergence")]
    if div:
        out += section("Divergence under load",
                       "Sessions re-run alone after the load; a turn diverges when both runs sent "
                       "the same request and got well-formed tool calls that differ.",
                       "variant", "reference sessions", "turns compared", "diverged",
                       "rate [95% CI]")  # fmt: skip
        for v in div:
            d = v["divergence"]
            lo, hi = d["divergence_ci"]
            out.append(f"| {v['label']} | {d['reference_sessions']} | {d['compared_turns']} | "
                       f"{d['diverged_turns']} | {fmt_pct(d['divergence_rate'])} "
                       f"[{fmt_pct(lo)}, {fmt_pct(hi)}] |")  # fmt: skip
    return out
