"""Cache pressure as the turns show it: live context over time, cached-token share.

``live_context_frame`` rebuilds, from turns.jsonl alone, the total live context of all
sessions over time (each session's latest prompt plus answer, from its first request to the
end of its last, running or thinking) and, where the turns recorded the server's KV capacity
(``kv_capacity``), the pressure: that total over the capacity.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd


def cache_summary(ok: pd.DataFrame) -> dict[str, Any]:
    """Cached-token share of the prompts; peak and mean pressure when the capacity is known."""
    out: dict[str, Any] = {}
    if "cached_tokens" in ok:
        both = (
            ok[["prompt_tokens"]]
            .assign(cached=pd.to_numeric(ok["cached_tokens"], errors="coerce"))
            .dropna()
        )
        prompt = float(both["prompt_tokens"].sum())
        out["cached_token_share"] = float(both["cached"].sum()) / prompt if prompt else None
    live = live_context_frame(ok)
    if len(live):
        out["live_tokens_peak"] = int(live["live_tokens"].max())
        if live["pressure"].notna().any():
            out["kv_capacity"] = int(live["capacity"].max())
            out["pressure_peak"] = float(live["pressure"].max())
            out["pressure_mean"] = float(_time_mean(live, "pressure"))
    return out


def _time_mean(frame: pd.DataFrame, column: str) -> float:
    """Time-weighted mean of a step function sampled at ``t`` (per variant and repeat)."""
    total = weight = 0.0
    for _, g in frame.groupby(["variant", "repeat"], sort=False):
        t = g["t"].to_numpy(dtype=float)
        v = g[column].to_numpy(dtype=float)
        if len(t) < 2:
            continue
        dt = np.diff(t)
        total += float((v[:-1] * dt).sum())
        weight += float(dt.sum())
    return total / weight if weight else float("nan")


def live_context_frame(df: pd.DataFrame) -> pd.DataFrame:
    """Live context of all sessions over time, per variant and repeat.

    A session's live context is its latest prompt (from when the request is sent) plus the
    answer (from when it ends), from its first request to the end of its last one, whether
    it is running or thinking. ``pressure`` is that over the KV capacity the turns recorded
    (``kv_capacity``; NaN when unknown). ``t``: seconds since the variant's first request.
    """
    cols = ["variant", "repeat", "t", "live_tokens", "capacity", "pressure"]
    need = {"sent_at", "prompt_tokens", "session"}
    if not need <= set(df.columns) or df.empty:
        return pd.DataFrame(columns=cols)
    used = ["variant", "repeat", *need, "latency_s", "completion_tokens", "kv_capacity"]
    df = df[[c for c in dict.fromkeys(used) if c in df]]  # (not every column copied below)
    frames = []
    for (variant, repeat), g in df.groupby(["variant", "repeat"], sort=False):
        g = g.dropna(subset=["sent_at", "prompt_tokens"])
        if g.empty:
            continue
        capacity = np.nan
        if "kv_capacity" in g:
            caps = pd.to_numeric(g["kv_capacity"], errors="coerce").dropna()
            capacity = float(caps.max()) if len(caps) else np.nan
        times, deltas = _live_events(g)
        # events at the same instant count together (an answer and the session's end)
        t, where = np.unique(times - times.min(), return_inverse=True)
        live = np.cumsum(np.bincount(where, weights=deltas))
        frames.append(pd.DataFrame({
            "variant": variant, "repeat": repeat, "t": t, "live_tokens": live,
            "capacity": capacity, "pressure": live / capacity,
        }))  # fmt: skip
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def _live_events(g: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(time, change of live tokens) for every request start and end of the sessions in ``g``:
    at a request's start its prompt replaces the session's context so far, at its end the
    answer adds to it, and at the session's last end its context leaves. (In arrays: the
    token counts are whole numbers, so the sums do not depend on the events' order.)"""
    latency = g["latency_s"].fillna(0.0) if "latency_s" in g else pd.Series(0.0, index=g.index)
    completion = g["completion_tokens"].fillna(0.0) if "completion_tokens" in g else latency * 0
    g = g.assign(_end=g["sent_at"].astype(float) + latency, _done=g["prompt_tokens"] + completion)
    g = g[g["session"].notna()].sort_values("sent_at", kind="stable")
    g = g.iloc[np.argsort(g["session"].to_numpy(), kind="stable")]  # each session in send order
    session = g["session"].to_numpy()
    start, end = g["sent_at"].to_numpy(float), g["_end"].to_numpy(float)
    prompt, done = g["prompt_tokens"].to_numpy(float), g["_done"].to_numpy(float)
    if not len(session):
        return np.array([]), np.array([])
    first = np.r_[True, session[1:] != session[:-1]]
    last = np.r_[session[1:] != session[:-1], True]
    before = np.r_[0.0, done[:-1]]
    before[first] = 0.0  # (a session's first prompt adds all of itself)
    ends = np.maximum.reduceat(end, np.flatnonzero(first))  # each session's last end
    times = np.concatenate([start, end, ends])
    deltas = np.concatenate([prompt - before, done - prompt, -done[last]])
    return times, deltas


def pressure_corruption_frame(df: pd.DataFrame, bins: int = 12) -> pd.DataFrame:
    """Turn corruption rate per variant and time bin (seconds since the variant's start)."""
    cols = ["variant", "t", "turns", "corrupted", "rate"]
    if "sent_at" not in df or df.empty:
        return pd.DataFrame(columns=cols)
    used = ["variant", "repeat", "sent_at", "is_corrupted"]  # (the bins copy no more)
    ok = df.loc[~df["is_transport"] & df["sent_at"].notna(), used]
    rows = []
    for (variant, _), g in ok.groupby(["variant", "repeat"], sort=False):
        t = g["sent_at"].astype(float) - float(g["sent_at"].min())
        edges = np.linspace(0.0, max(float(t.max()), 1e-9), bins + 1)
        which = np.clip(np.digitize(t, edges) - 1, 0, bins - 1)
        for b in range(bins):
            sel = g[which == b]
            if len(sel):
                k = int(sel["is_corrupted"].sum())
                rows.append({"variant": variant, "t": float((edges[b] + edges[b + 1]) / 2),
                             "turns": len(sel), "corrupted": k, "rate": k / len(sel)})  # fmt: skip
    return pd.DataFrame(rows, columns=cols)
