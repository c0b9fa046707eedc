"""The report's section on the exact oracles: replay alone, passkeys, the server's alarms."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from harness.analysis.summary import fmt_pct  # noqa: E402
from harness.report.tables import section  # noqa: E402

DPI = 110


def _ci(rate: float | None, ci: list[float]) -> str:
    if rate is None:
        return "-"
    return f"{fmt_pct(rate)} [{fmt_pct(ci[0])}, {fmt_pct(ci[1])}]"


def _having(variants: list[Mapping[str, Any]], oracle: str) -> list[Mapping[str, Any]]:
    """The variants that recorded ``oracle``'s rows."""
    return [v for v in variants if (v.get("oracles") or {}).get(oracle)]


NOT_EXACT = (
    "A server that declared no deterministic mode (its target file's `deterministic`, "
    "SGLang's `enable_deterministic_inference`, vLLM's `VLLM_BATCH_INVARIANT=1`, llama.cpp "
    "with one slot and no prompt cache) may differ alone and under load by arithmetic alone: "
    "there a token divergence is a lead, not a proof, no replay row enters the confirmed "
    "tier, and the scores are compared instead (the canary's KL under load against alone, "
    "turned on for it)."
)


COMPARED = {"tokens": "token ids", "token_strings": "token strings", "text": "text"}


def _compared(r: Mapping[str, Any]) -> str:
    by = r.get("compared_by") or {r.get("compared", "text"): r.get("replayed", 0)}
    return ", ".join(f"{COMPARED.get(k, k)} {n}" for k, n in by.items())


def _judged(r: Mapping[str, Any]) -> str:
    j = r.get("judge") or {}
    if not j.get("judged"):
        return "-"
    return f"{j['implausible']} / {j['plausible']}"


def _where(ex: Mapping[str, Any]) -> str:
    at = []
    if ex.get("token_index") is not None:
        at.append(f"token {ex['token_index']}")
    if ex.get("position") is not None:
        at.append(f"character {ex['position']}")
    return "first difference at " + (", ".join(at) or "-")


def _verdict(ex: Mapping[str, Any]) -> str:
    if not ex.get("judge_verdict"):
        return ""
    say = ("the judge calls the loaded continuation corrupted"
           if ex["judge_verdict"] == "implausible" else "the judge calls it plausible")  # fmt: skip
    return (f"; {say} (worst window {ex['judge_nll_worst']:.2f} nats/token, threshold "
            f"{ex['judge_threshold']:.2f})")  # fmt: skip


def replay_lines(variants: list[Mapping[str, Any]]) -> list[str]:
    if not (rows := _having(variants, "replay")):
        return []
    out = section("Replay alone (exact oracle)",
                  "Every sampled send was re-sent alone after the load, each session's sends in "
                  "order after one cache flush, and its output compared with the loaded one: "
                  "token by token where both answers carried the generated tokens, else the "
                  "text (reasoning, content, tool-call names and arguments). Where the server "
                  "scores, the judge scored each diverged send's loaded continuation from the "
                  "first difference (teacher-forced, after the same prompt and the common "
                  "prefix): implausible, the judge calls it corrupted; plausible, another "
                  "fluent answer.",
                  "variant", "server deterministic", "replayed", "compared by", "identical",
                  "diverged", "judge: implausible / plausible", "undecided",
                  "divergence [95% CI]", "extra requests (share of load)")  # fmt: skip
    for v in rows:
        r = v["oracles"]["replay"]
        share = fmt_pct(r["load_share"]) if r["load_share"] is not None else "-"
        out.append(f"| {v['label']} | {'yes' if r['exact'] else 'no'} | {r['replayed']} | "
                   f"{_compared(r)} | {r['identical']} | {r['diverged']} | {_judged(r)} | "
                   f"{r['undecided']} | {_ci(r['divergence_rate'], r['divergence_ci'])} | "
                   f"{r['extra_requests']} ({share}) |")  # fmt: skip
    exact = [v["label"] for v in rows if v["oracles"]["replay"]["exact"]]
    bad = [v["label"] for v in rows if v["oracles"]["replay"]["exact"]
           and v["oracles"]["replay"]["diverged"]]  # fmt: skip
    out.append("")
    if exact:
        out.append("On a server in a deterministic mode a send alone must give exactly what it "
                   "gave under load: every divergence is a bug to report, whatever its text "
                   "looks like (the judge's verdict says only how it reads)."
                   + (f" Diverged: {', '.join(bad)}." if bad else ""))  # fmt: skip
    if len(exact) < len(rows):
        out.append(NOT_EXACT)
    out.append("")
    for v in rows:
        r = v["oracles"]["replay"]
        out.append(f"- {v['label']}: replay {'exact' if r['exact'] else 'not exact'}: "
                   f"{r.get('exact_reason') or '-'}")  # fmt: skip
        j = r.get("judge") or {}
        if j.get("not_judged"):
            out.append(f"- {v['label']}: {j['not_judged']} diverged sends not judged"
                       + (f" ({j['error']})" if j.get("error") else ""))  # fmt: skip
    for v in rows:
        for ex in v["oracles"]["replay"]["examples"]:
            out += ["", f"- {v['label']} session {ex['session']} turn {ex['turn']} attempt "
                    f"{ex['attempt']}: {_where(ex)} (loaded: {ex['loaded_label']}){_verdict(ex)}",
                    ""]  # fmt: skip
            if ex.get("position") is None and ex.get("loaded_tokens") is not None:
                # the same text by other tokens: the ids around the first different one
                out += [f"  - loaded tokens: `{ex['loaded_tokens']}`",
                        f"  - alone tokens:  `{ex['alone_tokens']}`"]  # fmt: skip
            else:
                out += [f"  - loaded: `{(ex['loaded_text'] or '')!r}`",
                        f"  - alone:  `{(ex['alone_text'] or '')!r}`"]  # fmt: skip
    return out


def passkey_lines(variants: list[Mapping[str, Any]]) -> list[str]:
    if not (rows := _having(variants, "passkey")):
        return []
    out = section("Passkeys (exact oracle)",
                  "Each session got a random id in its first tool result and was asked for it "
                  "back later, as a tool-call argument. A wrong or missing id is a context "
                  "failure, checked exactly. The same asks were re-sent alone after the load: "
                  "the model's own recall failure, the floor the loaded rate is judged against "
                  "(the difference, not the raw rate, is the verdict).",
                  "variant", "asks checked", "wrong", "missing", "failure under load [95% CI]",
                  "failure alone [95% CI]", "excess [95% CI]", "worse under load (p)",
                  "extra requests (share of load)")  # fmt: skip
    for v in rows:
        p = v["oracles"]["passkey"]
        a, b = p["loaded"], p["alone"]
        share = fmt_pct(p["load_share"]) if p["load_share"] is not None else "-"
        pv = (
            "-"
            if p["p_value"] is None
            else f"{'yes' if p['worse_under_load'] else 'no'} ({p['p_value']:.3g})"
        )
        out.append(f"| {v['label']} | {a['checked']} | {a['wrong']} | {a['missing']} | "
                   f"{_ci(a['wrong_rate'], a['wrong_ci'])} | "
                   f"{_ci(b['wrong_rate'], b['wrong_ci'])} | "
                   f"{_ci(p['excess_wrong_rate'], p['excess_ci'])} | {pv} | "
                   f"{p['extra_requests']} ({share}) |")  # fmt: skip
    for v in rows:
        a = v["oracles"]["passkey"]["loaded"]
        if a["not_asked"]:
            out.append("")
            out.append(f"{v['label']}: {a['not_asked']} sessions ended before the ask was "
                       f"answered (checked: {a['checked']}): the passkeys say nothing of "
                       "them.")  # fmt: skip
    return out


def alarm_lines(variants: list[Mapping[str, Any]]) -> list[str]:
    if not (rows := _having(variants, "alarms")):
        return []
    out = section("The server's own alarms",
                  "Speculative acceptance per request (SGLang's meta_info): an average accept "
                  "length below the threshold after enough generated tokens points at a KV "
                  "mismatch, an accept rate above its threshold at degraded attention "
                  "(repetition). KV canary: `kv_canary violation` lines in the server log, tied "
                  "to the sends in flight when they were written.",
                  "variant", "sends checked", "acceptance alarms (length, rate)",
                  "alarm rate [95% CI]", "kv canary lines", "sends in flight at them")  # fmt: skip
    for v in rows:
        a = v["oracles"]["alarms"]
        sp, kv = a["spec_accept"], a["kv_canary"]
        out.append(f"| {v['label']} | {sp['checked']} | {sp['alarms']} ({sp['accept_length']}, "
                   f"{sp['accept_rate']}) | {_ci(sp['rate'], sp['ci'])} | {kv['count']} | "
                   f"{kv['sends']} |")  # fmt: skip
    return out


def plot_passkeys(summary: Mapping[str, Any], path: Path) -> Path | None:
    """Recall under load by how many tokens back the passkey was planted, per variant."""
    rows = [v for v in summary.get("variants", []) if (v.get("oracles") or {}).get("passkey")]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for v in rows:
        buckets = [b for b in v["oracles"]["passkey"]["by_distance"] if b["recall"] is not None]
        xs = [(b["from_tokens"] + b["to_tokens"]) / 2 for b in buckets]
        ax.plot(xs, [b["recall"] for b in buckets], marker="o", label=v["label"])
    ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("tokens between the planted passkey and the ask")
    ax.set_ylabel("passkeys recalled under load")
    ax.set_title("Passkey recall by distance")
    ax.legend(loc="lower left")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def markdown(summary: Mapping[str, Any]) -> list[str]:
    """The oracle sections (empty when no oracle ran)."""
    variants = list(summary.get("variants", []))
    return replay_lines(variants) + passkey_lines(variants) + alarm_lines(variants)
