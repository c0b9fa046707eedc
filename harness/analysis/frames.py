"""The frames the plots draw and the tidy export: corruption rate per bucket of context or
requests in flight, the label mix, latencies, one row per turn (turns.parquet).

Each takes the frame of ``analysis.summary.prepare`` (one row per turn, ``is_transport`` and
``is_corrupted`` set).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from harness.analysis import stats
from harness.analysis.summary import CONF
from harness.labels import ALL_LABELS

log = logging.getLogger(__name__)


# ---- frames for plots ---------------------------------------------------------------------


def bucket_rates(
    df: pd.DataFrame, column: str, edges: Sequence[float], names: Sequence[str]
) -> pd.DataFrame:
    """Turn corruption rate per variant and bucket of ``column`` (edges[i] <= x < edges[i+1])."""
    ok = df[~df["is_transport"] & df[column].notna()]
    cut = pd.cut(ok[column], bins=list(edges), labels=list(names), right=False)
    rows = []
    for (variant, bucket), g in ok.groupby([ok["variant"], cut], observed=True, sort=True):
        k, n = int(g["is_corrupted"].sum()), int(len(g))
        lo, hi = stats.wilson(k, n, CONF)
        rows.append({"variant": variant, "bucket": bucket, "turns": n, "corrupted": k,
                     "rate": k / n, "lo": lo, "hi": hi})  # fmt: skip
    out = pd.DataFrame(
        rows, columns=["variant", "bucket", "turns", "corrupted", "rate", "lo", "hi"]
    )
    out["bucket"] = pd.Categorical(out["bucket"], categories=list(names), ordered=True)
    first_seen = {v: i for i, v in enumerate(pd.unique(df["variant"]))}
    out["_order"] = out["variant"].map(first_seen)
    out = out.sort_values(["_order", "bucket"], kind="stable").drop(columns="_order")
    return out.reset_index(drop=True)


def context_frame(df: pd.DataFrame, step: int = 8000, top: int = 80000) -> pd.DataFrame:
    edges = [*range(0, top + 1, step), np.inf]
    names = [f"{lo // 1000}-{(lo + step) // 1000}k" for lo in range(0, top, step)] + [
        f"{top // 1000}k+"
    ]
    return bucket_rates(df, "prompt_tokens", edges, names)


def inflight_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Power-of-two buckets of requests in flight: 1, 2-3, 4-7, ..."""
    top = int(df["inflight"].max()) if df["inflight"].notna().any() else 1
    edges: list[float] = [0, 2]
    names = ["0-1"]
    while edges[-1] <= top:
        lo = int(edges[-1])
        edges.append(lo * 2)
        names.append(f"{lo}-{lo * 2 - 1}")
    return bucket_rates(df, "inflight", edges, names)


def label_mix_frame(df: pd.DataFrame, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Share of each label per variant (rows: variants in order; columns: labels)."""
    mix = pd.crosstab(df["variant"], df["label"], normalize="index")
    cols = [lab for lab in ALL_LABELS if lab in mix.columns]
    cols += [c for c in mix.columns if c not in cols]
    rows = [v for v in (order or list(pd.unique(df["variant"]))) if v in mix.index]
    return mix.loc[rows, cols]


def label_counts_frame(df: pd.DataFrame, order: Sequence[str] | None = None) -> pd.DataFrame:
    """Turns of each label per variant (rows: variants in order; columns: labels)."""
    counts = pd.crosstab(df["variant"], df["label"])
    cols = [lab for lab in ALL_LABELS if lab in counts.columns]
    cols += [c for c in counts.columns if c not in cols]
    rows = [v for v in (order or list(pd.unique(df["variant"]))) if v in counts.index]
    return counts.loc[rows, cols]


def corruption_events(df: pd.DataFrame) -> pd.DataFrame:
    """When each corrupted turn was sent: seconds since the first request of its variant and
    repeat (the time axis of the server metrics), with its label."""
    cols = ["variant", "repeat", "t", "label"]
    if "sent_at" not in df or df.empty:
        return pd.DataFrame(columns=cols)
    rows = df[df["sent_at"].notna()]
    first = rows.groupby(["variant", "repeat"])["sent_at"].transform("min")
    bad = rows[rows["is_corrupted"]]
    out = bad.assign(t=bad["sent_at"] - first[bad.index])
    return out[cols].reset_index(drop=True)


def latency_frame(df: pd.DataFrame) -> pd.DataFrame:
    return df.loc[~df["is_transport"], ["variant", "ttft_s", "itl_s", "latency_s"]].reset_index(
        drop=True
    )


# ---- tidy export ---------------------------------------------------------------------------


def tidy_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per turn, one column per scalar fact; factors become ``factor_<name>``."""
    derived = ("is_transport", "is_cancelled", "is_harness", "is_corrupted")
    out = df.drop(columns=[c for c in derived if c in df]).copy()
    if "factors" in out:
        facs = out.pop("factors").apply(lambda f: f if isinstance(f, Mapping) else {})
        flat = pd.DataFrame.from_records(list(facs), index=out.index).add_prefix("factor_")
        out = pd.concat([out, flat.astype("string")], axis=1)
    if "evidence" in out:
        out["evidence_offset"] = (
            out["evidence"]
            .apply(lambda e: e.get("offset") if isinstance(e, Mapping) else None)
            .astype("Int64")
        )
    for col in ("tool_calls", "evidence"):
        if col in out:
            out[col] = out[col].apply(
                lambda x: None if x is None else json.dumps(x, ensure_ascii=False)
            )
    return out


def write_tidy(df: pd.DataFrame, path: Path | str) -> Path:
    """Write turns.parquet (or turns.csv when pyarrow is missing); returns the path written."""
    path = Path(path)
    tidy = tidy_frame(df)
    try:
        tidy.to_parquet(path.with_suffix(".parquet"), index=False)
        return path.with_suffix(".parquet")
    except ImportError:
        log.info("pyarrow not available; writing CSV instead of parquet")
        tidy.to_csv(path.with_suffix(".csv"), index=False)
        return path.with_suffix(".csv")
