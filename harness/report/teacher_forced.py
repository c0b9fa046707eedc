"""The canary's figure (plots/canary.png) and report section, and the judge's section."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from harness.analysis import canary_deviations as analysis  # noqa: E402
from harness.analysis.judge import GAP_REFERENCE_MIN  # noqa: E402
from harness.analysis.summary import fmt_pct  # noqa: E402
from harness.report.tables import table_head  # noqa: E402

DPI = 110
TINY = 1e-12  # a KL of exactly zero, drawn on the log axis


def _greedy(g: dict[str, Any] | None) -> str:
    """The greedy check's cell: off with why, or on with what it confirmed."""
    if not g:
        return "n/a"
    if g["reference"] < GAP_REFERENCE_MIN:
        return (f"off ({g['reference']} healthy greedy content-only turns measured, "
                f"{GAP_REFERENCE_MIN} needed)")  # fmt: skip
    seen = f"{g['reference_over']} of {g['reference']} healthy above {g['floor_nats']:g}"
    if not g["on"]:
        return f"off ({seen})"
    return f"on ({seen}); {g['flagged_confirmed']} of {g['flagged_checked']} flagged confirmed"


def plot_canary(run_dir: Path, order: Sequence[str], path: Path) -> Path | None:
    """The k3 KL of every canary score against its alone reference: over time, against the
    requests in flight and the prompt length; alone scores grey, the deviation threshold
    dashed. None when there is nothing to draw."""
    rows = analysis.read_rows(run_dir)
    per: dict[str, tuple[list[dict[str, Any]], float]] = {}
    for label in order:
        mine = [r for r in rows if r.get("variant") == label]
        devs, floor = analysis.deviations(mine)
        if devs:
            per[label] = (devs, max(analysis.NOISE_FACTOR * floor, analysis.KL_FLOOR))
    if not per:
        return None
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2), sharey=True)
    xs = (("t_s", "seconds since the variant's canary began"),
          ("inflight", "session requests in flight (last turn sent)"),
          ("prompt_tokens", "probe prompt tokens (the server's tokenizer)"))  # fmt: skip
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, (devs, limit)) in enumerate(per.items()):
        color = colors[i % len(colors)]
        for ax, (key, _) in zip(axes, xs, strict=True):
            load = [d for d in devs if d["phase"] == analysis.LOAD and d.get(key) is not None]
            alone = [d for d in devs if d["phase"] != analysis.LOAD and d.get(key) is not None]
            ax.scatter([d[key] for d in load], [max(d["kl"], TINY) for d in load], s=14,
                       color=color, alpha=0.7, label=f"{label} under load")  # fmt: skip
            if alone:
                ax.scatter([d[key] for d in alone], [max(d["kl"], TINY) for d in alone], s=10,
                           color="#999999", marker="x", alpha=0.6,
                           label=f"{label} alone" if ax is axes[0] else None)  # fmt: skip
            ax.axhline(limit, color=color, linestyle="--", linewidth=1)
    for ax, (_, title) in zip(axes, xs, strict=True):
        ax.set_yscale("log")
        ax.set_xlabel(title)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("KL (k3) against the alone score, per token\n(exactly 0 drawn at 1e-12)")
    axes[0].legend(fontsize=7, loc="center left")
    fig.suptitle("Canary: teacher-forced scores of fixed probes; dashed: deviation threshold "
                 "(max(10 x noise floor, 1e-3))")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _fmt(x: Any) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, float):
        return f"{x:.3g}"
    return str(x)


def markdown(summary: Mapping[str, Any]) -> Iterator[str]:
    """The canary and judge sections of report.md, when recorded."""
    variants = summary.get("variants", [])
    canaried = [v for v in variants if "canary" in v]
    if canaried:
        yield "## Canary: the model's own scores under load"
        yield ""
        yield ("Fixed probe texts scored teacher-forced (prompt logprobs, no generation) alone "
               "before the load, during it and alone after it; KL is the k3 estimate per "
               "token against the first alone score. Canary requests are separate from the "
               "sessions, one at a time, at a bounded rate.")  # fmt: skip
        yield ""
        yield from table_head("variant", "probes", "scored under load", "deviating", "max KL",
                              "noise floor KL", "share of requests")  # fmt: skip
        for v in canaried:
            c = v["canary"]
            share = c.get("deviating_share")
            dev = f"{c['deviating']} ({share:.1%})" if share is not None else "n/a"
            req = c.get("share_of_requests")
            yield (f"| {v['label']} | {c['probes']} | {c['scored']} | {dev} | "
                   f"{_fmt(c['max_kl'])} | {_fmt(c['noise_floor_kl'])} | "
                   f"{fmt_pct(req)} |")  # fmt: skip
            if c.get("off"):
                yield f"| {v['label']}: canary off: {c['off']} | | | | | | |"
        yield ""
        for c in summary.get("comparisons", []):
            if c.get("unit") == "session" and c.get("canary_p_value") is not None:
                yield f"- canary {c['b']} against {c['a']}: p = {c['canary_p_value']:.3g}"
        yield ""
    judged = [v for v in variants if "judge" in v]
    if judged:
        yield "## Judge: teacher-forced confirmation"
        yield ""
        yield from table_head("variant", "flagged judged", "confirmed", "passed judged",
                              "passed confirmed", "threshold (nats)", "greedy check",
                              "confirmed session rate")  # fmt: skip
        for v in judged:
            j = v["judge"]
            rate = j.get("confirmed_session_corruption_rate")
            yield (
                f"| {v['label']} | {j['flagged_judged']} | {j['flagged_confirmed']} | "
                f"{j['passed_judged']} | {j['passed_confirmed']} | "
                f"{j['threshold_nll']:.2f} | {_greedy(j.get('greedy'))} | {fmt_pct(rate)} |"
            )
        yield ""
        yield (
            "The greedy check: a greedy answer's every token is the model's first choice; a "
            "token far below it (more than the floor, in nats) was not written by the "
            "model's decode, and confirms a flagged turn the worst window acquits (a loop "
            "spliced in). It is on where the healthy sampled turns agree (docs/judge.md)."
        )
        yield ""
