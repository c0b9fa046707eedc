"""Turns -> per-variant summary (summary.json); the frames the plots draw are in frames.py.

Units:
- a *turn* is one request (one row of turns.jsonl, re-sends included). Turns that failed in
  transport carry no verdict: they are counted in ``transport_errors`` and left out of the
  turn-rate denominator. Requests the harness itself cancelled (Ctrl-C, a signal, the run
  timeout) carry none either, and are no server's fault: ``cancelled_turns``, in neither.
- a *session* is identified by (variant, repeat, session). It is corrupted if any of its turns
  is. Sessions whose every turn failed in transport are left out of the session denominator.

Comparisons put each variant (``b``) against the baseline (``a``, the first variant);
``diff`` is rate(b) - rate(a). p-values are Holm-corrected across the comparisons of one unit.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import (
    coverage,
    crossvariant,
    judge,
    livecontext,
    onset,
    oracles,
    stats,
    tiers,
    turnframe,
)
from harness.errors import UsageError
from harness.labels import ALL_LABELS, CANCELLED, CORRUPTED_LABELS, HARNESS_ERROR, TRANSPORT_ERROR
from harness.record import safejson
from harness.record.outcomes import server_deaths
from harness.record.rundir import CONFIRM_FILE, METRICS_FILE, RUN_FILE, TURNS_FILE
from harness.record.turns import read_rows

log = logging.getLogger(__name__)

Summary = dict[str, Any]
ALPHA = 0.05
CONF = 0.95
SESSION_KEY = ["variant", "repeat", "session"]


@dataclass
class RunData:
    run_dir: Path
    turns: pd.DataFrame
    meta: dict[str, Any] = field(default_factory=dict)
    metrics: pd.DataFrame | None = None

    @property
    def run_id(self) -> str:
        if self.meta.get("run_id"):
            return str(self.meta["run_id"])
        if not self.turns.empty and "run_id" in self.turns:
            return str(self.turns["run_id"].iloc[0])
        return self.run_dir.name

    @property
    def variants(self) -> list[str | Mapping[str, Any]]:
        order = self.meta.get("variants")
        if isinstance(order, list) and order:
            return list(order)
        return list(pd.unique(self.turns["variant"])) if not self.turns.empty else []


def parse_variant_label(label: str) -> dict[str, str]:
    """ "index_k=bf16,hicache=on" -> {"index_k": "bf16", "hicache": "on"} (best effort)."""
    out: dict[str, str] = {}
    for part in label.split(","):
        name, sep, level = part.partition("=")
        if sep:
            out[name.strip()] = level.strip()
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                log.warning("%s:%d: unreadable line skipped", path, lineno)
    return rows


def load_run(run_dir: Path | str) -> RunData:
    """Read turns.jsonl (required), run.json and metrics.jsonl (optional) of a run folder.

    The turns' text is kept only where the report quotes it (analysis.turnframe): the
    flagged turns, and those the after-load findings made corrupted."""
    run_dir = Path(run_dir)
    turns_path = run_dir / TURNS_FILE
    if not turns_path.is_file():
        raise UsageError(f"{run_dir}: no {TURNS_FILE} here; give the folder of a harness run")
    meta: dict[str, Any] = {}
    if (run_dir / RUN_FILE).is_file():
        try:
            loaded = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
            meta = safejson.printable(loaded) if isinstance(loaded, dict) else {}
        except json.JSONDecodeError as exc:
            log.warning("%s: unreadable, ignored (%s)", run_dir / RUN_FILE, exc)
    metrics = None
    if (run_dir / METRICS_FILE).is_file():
        mrows = _read_jsonl(run_dir / METRICS_FILE)
        if mrows:
            metrics = pd.DataFrame.from_records(mrows)
    greedy = meta.get("temperature") == 0
    frame = lost_to_deaths(turn_frame(run_dir, greedy=greedy), server_deaths(run_dir))
    if greedy:
        frame = with_reference(frame)
    turns = prepare(frame)
    turns = turnframe.fill_text(turns, turns_path, turns["is_corrupted"] | turns["is_suspect"])
    return RunData(run_dir=run_dir, turns=turns, meta=meta, metrics=metrics)


#: seconds before a server's death was seen in which a failed send counts as cut by it (the
#: watch looks every half second; a send in flight fails when the server goes)
DEATH_SLACK_S = 5.0


def lost_to_deaths(frame: pd.DataFrame, deaths: list[dict[str, Any]]) -> pd.DataFrame:
    """``lost_to_server_death`` on the failed sends of a variant whose server died under the
    load, from the moment it died: the death is the finding (outcomes.json), not a transport
    error rate of the server."""
    dated = [d for d in deaths if isinstance(d.get("at"), int | float)]
    if not dated or frame.empty or "transport_error" not in frame:
        return frame
    frame = frame.copy()
    failed = frame["transport_error"].map(lambda e: isinstance(e, str) and bool(e))
    sent = pd.to_numeric(frame.get("sent_at"), errors="coerce").fillna(0.0)
    took = pd.to_numeric(frame.get("latency_s"), errors="coerce").fillna(0.0)
    lost = pd.Series(False, index=frame.index)
    for d in dated:
        mine = (frame["variant"] == d.get("variant")) & (
            pd.to_numeric(frame.get("repeat"), errors="coerce").fillna(0) == (d.get("repeat") or 0)
        )
        lost |= mine & failed & (sent + took >= float(d["at"]) - DEATH_SLACK_S)
    frame["lost_to_server_death"] = lost
    return frame


def turn_frame(run_dir: Path, *, greedy: bool = False) -> pd.DataFrame:
    """turns.jsonl (the text of the flagged turns only: analysis.turnframe; ``greedy``: each
    answer's length and digest, for ``with_reference``) with what was found after the load:
    the judge's decisions (judge.jsonl, the confirmed tier) and the exact oracles' findings."""
    frame = turnframe.read_frame(run_dir / TURNS_FILE, greedy=greedy)
    decided, _ = judge.decide(judge.read_rows(run_dir))
    frame = tiers.merge_oracles(frame, oracles.oracle_evidence(run_dir))
    frame = tiers.merge_alone(frame, read_rows(run_dir / CONFIRM_FILE))  # re-sent alone
    return tiers.merge_judge(frame, decided)


def with_reference(frame: pd.DataFrame) -> pd.DataFrame:
    """Greedy runs: each answer against the other variants' answers to the same request (one
    cut short against another is confirmed corrupted: analysis.crossvariant)."""
    if "variant" not in frame or frame["variant"].nunique() < 2:
        return frame
    cols = [c for c in _REFERENCE_COLUMNS if c in frame]
    return tiers.merge_reference(frame, crossvariant.evidence(frame[cols].to_dict("records")))


#: what ``crossvariant.evidence`` reads of a row
_REFERENCE_COLUMNS = ("variant", "repeat", "session", "turn", "attempt", "content",
                      "content_chars", "content_digest", "finish_reason", "label",
                      "transport_error")  # fmt: skip


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Fill optional columns and add the derived booleans ``is_transport``, ``is_harness``
    (the harness failed on the turn: ``harness_error``) and ``is_corrupted``."""
    df = df.copy()
    defaults: dict[str, Any] = {
        "variant": "default", "repeat": 0, "session": 0, "turn": 0, "attempt": 0,
        "label": "", "transport_error": None, "inflight": np.nan, "prompt_tokens": np.nan,
        "completion_tokens": np.nan, "ttft_s": np.nan, "itl_s": np.nan, "latency_s": np.nan,
        "content": "", "evidence": None, "sim_injected": None, "noncanonical": False,
        "sent_at": np.nan,
    }  # fmt: skip
    for col, value in defaults.items():
        if col not in df:
            df[col] = value
    for col in ("repeat", "session", "turn", "attempt"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0).astype(int)
    for col in ("inflight", "prompt_tokens", "completion_tokens", "ttft_s", "itl_s", "latency_s",
                "sent_at"):  # fmt: skip
        df[col] = pd.to_numeric(df[col], errors="coerce").astype(float)
    df["label"] = df["label"].fillna("").astype(str)
    df["content"] = df["content"].fillna("").astype(str)
    df["variant"] = df["variant"].astype(str)
    # a send the server failed because its output was no text (verdict.turn.failure_verdict)
    # is corrupted, not a transport error
    failed = df["transport_error"].notna() & ~df["label"].isin(CORRUPTED_LABELS)
    df["is_transport"] = failed | (df["label"] == TRANSPORT_ERROR)
    errors = df["transport_error"].where(df["transport_error"].notna(), "").astype(str)
    df["is_cancelled"] = df["is_transport"] & errors.str.startswith(CANCELLED + ":")
    lost = df.get("lost_to_server_death", pd.Series(False, index=df.index))
    lost = lost.astype(object).where(lost.notna(), False).astype(bool)
    df["is_lost"] = df["is_transport"] & ~df["is_cancelled"] & lost
    if "corrupted" in df:
        flagged = df["corrupted"].fillna(False).astype(bool)
    else:
        flagged = df["label"].isin(CORRUPTED_LABELS)
    df["is_harness"] = (df["label"] == HARNESS_ERROR) & ~df["is_transport"]
    df["is_corrupted"] = flagged & ~df["is_transport"] & ~df["is_harness"]
    tiers.mark(df)  # is_corrupted: what the headline counts (structural + confirmed)
    return df


def _rate(k: int, n: int) -> tuple[float | None, list[float]]:
    lo, hi = stats.wilson(k, n, CONF)
    return (k / n if n else None), [lo, hi]


def _quantile(s: pd.Series, q: float) -> float | None:
    s = s.dropna()
    return float(s.quantile(q)) if len(s) else None


def _variant_summary(label: str, factors: Mapping[str, str], g: pd.DataFrame) -> dict[str, Any]:
    ok = g[~g["is_transport"] & ~g["is_harness"]]
    per_session = ok.groupby(SESSION_KEY)["is_corrupted"].any()
    n_sess, k_sess = int(per_session.size), int(per_session.sum())
    n_turns, k_turns = int(len(ok)), int(ok["is_corrupted"].sum())
    n_cancelled = int(g["is_cancelled"].sum())
    n_lost = int(g["is_lost"].sum())  # cut by the server's own death: that finding, apart
    n_transport = int(g["is_transport"].sum()) - n_cancelled - n_lost
    n_sent = len(g) - n_cancelled - n_lost
    s_rate, s_ci = _rate(k_sess, n_sess)
    per = ok.groupby(SESSION_KEY)["is_corrupted"].agg(["sum", "size"])
    deff = stats.cluster_design_effect(per["sum"].tolist(), per["size"].tolist())
    t_rate = k_turns / n_turns if n_turns else None
    t_ci = list(stats.clustered_interval(k_turns, n_turns, deff, CONF))
    counts = g["label"].value_counts()
    labels = {lab: int(counts[lab]) for lab in ALL_LABELS if lab in counts}
    labels.update({str(lab): int(c) for lab, c in counts.items() if lab not in labels})
    first = ok[ok["is_corrupted"]].groupby(SESSION_KEY)["turn"].min()
    out: dict[str, Any] = {
        "label": label,
        "factors": dict(factors),
        "repeats": int(g["repeat"].nunique()),
        "sessions": n_sess,
        "sessions_seen": int(g.groupby(SESSION_KEY).ngroups) if len(g) else 0,
        "turns": int(len(g)),
        "classified_turns": n_turns,
        "lost_to_server_death": n_lost,
        "corrupted_sessions": k_sess,
        "corrupted_turns": k_turns,
        "session_corruption_rate": s_rate,
        "session_corruption_ci": s_ci,
        "turn_corruption_rate": t_rate,
        "turn_corruption_ci": t_ci,
        "turn_design_effect": round(deff, 4),
        "session_corruption_ci_lo": s_ci[0],
        "session_corruption_ci_hi": s_ci[1],
        "turn_corruption_ci_lo": t_ci[0],
        "turn_corruption_ci_hi": t_ci[1],
        "labels": labels,
        "transport_errors": n_transport,
        "transport_error_rate": n_transport / n_sent if n_sent else None,
        "cancelled_turns": n_cancelled,
        "harness_errors": int(g["is_harness"].sum()),
        "retries": int((g["attempt"] > 0).sum()),
        "noncanonical_turns": int(g["noncanonical"].fillna(False).astype(bool).sum()),
        "first_corrupted_turn_median": float(first.median()) if len(first) else None,
        "prompt_tokens_max": _quantile(ok["prompt_tokens"], 1.0),
        "ttft_p50_s": _quantile(ok["ttft_s"], 0.5),
        "ttft_p95_s": _quantile(ok["ttft_s"], 0.95),
        "itl_p50_s": _quantile(ok["itl_s"], 0.5),
        "itl_p95_s": _quantile(ok["itl_s"], 0.95),
        "latency_p50_s": _quantile(ok["latency_s"], 0.5),
    }
    out.update(tiers.variant_tiers(ok))
    out.update(livecontext.cache_summary(ok))
    out.update(coverage.dialect_summary(g))
    out.update(coverage.tool_call_summary(ok))
    said = coverage.reasoning_summary(ok)
    if said:
        out["warnings"] = [*out.get("warnings", []), *said.pop("warnings")]
        out.update(said)
    kinds = ok["sim_injected"].astype(str)
    known = ok["sim_injected"].notna() & (kinds != "")
    # corruption the simulator injected: not "none", not a transport fault
    injected = known & (kinds != "none") & ~kinds.str.startswith("transport:")
    if known.any():
        out["sim_injected_turns"] = int(injected.sum())
        n_injected = int(injected.sum())
        out["sim_recall"] = (
            float((ok["is_corrupted"] & injected).sum() / n_injected) if n_injected else None
        )
        out["sim_false_alarms"] = int((ok["is_corrupted"] & ~injected).sum())
        # the text detector's own false alarms, before the judge acquits them
        out["sim_suspect_false_alarms"] = int((ok["is_suspect"] & ~injected).sum())
        flagged = int(ok["is_corrupted"].sum())
        out["sim_precision"] = (
            float((ok["is_corrupted"] & injected).sum() / flagged) if flagged else None
        )
    return out


def fmt_pct(x: float | None) -> str:
    """A rate in percent: one decimal, two significant digits below 0.1% (3 in 10,000 is
    0.03%, not 0.0%)."""
    if x is None:
        return "n/a"
    return f"{100 * x:.2g}%" if 0 < abs(x) < 0.001 else f"{100 * x:.1f}%"


def fmt_diff(diff: float, lo: float, hi: float) -> tuple[str, str, str]:
    """A difference and its interval in percentage points, signed, with one number of
    decimals: two significant digits of the smallest that is not zero, at least one."""
    small = min((abs(x) for x in (diff, lo, hi) if x), default=1.0)
    places = max(1, 1 - math.floor(math.log10(100 * small))) if small < 0.001 else 1
    return f"{100 * diff:+.{places}f}", f"{100 * lo:+.{places}f}", f"{100 * hi:+.{places}f}"


def fmt_p(p: float | None) -> str:
    return "n/a" if p is None else (f"{p:.2g}" if p >= 1e-3 else f"{p:.1e}")


def _hint(
    ra: float, rb: float, na: int, nb: int, unit: str, alpha: float
) -> tuple[int | None, str]:
    if ra == rb:
        if ra == 0.0:
            ub = stats.upper_bound_zero(min(na, nb), CONF)
            return None, (
                f"no corruption in either; with {min(na, nb)} {unit}s each, a rate above "
                f"{fmt_pct(ub)} would probably have shown ({CONF:.0%} upper bound)"
            )
        return None, f"identical observed rates; no {unit} count detects a zero difference"
    n = stats.sample_size(rb, ra, alpha=alpha, power=0.8)
    enough = "already enough" if min(na, nb) >= n else f"have {min(na, nb)}"
    return n, (
        f"about {n} {unit}s per variant would detect {fmt_pct(rb)} vs {fmt_pct(ra)} "
        f"(alpha {alpha}, power 80%; {enough})"
    )


def _compare(base: dict[str, Any], v: dict[str, Any], unit: str, alpha: float) -> dict[str, Any]:
    """Sessions: Fisher's exact test and Newcombe's interval. Turns, clustered in sessions:
    the same on each arm's counts divided by its design effect (``stats.clustered_fisher``)."""
    kname, nname = ("corrupted_sessions", "sessions") if unit == "session" else (
        "corrupted_turns", "classified_turns")  # fmt: skip
    ka, na, kb, nb = base[kname], base[nname], v[kname], v[nname]
    comp: dict[str, Any] = {"a": base["label"], "b": v["label"], "unit": unit}
    if unit == "turn":
        da, db = base.get("turn_design_effect", 1.0), v.get("turn_design_effect", 1.0)
        p, (_, enb, _, ena) = stats.clustered_fisher(kb, nb, db, ka, na, da)
        comp.update(
            test="fisher_exact_design_effect", design_effect_a=da, design_effect_b=db,
            effective_n_a=ena, effective_n_b=enb,
        )  # fmt: skip
        # Newcombe's interval at the effective sample sizes
        d, lo, hi = stats.diff_ci(kb / db, nb / db, ka / da, na / da, CONF)
    else:
        comp["test"] = "fisher_exact"
        p = stats.fisher_exact(kb, nb, ka, na)
        d, lo, hi = stats.diff_ci(kb, nb, ka, na, CONF)
    comp.update({
        "k_a": ka, "n_a": na, "k_b": kb, "n_b": nb,
        "rate_a": ka / na if na else None, "rate_b": kb / nb if nb else None,
        "p_value": p, "p_holm": p, "diff": d, "diff_ci": [lo, hi],
    })  # fmt: skip
    if na and nb:
        comp["sample_size"], comp["hint"] = _hint(ka / na, kb / nb, na, nb, unit, alpha)
        if unit == "turn" and comp["sample_size"] is not None:
            deff = max(comp["design_effect_a"], comp["design_effect_b"])
            comp["sample_size"] = math.ceil(comp["sample_size"] * deff)
            comp["hint"] = _hint_turns(comp, deff, alpha)
    else:
        comp["sample_size"], comp["hint"] = None, f"no classified {unit}s on one side"
    return comp


def _hint_turns(c: dict[str, Any], deff: float, alpha: float) -> str:
    have = min(c["n_a"], c["n_b"])
    enough = "already enough" if have >= c["sample_size"] else f"have {have}"
    return (
        f"about {c['sample_size']} turns per variant would detect {fmt_pct(c['rate_b'])} vs "
        f"{fmt_pct(c['rate_a'])} (alpha {alpha}, power 80%, design effect {deff:.2f} of turns "
        f"clustered in sessions; {enough})"
    )


def _comparison_verdict(c: dict[str, Any], alpha: float) -> str:
    a, b, unit = c["a"], c["b"], c["unit"]
    if not c["n_a"] or not c["n_b"]:
        return f"cannot compare {b} with {a}: no classified {unit}s in {b if not c['n_b'] else a}"
    ra, rb = c["rate_a"], c["rate_b"]
    d: float = c["diff"]
    lo, hi = c["diff_ci"]
    if rb < ra:  # state the difference as "more minus less"
        d, lo, hi = -d, -hi, -lo
    ds, los, his = fmt_diff(d, lo, hi)
    rates = (
        f"{fmt_pct(max(ra, rb))} vs {fmt_pct(min(ra, rb))} of {unit}s (difference {ds} "
        f"points, {CONF:.0%} CI {los} to {his})"
    )
    if c["p_holm"] < alpha:
        more, less = (b, a) if rb > ra else (a, b)
        return f"{more} corrupts more than {less}: {rates}, p={fmt_p(c['p_holm'])}"
    return (
        f"no significant difference between {b} and {a}: {fmt_pct(rb)} vs {fmt_pct(ra)} "
        f"of {unit}s, p={fmt_p(c['p_holm'])}"
    )


def _variant_order(
    df: pd.DataFrame, order: Sequence[str | Mapping[str, Any]] | None
) -> list[tuple[str, dict[str, str]]]:
    seen: dict[str, dict[str, str]] = {}
    for item in order or []:
        if isinstance(item, Mapping):
            seen.setdefault(str(item["label"]), dict(item.get("factors") or {}))
        else:
            seen.setdefault(str(item), {})
    for label in pd.unique(df["variant"]) if len(df) else []:
        seen.setdefault(str(label), {})
    out = []
    for label, factors in seen.items():
        if not factors:
            rows = df[df["variant"] == label]
            first = rows["factors"].iloc[0] if "factors" in rows and len(rows) else None
            factors = dict(first) if isinstance(first, Mapping) else parse_variant_label(label)
        out.append((label, factors))
    return out


def summarize(
    df: pd.DataFrame,
    run_id: str,
    variants_order: Sequence[str | Mapping[str, Any]] | None = None,
    alpha: float = ALPHA,
) -> Summary:
    """The summary.json dict. ``variants_order``: labels or {"label", "factors"}; baseline first."""
    df = prepare(df) if "is_corrupted" not in df else df
    variants = [
        _variant_summary(label, factors, df[df["variant"] == label])
        for label, factors in _variant_order(df, variants_order)
    ]
    comparisons: list[dict[str, Any]] = []
    for unit in ("session", "turn"):
        comps = [_compare(variants[0], v, unit, alpha) for v in variants[1:]]
        for c, adj in zip(comps, stats.holm([c["p_value"] for c in comps]), strict=True):
            c["p_holm"] = adj
            c["significant"] = bool(adj < alpha and c["n_a"] and c["n_b"])
            c["verdict"] = _comparison_verdict(c, alpha)
            if unit == "turn":  # how many turns it took (Bonferroni over the comparisons)
                base, other = _in_order(df, c["a"]), _in_order(df, c["b"])
                c["onset"] = onset.significant_from(
                    base, other, alpha / len(comps), c["design_effect_a"], c["design_effect_b"]
                )
        comparisons.extend(comps)
    return {
        "run_id": run_id,
        "baseline": variants[0]["label"] if variants else None,
        "alpha": alpha,
        "confidence": CONF,
        "verdict": _run_verdict(variants, comparisons),
        "headline": tiers.headline(variants),
        "warnings": [f"{v['label']}: {w}" for v in variants for w in v.get("warnings", ())],
        "variants": variants,
        "comparisons": comparisons,
    }


def _in_order(df: pd.DataFrame, label: str) -> np.ndarray:
    g = df[df["variant"] == label]
    return onset.completion_order(g[~g["is_transport"] & ~g["is_harness"]])


def _run_verdict(variants: list[dict[str, Any]], comparisons: list[dict[str, Any]]) -> str:
    if not variants:
        return "no turns recorded"
    if len(variants) == 1:
        v = variants[0]
        lo, hi = v["session_corruption_ci"]
        return (
            f"{v['label']}: {v['corrupted_sessions']} of {v['sessions']} sessions corrupted "
            f"({fmt_pct(v['session_corruption_rate'])}, {CONF:.0%} CI {fmt_pct(lo)} "
            f"to {fmt_pct(hi)})"
        )
    session = [c for c in comparisons if c["unit"] == "session"]
    hits = [c["verdict"] for c in session if c["significant"]]
    if hits:
        return "; ".join(hits)
    if not any(v["sessions"] for v in variants):
        return "no classified sessions: every turn failed in transport, or none ran"
    worst = max(variants, key=lambda v: v["session_corruption_rate"] or 0.0)
    if not worst["corrupted_sessions"]:
        total = sum(v["sessions"] for v in variants)
        return f"no corrupted sessions in any variant ({total} sessions)"
    return (
        f"no variant differs significantly from the baseline {variants[0]['label']}; highest "
        f"session corruption: {worst['label']} {fmt_pct(worst['session_corruption_rate'])}"
    )
