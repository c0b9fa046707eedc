"""The load as asked, as the harness sent it and as the server saw it, per variant.

A run asks for N requests in flight. The harness counts its own at every send (the
``inflight`` of each row); a server with ``/metrics`` says how many it was running
(``running`` in ``metrics.jsonl``: SGLang's ``num_running_reqs``, vLLM's
``num_requests_running``, llama.cpp's ``requests_processing``). Both are read over the
variant's steady state (from the 10th to the 90th percentile send, without the ramp and the
tail of the last sessions), and the shortfall is how far the server's median fell below what
was asked: a harness that could not keep up, a connection limit, or a server that queues
before it counts (its ``queued`` is given beside).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

#: a server that ran fewer than this share of the requests asked is called out in the report
#: (a session's own gap between an answer and its next request, its verdict and its tools,
#: keeps the server's count a little under the harness's: 5-12% in the demo)
SHORT_OF = 0.8
MIN_SAMPLES = 5  # scrapes in the steady state before a shortfall is called out


def _median(values: pd.Series) -> float | None:
    values = values.dropna()
    return round(float(values.median()), 2) if len(values) else None


def load_seen(
    turns: pd.DataFrame, metrics: pd.DataFrame | None, asked: int | None
) -> dict[str, dict[str, Any]]:
    """Per variant label: ``asked``, ``harness_inflight_p50``, ``server_running_p50``,
    ``server_queued_p50``, ``server_samples`` and ``shortfall`` (1 - the server's median over
    what was asked; None without the server's count)."""
    out: dict[str, dict[str, Any]] = {}
    if turns.empty or "sent_at" not in turns:
        return out
    for label, rows in turns.groupby("variant", sort=False):
        sent = rows["sent_at"].dropna().to_numpy(dtype=float)
        if not len(sent):
            continue
        lo, hi = np.quantile(sent, [0.1, 0.9])
        steady = rows[(rows["sent_at"] >= lo) & (rows["sent_at"] <= hi)]
        sessions = int(rows[["repeat", "session"]].drop_duplicates().shape[0])
        want = min(asked, sessions) if asked else sessions
        entry: dict[str, Any] = {
            "asked": want,
            "harness_inflight_p50": _median(steady["inflight"]),
            "server_running_p50": None,
            "server_queued_p50": None,
            "server_samples": 0,
            "shortfall": None,
        }
        if metrics is not None and not metrics.empty and {"wall", "name"} <= set(metrics):
            mine = metrics[
                (metrics["variant"] == label) & (metrics["wall"] >= lo) & (metrics["wall"] <= hi)
            ]
            running = mine.loc[mine["name"] == "running", "value"]
            queued = mine.loc[mine["name"] == "queued", "value"]
            entry["server_samples"] = int(running.notna().sum())
            entry["server_running_p50"] = _median(running)
            entry["server_queued_p50"] = _median(queued)
            if entry["server_running_p50"] is not None and want:
                entry["shortfall"] = round(1 - entry["server_running_p50"] / want, 3)
        out[str(label)] = entry
    return out


def short_variants(seen: dict[str, dict[str, Any]]) -> list[str]:
    """The variants whose server ran less than ``SHORT_OF`` of the requests asked."""
    return [
        label
        for label, e in seen.items()
        if e["shortfall"] is not None
        and e["shortfall"] > 1 - SHORT_OF
        and e["server_samples"] >= MIN_SAMPLES
    ]


def load_lines(summary: dict[str, Any]) -> list[str]:
    """Markdown: the load asked, sent and seen, per variant (only where one was measured)."""
    rows = [(v["label"], v["load"]) for v in summary["variants"] if v.get("load")]
    if not rows:
        return []
    out = ["", "## The load the server saw", ""]
    short = summary.get("load_short") or []
    if short:
        out += [
            f"**The server ran fewer requests than asked in {', '.join(short)}** (under "
            f"{SHORT_OF:.0%} of the concurrency asked, median over the steady state): the "
            "rates are those of a lighter load. See the harness's own report below, the "
            "server's queue, and its limits on running requests.",
            "",
        ]
    out += [
        "| variant | asked in flight | harness in flight (p50) | server running (p50) "
        "| server queued (p50) | shortfall |",
        "|---|---|---|---|---|---|",
    ]

    def show(x: Any) -> str:
        return "n/a" if x is None else str(x)

    for label, e in rows:
        short_of = "n/a" if e["shortfall"] is None else f"{e['shortfall']:.0%}"
        out.append(
            f"| {label} | {e['asked']} | {show(e['harness_inflight_p50'])} "
            f"| {show(e['server_running_p50'])} | {show(e['server_queued_p50'])} | {short_of} |"
        )
    return out
