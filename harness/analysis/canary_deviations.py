"""The canary's deviations (canary.jsonl -> each variant's ``canary`` in summary.json).

Per probe, the reference is the most central of its alone scores (see ``deviations``).
Every other score of the probe is compared with it token by token: ``r = lp - lp_ref`` and
the KL estimate SGLang's KL tests use, ``k3 = mean(exp(r) - 1 - r)`` (zero when the scores
agree, about ``r^2 / 2`` for small differences); and, where the server gave top-k lists,
the KL divergence of the reference's top-k distribution to the score's over the same tokens
(``topk_kl``).

The *noise floor* is the 90th percentile of the k3 of the other alone scores (the probes
scored alone again before the load, and once after it): what the arithmetic varies when
healthy. A score under load *deviates* when its k3 is above
``max(NOISE_FACTOR * noise_floor, KL_FLOOR)``: far above the noise floor, and above what
batch composition alone does (``KL_FLOOR``, about a 0.045-nat change on every token).
``canary_p_value`` compares the deviating shares of a variant and the baseline (Fisher's
exact test).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.analysis import stats
from harness.record import turns
from harness.record.rundir import CANARY_FILE

ALONE_BEFORE, LOAD, ALONE_AFTER = "alone_before", "load", "alone_after"
NOISE_FACTOR = 10.0
KL_FLOOR = 1e-3


def k3(ref: Sequence[float], got: Sequence[float]) -> float:
    """The k3 KL estimate of two scorings of the same tokens."""
    if not ref or len(ref) != len(got):
        raise ValueError("k3 needs two scorings of the same tokens")
    total = 0.0
    for a, b in zip(ref, got, strict=True):
        r = b - a
        total += math.expm1(r) - r
    return total / len(ref)


def topk_kl(ref: Sequence[Mapping[str, float]], got: Sequence[Mapping[str, float]]) -> float | None:
    """Mean KL(reference top-k || score) over positions, both renormalised over the
    reference's top-k ids (an id missing from the score gets its smallest value)."""
    if not ref or len(ref) != len(got):
        return None
    total = 0.0
    for p_top, q_top in zip(ref, got, strict=True):
        if not p_top or not q_top:
            return None
        floor = min(q_top.values())
        ids = list(p_top)
        p = [math.exp(p_top[i]) for i in ids]
        q = [math.exp(q_top.get(i, floor)) for i in ids]
        zp, zq = sum(p), sum(q)
        total += sum(pi / zp * math.log((pi / zp) / (qi / zq)) for pi, qi in zip(p, q, strict=True))
    return total / len(ref)


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    return turns.read_rows(run_dir / CANARY_FILE)


def _medoid(scores: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The alone score closest to the others (sum of k3): one odd alone score (a server that
    varies even alone) cannot become the reference."""
    if len(scores) <= 2:
        return scores[0]
    return min(
        scores,
        key=lambda a: sum(k3(a["logprobs"], b["logprobs"]) for b in scores if b is not a),
    )


def references(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], Mapping[str, Any]]:
    """Per (repeat, probe): the medoid of its alone scores (before and after the load)."""
    alone: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        key = (int(r.get("repeat", 0)), str(r.get("probe")))
        if r.get("phase") not in (ALONE_BEFORE, ALONE_AFTER) or not r.get("logprobs"):
            continue
        if not alone.get(key) or len(alone[key][0]["logprobs"]) == len(r["logprobs"]):
            alone.setdefault(key, []).append(r)
    return {key: _medoid(scores) for key, scores in alone.items()}


def alone_kl(
    rows_a: Sequence[Mapping[str, Any]], rows_b: Sequence[Mapping[str, Any]]
) -> float | None:
    """The median over probes of k3 between two variants' alone references (the same model
    and tokenizer: what a configuration changes in the arithmetic itself, load aside)."""
    ra, rb = references(rows_a), references(rows_b)
    kls = sorted(
        k3(ra[key]["logprobs"], rb[key]["logprobs"])
        for key in ra.keys() & rb.keys()
        if len(ra[key]["logprobs"]) == len(rb[key]["logprobs"])
    )
    return kls[len(kls) // 2] if kls else None


def deviations(rows: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], float]:
    """Each scored row (but the references) with its ``kl``, ``topk_kl``, ``max_abs_dlp``,
    and the noise floor: (rows, noise_floor_kl). Rows of one variant, any repeats.

    A probe's reference is the medoid of its alone scores (before and after the load); the
    noise floor is the 90th percentile of the other alone scores' k3 (robust to a few odd
    ones, which ``alone_outliers`` counts)."""
    refs = references(rows)
    out = []
    for r in rows:
        key = (int(r.get("repeat", 0)), str(r.get("probe")))
        ref = refs.get(key)
        if ref is None or r is ref or not r.get("logprobs"):
            continue
        a, b = ref["logprobs"], r["logprobs"]
        if len(a) != len(b):
            continue
        out.append({
            **{k: r.get(k) for k in ("phase", "probe", "repeat", "round", "t_s", "inflight",
                                     "prompt_tokens", "injected")},
            "kl": k3(a, b),
            "topk_kl": topk_kl(ref.get("top") or [], r.get("top") or []),
            "max_abs_dlp": max(abs(x - y) for x, y in zip(a, b, strict=True)),
        })  # fmt: skip
    kls = sorted(d["kl"] for d in out if d["phase"] != LOAD)
    floor = kls[min(len(kls) - 1, int(0.9 * len(kls)))] if kls else 0.0
    return out, floor


def variant_canary(rows: Sequence[Mapping[str, Any]], session_turns: int) -> dict[str, Any]:
    """The ``canary`` block of one variant."""
    devs, floor = deviations(rows)
    threshold = max(NOISE_FACTOR * floor, KL_FLOOR)
    load = [d for d in devs if d["phase"] == LOAD]
    after = [d["kl"] for d in devs if d["phase"] == ALONE_AFTER]
    odd = [d for d in devs if d["phase"] != LOAD and d["kl"] > threshold]
    deviating = [d for d in load if d["kl"] > threshold]
    requests = sum(1 for r in rows if r.get("phase") in (ALONE_BEFORE, LOAD, ALONE_AFTER))
    under_load = sum(1 for r in rows if r.get("phase") == LOAD)
    out: dict[str, Any] = {
        "probes": len({r.get("probe") for r in rows if r.get("logprobs")}),
        "dropped_probes": sorted({str(r.get("probe")) for r in rows if r.get("probe")}
                                 - {str(r.get("probe")) for r in rows if r.get("logprobs")}),
        "scored": len(load),
        "deviating": len(deviating),
        "deviating_share": len(deviating) / len(load) if load else None,
        "deviating_ci": list(stats.wilson(len(deviating), len(load))),
        "max_kl": max((d["kl"] for d in load), default=None),
        "median_kl": sorted(d["kl"] for d in load)[len(load) // 2] if load else None,
        "max_topk_kl": max((d["topk_kl"] for d in load if d["topk_kl"] is not None),
                           default=None),
        "noise_floor_kl": floor,
        "threshold_kl": threshold,
        "alone_after_max_kl": max(after, default=None),
        "alone_outliers": len(odd),
        "requests": requests,
        "requests_under_load": under_load,
        "failed": sum(1 for r in rows if r.get("error") and r.get("phase") != "off"),
        "share_of_requests": under_load / (under_load + session_turns)
        if under_load + session_turns else None,
        "workload_unchanged": True,
    }  # fmt: skip
    off = [r.get("error") for r in rows if r.get("phase") == "off"]
    if off:
        out["off"] = str(off[0])
    truth = [d for d in load if d.get("injected") is not None]
    if truth:
        raced = [d for d in truth if d["injected"] == "logprob_race"]
        hit = [d for d in raced if d["kl"] > threshold]
        false = [d for d in truth if d["injected"] == "none" and d["kl"] > threshold]
        out["sim_raced"] = len(raced)
        out["sim_recall"] = len(hit) / len(raced) if raced else None
        out["sim_false_deviations"] = len(false)
    return out


def attach(summary: dict[str, Any], run_dir: Path) -> None:
    """Add ``canary`` (and the gate metrics ``canary_max_kl``, ``canary_deviating_share``) to
    each variant with canary rows, and ``canary_p_value`` to each comparison."""
    rows = read_rows(run_dir)
    if not rows:
        return
    by_label: dict[str, dict[str, Any]] = {}
    rows_of = {str(v["label"]): [r for r in rows if r.get("variant") == v["label"]]
               for v in summary.get("variants", [])}  # fmt: skip
    for v in summary.get("variants", []):
        mine = [r for r in rows if r.get("variant") == v["label"]]
        if not mine:
            continue
        block = variant_canary(mine, int(v.get("turns") or 0))
        v["canary"] = block
        v["canary_max_kl"] = block["max_kl"]
        v["canary_deviating_share"] = block["deviating_share"]
        by_label[v["label"]] = block
    for c in summary.get("comparisons", []):
        a, b = by_label.get(c.get("a", "")), by_label.get(c.get("b", ""))
        if a is not None and b is not None:
            c["canary_alone_kl"] = alone_kl(rows_of[c["a"]], rows_of[c["b"]])
        if a is None or b is None or not a["scored"] or not b["scored"]:
            c["canary_p_value"] = None
            continue
        c["canary_p_value"] = stats.fisher_exact(
            b["deviating"], b["scored"], a["deviating"], a["scored"]
        )
