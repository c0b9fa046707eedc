"""matplotlib figures (Agg backend, PNG) from the summary and the analysis frames."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import PercentFormatter  # noqa: E402

from harness.analysis import frames, livecontext, metrics_vs_corruption  # noqa: E402
from harness.analysis import summary as analysis
from harness.labels import CORRUPTED_LABELS  # noqa: E402

log = logging.getLogger(__name__)

_MPL = tuple(int(x) for x in matplotlib.__version__.split(".")[:2])
HORIZONTAL: dict[str, Any] = {"orientation": "horizontal"} if _MPL >= (3, 10) else {"vert": False}

DPI = 110
MAX_METRICS = 6
LABEL_COLORS = {
    "ok_tool_call": "#4c9f70",
    "ok_text": "#9fd3a8",
    "parser_leak": "#f2c14e",
    "malformed_tool_call": "#d1495b",
    "invalid_tool_call": "#ed7d3a",
    "token_salad": "#8e44ad",
    "repetition": "#3d5a80",
    "empty": "#bdbdbd",
    "truncated": "#8d8d8d",
    "transport_error": "#444444",
}


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def rate_axis_top(cis: Sequence[Sequence[float]]) -> float:
    """The right end of a rate axis: 1.3 times the highest interval bound, within 100%."""
    return min(1.0, 1.3 * max((hi for _, hi in cis), default=1.0)) or 0.01


def plot_rates(summary: analysis.Summary, path: Path) -> Path:
    """Session and turn corruption rate per variant, with their intervals (Wilson for
    sessions, exact at the effective sample size for turns: analysis.summary)."""
    variants = summary["variants"]
    names = [v["label"] for v in variants]
    height = max(2.6, 0.55 * len(names) + 1.4)
    fig, axes = plt.subplots(1, 2, figsize=(11, height), sharey=True)
    units = (
        ("session", "sessions", "corrupted_sessions"),
        ("turn", "classified_turns", "corrupted_turns"),
    )
    y = np.arange(len(names))
    for ax, (unit, nkey, kkey) in zip(axes, units, strict=True):
        rates = [v[f"{unit}_corruption_rate"] or 0.0 for v in variants]
        cis = [v[f"{unit}_corruption_ci"] for v in variants]
        err = np.array([[r - lo for r, (lo, _) in zip(rates, cis, strict=True)],
                        [hi - r for r, (_, hi) in zip(rates, cis, strict=True)]])  # fmt: skip
        colors = ["#d1495b" if v[kkey] else "#4c9f70" for v in variants]
        ax.barh(y, rates, xerr=err, color=colors, capsize=4, height=0.6)
        # the axis follows the data (a turn rate of 1% is not drawn on a 13% axis), with
        # room for the counts right of the intervals
        top = rate_axis_top(cis)
        for yi, v, (_, hi) in zip(y, variants, cis, strict=True):
            ax.text(hi + 0.02 * top, yi, f"{v[kkey]}/{v[nkey]}", va="center", fontsize=9)
        ax.set_xlim(0, top)
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        how = "Wilson" if unit == "session" else "exact, clustered"
        ax.set_xlabel(f"corrupted {unit}s (% of {unit}s, 95% {how} CI)")
        ax.set_title(f"{unit.capitalize()} corruption rate")
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, names)
    axes[0].invert_yaxis()
    fig.suptitle(f"Corruption by variant - run {summary['run_id']}", fontsize=11)
    return _save(fig, path)


#: A bucket with fewer turns than this gets no interval (it would say little), only its count.
MIN_BUCKET_TURNS = 30


def plot_buckets(
    frame: pd.DataFrame,
    path: Path,
    title: str,
    xlabel: str,
    min_turns: int = MIN_BUCKET_TURNS,
) -> Path:
    return _save(bucket_figure(frame, title, xlabel, min_turns), path)


def bucket_figure(
    frame: pd.DataFrame, title: str, xlabel: str, min_turns: int = MIN_BUCKET_TURNS
) -> Figure:
    """Turn corruption rate per bucket (x) and variant (bars), with the corrupted and total
    turns written on each bar; the 95% interval only where a bucket has ``min_turns`` turns
    (fewer: a pale hatched bar, no interval). Below: the turns per bucket, so where the run's
    turns sit is seen at once."""
    fig, (ax, cx) = plt.subplots(
        2, 1, figsize=(10, 5.8), sharex=True, gridspec_kw={"height_ratios": [3, 1.2]}
    )
    cats = list(frame["bucket"].cat.categories) if len(frame) else []
    used = [c for c in cats if (frame["bucket"] == c).any()]
    pos = {c: i for i, c in enumerate(used)}
    variants = list(pd.unique(frame["variant"]))
    width = 0.8 / max(1, len(variants))
    top = 0.0
    few_seen = False
    for i, (variant, g) in enumerate(frame.groupby("variant", sort=False)):
        color = f"C{i}"
        x = np.array([pos[b] for b in g["bucket"]]) + (i - (len(variants) - 1) / 2) * width
        rate = g["rate"].to_numpy(dtype=float)
        n = g["turns"].to_numpy(dtype=int)
        k = g["corrupted"].to_numpy(dtype=int)
        enough = n >= min_turns
        few_seen = few_seen or bool((~enough).any())
        ax.bar(x[enough], rate[enough], width * 0.92, color=color, label=str(variant))
        ax.bar(x[~enough], rate[~enough], width * 0.92, color=color, alpha=0.25, hatch="///",
               edgecolor=color, lw=0)  # fmt: skip
        lo, hi = g["lo"].to_numpy(dtype=float), g["hi"].to_numpy(dtype=float)
        hit = enough & (k > 0)
        if hit.any():
            err = np.array([rate[hit] - lo[hit], hi[hit] - rate[hit]])
            ax.errorbar(x[hit], rate[hit], yerr=err, fmt="none", ecolor="#333",
                        elinewidth=0.9, capsize=2.5, alpha=0.8)  # fmt: skip
        if (enough & (k == 0)).any():  # no event: only how high the rate could be, faint
            ax.vlines(x[enough & (k == 0)], 0, hi[enough & (k == 0)], colors="#999",
                      linestyles=":", lw=0.9)  # fmt: skip
        if enough.any():
            top = max(top, float(hi[enough].max()))
        top = max(top, float(rate.max()) if len(rate) else 0.0)
        for xi, ki, ni, ri, hii, ok in zip(x, k, n, rate, hi, enough, strict=True):
            y = hii if ok else ri
            ax.text(xi, y, f" {ki}/{ni}", rotation=90, ha="center", va="bottom", fontsize=7,
                    color="#b00020" if ki else "#555")  # fmt: skip
        cx.bar(x, n, width * 0.92, color=color, alpha=0.85)
    ax.set_ylim(0, max(top * 1.35, 0.01))
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_ylabel("corrupted turns (% of turns)")
    note = (
        f"bars: rate, k/n corrupted of turns; whiskers: 95% Wilson CI (buckets of {min_turns}+"
        " turns; dotted: none corrupted)"
    )
    if few_seen:
        note += f"; hatched: under {min_turns} turns, no interval"
    fig.suptitle(title, fontsize=11)
    ax.set_title("\n".join(textwrap.wrap(note, 120)), fontsize=8, color="#555")
    ax.grid(axis="y", alpha=0.3)
    if variants:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    cx.set_xticks(range(len(used)), used)
    cx.set_ylabel("turns")
    cx.set_xlabel(xlabel)
    cx.grid(axis="y", alpha=0.3)
    return fig


def plot_label_mix(counts: pd.DataFrame, path: Path) -> Path:
    fig = label_mix_figure(counts)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def label_mix_figure(counts: pd.DataFrame) -> Figure:
    """Left: the share of every turn label per variant (stacked). Right: the corrupted labels
    alone on their own scale, with their counts, so a 1% corruption is not a sliver."""
    fig, (ax, bx) = plt.subplots(
        1, 2, figsize=(12, max(2.8, 0.6 * len(counts) + 1.8)), sharey=True,
        gridspec_kw={"width_ratios": [3, 2]},
    )  # fmt: skip
    totals = counts.sum(axis=1).replace(0, np.nan)
    mix = counts.div(totals, axis=0).fillna(0.0)
    y = np.arange(len(mix))
    left = np.zeros(len(mix))
    for lab in mix.columns:
        share = mix[lab].to_numpy(dtype=float)
        hatch = "//" if lab in CORRUPTED_LABELS else None
        color = LABEL_COLORS.get(str(lab), "#999999")
        ax.barh(y, share, left=left, height=0.6, label=str(lab), color=color, hatch=hatch,
                edgecolor="white")  # fmt: skip
        left += share
    ax.set_yticks(y, [str(i) for i in mix.index])
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_xlabel("share of turns (all labels; hatched: corrupted)")
    ax.set_title("Turn labels per variant")
    bad = [lab for lab in mix.columns if lab in CORRUPTED_LABELS]
    left = np.zeros(len(mix))
    for lab in bad:
        share = mix[lab].to_numpy(dtype=float)
        bx.barh(y, share, left=left, height=0.6, color=LABEL_COLORS.get(str(lab), "#999"),
                hatch="//", edgecolor="white", label=str(lab))  # fmt: skip
        left += share
    peak = float(left.max()) if len(left) else 0.0
    for yi, total, variant in zip(y, left, mix.index, strict=True):
        k = int(counts.loc[variant, bad].sum()) if bad else 0
        n = int(counts.loc[variant].sum())
        bx.text(total, yi, f" {k} of {n:,} turns ({100 * total:.1f}%)", va="center", fontsize=8)
    bx.set_xlim(0, max(peak * 1.6, 0.005))
    bx.xaxis.set_major_formatter(PercentFormatter(1.0, decimals=1))
    bx.set_xlabel("share of turns (corrupted labels only, own scale)")
    bx.set_title("Corrupted labels")
    bx.grid(axis="x", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=min(6, len(labels)),
               bbox_to_anchor=(0.5, -0.01))  # fmt: skip
    return fig


def plot_latency(frame: pd.DataFrame, order: Sequence[str], path: Path) -> Path:
    """Box plots of time to first token (s) and mean inter-token gap (ms) per variant."""
    names = [v for v in order if (frame["variant"] == v).any()]
    fig, axes = plt.subplots(1, 2, figsize=(11, max(2.6, 0.55 * len(names) + 1.4)), sharey=True)
    panels = (
        ("ttft_s", 1.0, "time to first token (s)"),
        ("itl_s", 1000.0, "mean inter-token gap (ms)"),
    )
    for ax, (col, scale, xlabel) in zip(axes, panels, strict=True):
        data = [frame.loc[frame["variant"] == v, col].dropna().to_numpy() * scale for v in names]
        if any(len(d) for d in data):
            ax.boxplot([d if len(d) else [np.nan] for d in data], showfliers=True,
                       flierprops={"markersize": 3}, **HORIZONTAL)  # fmt: skip
        else:
            ax.text(0.5, 0.5, "not measured", transform=ax.transAxes, ha="center")
        ax.set_xlabel(xlabel)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(1, len(names) + 1), names)
    axes[0].invert_yaxis()
    axes[0].set_title("Time to first token")
    axes[1].set_title("Inter-token latency")
    return _save(fig, path)


#: Server metrics as the plots name them: title, y-axis label, shown as percent.
METRIC_UNITS: dict[str, tuple[str, str, bool]] = {
    "running": ("Requests running", "requests", False),
    "queued": ("Requests queued", "requests", False),
    "cache_usage": ("KV cache in use", "share of the KV pool", True),
    "cache_hit_rate": ("Prefix cache hit rate", "share of prompt tokens", True),
    "sglang:cached_tokens_total": ("Cached prompt tokens (cumulative)", "tokens", False),
    "sglang:num_used_tokens": ("KV tokens in use", "tokens", False),
    "sglang:gen_throughput": ("Generation throughput", "tokens/s", False),
    "spec_accept_rate": ("Speculative acceptance rate", "accepted share of draft tokens", True),
    "hicache_host_used_tokens": ("HiCache host tokens in use", "tokens", False),
    "sglang:hicache_host_total_tokens": ("HiCache host capacity", "tokens", False),
}


def metric_title(name: str) -> tuple[str, str, bool]:
    """(title, y-axis label, shown as percent) of a metric; its own name when unknown."""
    return METRIC_UNITS.get(name, (name, "", False))


def far_from_zero(values: pd.Series) -> bool:
    """A series whose changes would be flattened on an axis from 0 (an acceptance rate
    between 0.65 and 0.70): its lowest value is above half its highest."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    return bool(len(v)) and float(v.min()) > 0.5 * float(v.max()) > 0


def metric_panels(metrics: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(metrics to draw, metrics left out: zero or one value throughout, said as
    ``name = value``). A series that repeats another one value for value (the server's
    ``sglang:num_running_reqs`` beside the harness's ``running`` for it) is drawn once,
    under the harness's name: one panel per quantity."""
    names = sorted((str(n) for n in pd.unique(metrics["name"])), key=lambda n: ":" in n)
    keys = [c for c in ("variant", "repeat", "t") if c in metrics]
    seen: set[tuple[Any, ...]] = set()
    keep: list[str] = []
    zero: list[str] = []
    for name in names:
        rows = metrics[metrics["name"] == name].sort_values(keys)
        values = pd.to_numeric(rows["value"], errors="coerce")
        series = tuple(zip(*(rows[k].tolist() for k in keys), values.round(9).tolist(),
                           strict=True))  # fmt: skip
        if series in seen:
            continue
        seen.add(series)
        present = values.dropna()
        if present.nunique() > 1:
            keep.append(name)
        else:  # a constant is a fact, not a curve
            value = float(present.iloc[0]) if len(present) else 0.0
            zero.append(name if value == 0 else f"{name} = {value:,.6g}")
    order = [str(n) for n in pd.unique(metrics["name"])]
    keep.sort(key=order.index)
    return keep[:MAX_METRICS], zero


def plot_metrics(metrics: pd.DataFrame, path: Path, events: pd.DataFrame | None = None) -> Path:
    """Scraped server metrics over time: one panel per quantity (duplicates and all-zero
    series left out), one line per variant; ``events`` (frames.corruption_events) marks when
    each corrupted turn was sent, in its variant's colour."""
    names, zero = metric_panels(metrics)
    if not names:
        raise ValueError("every scraped metric is constant (zero or one value throughout)")
    cols = 2 if len(names) > 1 else 1
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 2.9 * rows + 0.6), squeeze=False)
    keys = list(pd.unique(metrics["variant"]))
    colors = {v: f"C{i}" for i, v in enumerate(keys)}
    repeats = "repeat" in metrics and metrics["repeat"].nunique() > 1
    for ax, name in zip(axes.flat, names, strict=False):
        sub = metrics[metrics["name"] == name]
        title, unit, percent = metric_title(name)
        for key, g in sub.groupby(["variant", "repeat"] if repeats else "variant", sort=False):
            g = g.sort_values("t")
            variant = key[0] if isinstance(key, tuple) else key
            label = " #".join(map(str, key)) if isinstance(key, tuple) else str(key)
            ax.plot(g["t"], g["value"], lw=1.2, marker="o", ms=2.5, label=label,
                    color=colors.get(variant))  # fmt: skip
        if events is not None and len(events):
            for variant, g in events.groupby("variant", sort=False):
                # above the plot area: the marks never cover the lines
                ax.plot(g["t"], np.full(len(g), 1.04), ls="none", marker="v", ms=6,
                        color=colors.get(variant, "#b00020"), markeredgecolor="#b00020",
                        transform=ax.get_xaxis_transform(), clip_on=False)  # fmt: skip
        ax.set_title(title, fontsize=10, pad=18)
        ax.set_ylabel(unit)
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        if not far_from_zero(sub["value"]):
            ax.set_ylim(bottom=0)
        ax.set_xlabel("seconds since the variant's load began")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    sub_title = "Server metrics during the run"
    if events is not None and len(events):
        sub_title += " (▼: a corrupted turn was sent)"
    if zero:
        sub_title += f"\nconstant throughout, not drawn: {', '.join(zero)}"
    fig.suptitle(sub_title, fontsize=11)
    return _save(fig, path)


def plot_pressure(live: pd.DataFrame, corruption: pd.DataFrame, path: Path) -> Path:
    """Pressure (live context / KV capacity) over time, above the turn corruption rate."""
    fig, (ax, bx) = plt.subplots(2, 1, figsize=(11, 6.2), sharex=True)
    for (variant, repeat), g in live.groupby(["variant", "repeat"], sort=False):
        name = f"{variant} #{repeat}" if live["repeat"].nunique() > 1 else str(variant)
        ax.step(g["t"], g["pressure"], where="post", lw=1.2, label=name)
    ax.axhline(1.0, color="#888", lw=0.8, ls="--")
    ax.text(0.0, 1.0, " KV capacity", va="bottom", fontsize=8, color="#666")
    ax.set_ylabel("live context / KV capacity")
    ax.set_title("Cache pressure over time")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for variant, g in corruption.groupby("variant", sort=False):
        bx.plot(g["t"], g["rate"], marker="o", lw=1.2, label=str(variant))
    bx.yaxis.set_major_formatter(PercentFormatter(1.0))
    bx.set_ylim(bottom=0)
    bx.set_ylabel("corrupted turns")
    bx.set_xlabel("time since the variant's first request (s)")
    bx.set_title("Turn corruption rate over time")
    bx.grid(alpha=0.3)
    if len(corruption):
        bx.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def related(frame: pd.DataFrame) -> tuple[list[str], list[str], list[str]]:
    """What the metrics-vs-corruption plot can relate: (metrics that move in a variant with
    corrupted turns, in ``WATCHED`` order; those variants; what is left out and why)."""
    values = frame.dropna(subset=["value"])
    bad = values.groupby("variant", sort=False)["corrupted"].sum()
    variants = [str(v) for v, k in bad.items() if k > 0]
    mine = values[values["variant"].isin(variants)]
    moving = {str(n) for n, g in mine.groupby("metric") if g["value"].nunique() > 1}
    names = [n for n in metrics_vs_corruption.WATCHED if n in moving]
    clean = [str(v) for v, k in bad.items() if k == 0]
    still = sorted(set(map(str, values["metric"])) - moving, key=str)
    left = []
    if clean:
        left.append(f"no corrupted turn: {', '.join(clean)}")
    if still:
        left.append(f"constant: {', '.join(metric_title(n)[0] for n in still)}")
    return names, variants, left


def plot_metrics_vs_corruption(frame: pd.DataFrame, path: Path) -> Path:
    """Each watched server metric against the turn corruption rate, one point per time bin
    of a variant's load, Spearman's rho in the legend (harness.analysis.metrics_vs_corruption):
    only what relates the two. The metrics over time are the server_metrics plot's; a
    variant with no corrupted turn and a metric that never moves are said, not drawn."""
    names, variants, left = related(frame)
    if not names:
        raise ValueError("no watched metric moves in a variant with corrupted turns")
    corr = metrics_vs_corruption.correlations(frame)
    colors = {v: f"C{i}" for i, v in enumerate(pd.unique(frame["variant"]))}
    cols = 2 if len(names) > 1 else 1
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(11, 3.2 * rows + 0.9), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        sub = frame[(frame["metric"] == name) & frame["variant"].isin(variants)]
        for variant, g in sub.dropna(subset=["value"]).groupby("variant", sort=False):
            c = corr.get(str(variant), {}).get(name) or {}
            rho, p = c.get("spearman"), c.get("p_value")
            said = "rho n/a" if rho is None else f"rho {rho:+.2f}, p {p:.2g}"
            ax.scatter(g["value"], g["rate"], s=14 + 2 * g["turns"].clip(upper=40),
                       color=colors.get(variant), alpha=0.75, edgecolors="white",
                       label=f"{variant} ({said}, {c.get('bins', len(g))} bins)")  # fmt: skip
        title, unit, percent = metric_title(name)  # the server_metrics plot's names
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(unit or name, fontsize=8)
        if percent:
            ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylim(bottom=0)
        ax.set_ylabel("corrupted turns in the bin", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    head = (
        "Turn corruption rate against server metrics "
        f"(a point: one of the {metrics_vs_corruption.BINS} time bins of a variant's load)"
    )
    if left:
        head += "\nnot drawn: " + "; ".join(left)
    fig.suptitle(head, fontsize=11)
    return _save(fig, path)


def make_plots(run: analysis.RunData, summary: analysis.Summary, out_dir: Path) -> dict[str, Path]:
    """Draw every figure the data allows into ``out_dir``; returns {name: path}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    df = run.turns
    order = [v["label"] for v in summary["variants"]]
    made: dict[str, Path] = {}
    jobs: list[tuple[str, Any]] = [("corruption_by_variant", lambda p: plot_rates(summary, p))]
    if len(df):
        jobs += [
            ("corruption_by_context", lambda p: plot_buckets(
                frames.context_frame(df), p, "Turn corruption rate against context length",
                "prompt tokens (bucket, k = 1000 tokens)")),
            ("corruption_by_inflight", lambda p: plot_buckets(
                frames.inflight_frame(df), p, "Turn corruption rate against requests in flight",
                "requests in flight when the turn was sent (bucket)")),
            ("label_mix", lambda p: plot_label_mix(frames.label_counts_frame(df, order), p)),
            ("latency", lambda p: plot_latency(frames.latency_frame(df), order, p)),
        ]  # fmt: skip
    live = livecontext.live_context_frame(df) if len(df) else None
    if live is not None and len(live) and live["pressure"].notna().any():
        corruption = livecontext.pressure_corruption_frame(df)
        jobs.append(("pressure_over_time", lambda p: plot_pressure(live, corruption, p)))
    metrics = run.metrics
    if (
        metrics is not None
        and {"variant", "t", "name", "value"} <= set(metrics.columns)
        and metric_panels(metrics)[0]  # not when every series is constant
    ):
        events = frames.corruption_events(df) if len(df) else None
        jobs.append(("server_metrics", lambda p: plot_metrics(metrics, p, events)))
    if metrics is not None and {"variant", "t", "name", "value"} <= set(metrics.columns):
        beside = metrics_vs_corruption.binned(df, metrics)
        if len(beside) and related(beside)[0]:  # not when nothing relates
            jobs.append(("metrics_vs_corruption", lambda p: plot_metrics_vs_corruption(beside, p)))
    for name, job in jobs:
        try:
            made[name] = job(out_dir / f"{name}.png")
        except (ValueError, TypeError, KeyError) as exc:  # a plot must not sink the report
            log.warning("plot %s skipped: %s", name, exc)
            plt.close("all")
    return made
