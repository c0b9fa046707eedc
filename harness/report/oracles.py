"""The report's section on the exact oracles: replay alone, passkeys, the server's alarms."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.analysis.summary import fmt_pct


def _ci(rate: float | None, ci: list[float]) -> str:
    if rate is None:
        return "-"
    return f"{fmt_pct(rate)} [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]"


def replay_lines(variants: list[Mapping[str, Any]]) -> list[str]:
    rows = [v for v in variants if (v.get("oracles") or {}).get("replay")]
    if not rows:
        return []
    out = ["", "## Replay alone (exact oracle)", "",
           "Every sampled send was re-sent alone after the load, each session's sends in "
           "order after one cache flush, and its output compared with the loaded one "
           "(reasoning, content, tool-call names and arguments).", "",
           "| variant | server deterministic | replayed | identical | diverged | undecided | "
           "divergence [95% CI] | extra requests (share of load) |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for v in rows:
        r = v["oracles"]["replay"]
        share = fmt_pct(r["load_share"]) if r["load_share"] is not None else "-"
        out.append(f"| {v['label']} | {'yes' if r['exact'] else 'no'} | {r['replayed']} | "
                   f"{r['identical']} | {r['diverged']} | {r['undecided']} | "
                   f"{_ci(r['divergence_rate'], r['divergence_ci'])} | "
                   f"{r['extra_requests']} ({share}) |")  # fmt: skip
    exact = [v["label"] for v in rows if v["oracles"]["replay"]["exact"]]
    bad = [v["label"] for v in rows if v["oracles"]["replay"]["exact"]
           and v["oracles"]["replay"]["diverged"]]  # fmt: skip
    out.append("")
    if exact:
        out.append("On a server in a deterministic mode a send alone must give exactly what it "
                   "gave under load: every divergence is a bug to report, whatever its text "
                   "looks like." + (f" Diverged: {', '.join(bad)}." if bad else ""))  # fmt: skip
    if len(exact) < len(rows):
        out.append("A server that declared no deterministic mode (its target file's "
                   "`deterministic`, SGLang's `enable_deterministic_inference`, vLLM's "
                   "`VLLM_BATCH_INVARIANT=1`) may differ alone and under load by arithmetic "
                   "alone: there a divergence is a lead, not a proof, and no replay row "
                   "enters the confirmed tier.")  # fmt: skip
    for v in rows:
        for ex in v["oracles"]["replay"]["examples"]:
            out += ["", f"- {v['label']} session {ex['session']} turn {ex['turn']} attempt "
                    f"{ex['attempt']}: first difference at character {ex['position']} "
                    f"(loaded: {ex['loaded_label']})", "",
                    f"  - loaded: `{(ex['loaded_text'] or '')!r}`",
                    f"  - alone:  `{(ex['alone_text'] or '')!r}`"]  # fmt: skip
    return out


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """The oracle sections (empty when no oracle ran)."""
    variants = list(summary.get("variants", []))
    return replay_lines(variants)
