"""Server metrics beside the corruption rate over time, and how they move together per variant.

A collapse of speculative acceptance after a HiCache load-back has been reported as a sign of
corruption; so can a filling host tier or a falling cache hit rate be. Each variant's (and
repeat's) time is cut into bins from its first request on; per bin, the share of corrupted
turns sent in it and the mean of each watched metric scraped in it (``metrics.jsonl`` rows
carry the wall clock, so both sides share one clock; older rows fall back to the scraper's
own start, a moment before the first request). Per variant the bins give Spearman's rank
correlation between each metric and the corruption rate, with its p-value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

#: The normalized metrics set beside corruption (harness.target.metrics), in plot order.
WATCHED = (
    "spec_accept_rate",
    "hicache_host_used_tokens",
    "cache_hit_rate",
    "cache_usage",
    "running",
)
BINS = 12
MIN_BINS = 4  # fewer bins with both sides: no correlation reported

COLUMNS = ["variant", "repeat", "t", "turns", "corrupted", "rate", "metric", "value"]


def binned(
    turns: pd.DataFrame,
    metrics: pd.DataFrame | None,
    bins: int = BINS,
    watched: Sequence[str] = WATCHED,
) -> pd.DataFrame:
    """One row per (variant, repeat, bin, metric): the bin's turn corruption rate and the
    metric's mean in it (NaN where no scrape fell in the bin)."""
    need = {"variant", "t", "name", "value"}
    if metrics is None or turns.empty or not need <= set(metrics.columns):
        return pd.DataFrame(columns=COLUMNS)
    if "sent_at" not in turns:
        return pd.DataFrame(columns=COLUMNS)
    m = metrics[metrics["name"].isin(watched)]
    if m.empty:
        return pd.DataFrame(columns=COLUMNS)
    if "repeat" not in m:
        m = m.assign(repeat=0)
    used = ["variant", "repeat", "sent_at", "is_corrupted"]  # (the bins copy no more)
    ok = turns.loc[~turns["is_transport"] & turns["sent_at"].notna(), used]
    rows: list[dict[str, Any]] = []
    for (variant, repeat), g in ok.groupby(["variant", "repeat"], sort=False):
        start = float(g["sent_at"].min())
        t = g["sent_at"].astype(float) - start
        end = max(float(t.max()), 1e-9)
        edges = np.linspace(0.0, end, bins + 1)
        which = np.clip(np.digitize(t, edges) - 1, 0, bins - 1)
        mine = m[(m["variant"] == variant) & (m["repeat"] == repeat)]
        if "wall" in mine and mine["wall"].notna().all():
            mt = mine["wall"].astype(float) - start
        else:
            mt = mine["t"].astype(float)
        mbin = np.clip(np.digitize(mt, edges) - 1, 0, bins - 1)
        inside = ((mt >= 0) & (mt <= end)).to_numpy()
        present = set(mine["name"])
        for b in range(bins):
            sel = g[which == b]
            if not len(sel):
                continue
            k = int(sel["is_corrupted"].sum())
            base = {"variant": variant, "repeat": int(repeat),
                    "t": float((edges[b] + edges[b + 1]) / 2), "turns": len(sel),
                    "corrupted": k, "rate": k / len(sel)}  # fmt: skip
            here = mine[(mbin == b) & inside]
            for name in watched:
                values = here.loc[here["name"] == name, "value"]
                if name in present:
                    mean = float(values.mean()) if len(values) else math.nan
                    rows.append({**base, "metric": name, "value": mean})
    return pd.DataFrame(rows, columns=COLUMNS)


def _scipy() -> Any:
    """scipy.stats, imported when a run has server metrics to correlate (0.6 s of imports
    that a run's report does not wait for otherwise)."""
    from scipy import stats

    return stats


def correlations(frame: pd.DataFrame) -> dict[str, dict[str, dict[str, Any]]]:
    """``{variant: {metric: {"spearman", "p_value", "bins"}}}`` over the variant's bins
    (all repeats); ``spearman`` None when too few bins or a side never moves."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    if frame.empty:
        return out
    for (variant, metric), g in frame.groupby(["variant", "metric"], sort=False):
        g = g.dropna(subset=["value"])
        if g.empty:
            continue
        rho: float | None = None
        p: float | None = None
        if len(g) >= MIN_BINS and g["rate"].nunique() > 1 and g["value"].nunique() > 1:
            res = _scipy().spearmanr(g["value"], g["rate"])
            rho, p = float(res.statistic), float(res.pvalue)
            if not (math.isfinite(rho) and math.isfinite(p)):
                rho = p = None
        out.setdefault(str(variant), {})[str(metric)] = {
            "spearman": None if rho is None else round(rho, 4),
            "p_value": None if p is None else float(f"{p:.4g}"),
            "bins": len(g),
        }
    return out
