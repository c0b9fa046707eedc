"""The run measuring itself: is the harness, not the server, what limits a variant?

A ``SelfReport`` is started and stopped around one variant's load, on the event loop that
drives it. While running it measures:

- event-loop lag: a ticker sleeps ``interval_s`` and records how late it wakes up (the delay
  every callback on the loop suffers at that moment);
- send lag: from a session deciding to send a turn (``sending()``) to the request's headers
  leaving (``request_sent()``, called from an aiohttp trace hook: ``trace_config()``, or a
  client that calls its ``observers``);
- pool waits: time a request queued for a free connection (a pool smaller than the load);
- stale resends: requests sent again because the server had closed their kept-alive
  connection before any byte of an answer (``resent_stale()``; each first send is also a
  ``dropped`` row of turns.jsonl);
- CPU: process CPU seconds and the event-loop thread's CPU seconds over wall seconds;
- turns per second (``note_turn()``).

Quantiles come from fixed log-spaced histograms, so memory does not grow with the run's
length. ``stop()`` returns the ``harness_self`` dict for summary.json, with ``saturated`` set
(and ``warnings`` saying why) when the harness itself was the bottleneck.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from harness.record.rundir import SELF_REPORT_FILE

log = logging.getLogger(__name__)

LAG_LIMIT_MS = 100.0  # loop lag p99 above this: the harness delays its own sends
CPU_LIMIT = 0.9  # event-loop thread busier than this share of one core: saturated

_decided: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "harness_send_decided", default=None
)


class LogHistogram:
    """Durations in seconds, counted in log-spaced buckets (``per_decade`` per factor 10)."""

    def __init__(self, lo_s: float = 1e-5, hi_s: float = 1e3, per_decade: int = 20) -> None:
        self.lo = lo_s
        self.per_decade = per_decade
        self.size = int(math.ceil(math.log10(hi_s / lo_s) * per_decade)) + 2
        self.counts = [0] * self.size
        self.n = 0
        self.max = 0.0
        self.total = 0.0

    def add(self, value_s: float) -> None:
        value_s = max(0.0, value_s)
        if value_s <= self.lo:
            i = 0
        else:
            i = min(self.size - 1, 1 + int(math.log10(value_s / self.lo) * self.per_decade))
        self.counts[i] += 1
        self.n += 1
        self.total += value_s
        self.max = max(self.max, value_s)

    def quantile(self, q: float) -> float | None:
        """The upper edge of the bucket holding quantile ``q`` (never above the max seen)."""
        if self.n == 0:
            return None
        rank = q * self.n
        seen = 0
        for i, count in enumerate(self.counts):
            seen += count
            if seen >= rank and count:
                edge = self.lo * 10 ** (i / self.per_decade) if i else self.lo
                return min(edge, self.max)
        return self.max

    def summary_ms(self) -> dict[str, Any] | None:
        if self.n == 0:
            return None
        p50, p99 = self.quantile(0.5), self.quantile(0.99)
        return {
            "p50": round((p50 or 0.0) * 1e3, 3),
            "p99": round((p99 or 0.0) * 1e3, 3),
            "max": round(self.max * 1e3, 3),
            "mean": round(self.total / self.n * 1e3, 3),
            "samples": self.n,
        }


class SelfReport:
    """Start on the driving event loop, stop to get the ``harness_self`` dict."""

    def __init__(
        self,
        interval_s: float = 0.1,
        lag_limit_ms: float = LAG_LIMIT_MS,
        cpu_limit: float = CPU_LIMIT,
    ) -> None:
        self.interval_s = interval_s
        self.lag_limit_ms = lag_limit_ms
        self.cpu_limit = cpu_limit
        self.loop_lag = LogHistogram()
        self.send_lag = LogHistogram()
        self.pool_wait = LogHistogram()
        self.judge_wait = LogHistogram()  # a session waiting for its answer's verdict
        self.turns = 0
        self.stale_resends = 0
        self._task: asyncio.Task[None] | None = None
        self._t0 = self._cpu0 = self._thread0 = 0.0
        self.result: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        """Begin measuring; must be called from the event loop being measured."""
        if self._task is not None:
            return
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._thread0 = time.thread_time()
        self._task = asyncio.get_running_loop().create_task(self._tick(), name="selfreport")

    def restart(self) -> None:
        """Start the clocks and the lag samples again (what came before was set-up)."""
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        self._thread0 = time.thread_time()
        self.loop_lag = LogHistogram()

    async def _tick(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self.interval_s)
            self.loop_lag.add(time.perf_counter() - before - self.interval_s)

    def note_turn(self) -> None:
        self.turns += 1

    def sending(self) -> None:
        """A session decided to send now (in the task that will send the request)."""
        _decided.set(time.perf_counter())

    def request_sent(self, now: float | None = None) -> None:
        """The request's headers left (called in the sending task, e.g. by a trace hook)."""
        decided = _decided.get()
        if decided is None:
            return
        self.send_lag.add((now if now is not None else time.perf_counter()) - decided)
        _decided.set(None)

    def judged(self, seconds: float) -> None:
        """A session waited ``seconds`` for its answer's verdict (``harness.drive.judging``)."""
        self.judge_wait.add(seconds)

    def pool_waited(self, seconds: float) -> None:
        self.pool_wait.add(seconds)

    def resent_stale(self) -> None:
        self.stale_resends += 1

    def trace_config(self) -> Any:
        """An ``aiohttp.TraceConfig`` feeding ``request_sent`` and ``pool_waited``."""
        import aiohttp

        queued: contextvars.ContextVar[float] = contextvars.ContextVar("pool_queued", default=0.0)

        async def on_queued_start(_s: Any, _ctx: Any, _p: Any) -> None:
            queued.set(time.perf_counter())

        async def on_queued_end(_s: Any, _ctx: Any, _p: Any) -> None:
            self.pool_waited(time.perf_counter() - queued.get())

        async def on_headers_sent(_s: Any, _ctx: Any, _p: Any) -> None:
            self.request_sent()

        trace = aiohttp.TraceConfig()
        trace.on_connection_queued_start.append(on_queued_start)
        trace.on_connection_queued_end.append(on_queued_end)
        trace.on_request_headers_sent.append(on_headers_sent)
        return trace

    def stop(self) -> dict[str, Any]:
        """Stop measuring and return the ``harness_self`` dict (also kept as ``result``).

        Synchronous, so it also works in a ``finally`` of a task being cancelled.
        """
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.result = self.snapshot()
        return self.result

    def snapshot(self) -> dict[str, Any]:
        """The figures so far (``stop`` returns the final ones)."""
        wall = max(1e-9, time.perf_counter() - self._t0)
        cpu = time.process_time() - self._cpu0
        loop_cpu = time.thread_time() - self._thread0
        lag = self.loop_lag.summary_ms()
        warnings = []
        if lag is not None and lag["p99"] > self.lag_limit_ms:
            warnings.append(
                f"event-loop lag p99 {lag['p99']:.0f} ms > {self.lag_limit_ms:.0f} ms: "
                "the harness delayed its own sends and time stamps (--workers spreads the "
                "sessions over more processes)"
            )
        if loop_cpu / wall > self.cpu_limit:
            warnings.append(
                f"event-loop thread used {100 * loop_cpu / wall:.0f}% of a core "
                f"(> {100 * self.cpu_limit:.0f}%): the harness may be the bottleneck "
                "(--workers spreads the sessions over more processes)"
            )
        judged = self.judge_wait.summary_ms()
        if judged is not None and judged["p50"] > self.lag_limit_ms:
            warnings.append(
                f"sessions waited for their answers' verdicts (p50 {judged['p50']:.0f} ms > "
                f"{self.lag_limit_ms:.0f} ms): the judging processes lack CPU, and the server "
                "saw less load than asked (give the harness more cores, or fewer --workers "
                "and more --judges)"
            )
        pool = self.pool_wait.summary_ms()
        if pool is not None and pool["p99"] > self.lag_limit_ms:
            warnings.append(
                f"requests waited for a pooled connection (p99 {pool['p99']:.0f} ms): "
                "the connection pool is smaller than the concurrency"
            )
        return {
            "wall_s": round(wall, 3),
            "turns": self.turns,
            "turns_per_s": round(self.turns / wall, 2),
            "cpu_s": round(cpu, 3),
            "cpu_percent": round(100 * cpu / wall, 1),
            "loop_cpu_percent": round(100 * loop_cpu / wall, 1),
            "loop_lag_ms": lag,
            "send_lag_ms": self.send_lag.summary_ms(),
            "pool_wait_ms": pool,
            "judge_wait_ms": judged,
            "stale_resends": self.stale_resends,
            "saturated": bool(warnings),
            "warnings": warnings,
        }


def _worst(parts: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The worst of several lag summaries, field by field; samples summed."""
    seen = [p for p in parts if p]
    if not seen:
        return None
    worst = {k: max(p[k] for p in seen) for k in ("p50", "p99", "max", "mean")}
    return {**worst, "samples": sum(p["samples"] for p in seen)}


def combine(
    workers: list[dict[str, Any]],
    parent: dict[str, Any] | None = None,
    lag_limit_ms: float = LAG_LIMIT_MS,
) -> dict[str, Any]:
    """One ``harness_self`` for a variant driven by several worker processes.

    Turns and CPU are summed (the parent's CPU, writing the records, included), turns/s is
    every turn over the variant's wall time (the parent's, from the first job sent to the
    last worker done), the loop, send and pool lags are the worst worker's (field by field),
    ``loop_cpu_percent`` the busiest worker loop's. Every worker's warning is kept, prefixed
    with its number; the parent's own CPU and loop lag are ``parent_cpu_s`` and
    ``parent_loop_lag_ms`` (it only writes: when it lags, the workers wait on their pipes and
    their own lag shows it too); ``peak_rss_mb`` sums the workers' peaks.
    """
    wall = max([parent["wall_s"] if parent else 0.0] + [w["wall_s"] for w in workers] + [1e-9])
    turns = sum(w["turns"] for w in workers)
    cpu = sum(w["cpu_s"] for w in workers) + (parent["cpu_s"] if parent else 0.0)
    warnings = [f"worker {i + 1}: {m}" for i, w in enumerate(workers) for m in w["warnings"]]
    parent_lag = parent.get("loop_lag_ms") if parent else None
    if parent_lag is not None and parent_lag["p99"] > lag_limit_ms:
        warnings.append(
            f"the parent's event loop (the records' writer) lagged: p99 "
            f"{parent_lag['p99']:.0f} ms > {lag_limit_ms:.0f} ms"
        )
    out: dict[str, Any] = {
        "wall_s": round(wall, 3),
        "turns": turns,
        "turns_per_s": round(turns / wall, 2),
        "cpu_s": round(cpu, 3),
        "cpu_percent": round(100 * cpu / wall, 1),
        "loop_cpu_percent": max((w["loop_cpu_percent"] for w in workers), default=0.0),
        "loop_lag_ms": _worst([w.get("loop_lag_ms") for w in workers]),
        "send_lag_ms": _worst([w.get("send_lag_ms") for w in workers]),
        "pool_wait_ms": _worst([w.get("pool_wait_ms") for w in workers]),
        "judge_wait_ms": _worst([w.get("judge_wait_ms") for w in workers]),
        "stale_resends": sum(w.get("stale_resends", 0) for w in workers),
        "saturated": bool(warnings),
        "warnings": warnings,
        "workers": len(workers),
        "parent_cpu_s": round(parent["cpu_s"], 3) if parent else None,
        "parent_loop_lag_ms": parent_lag,
    }
    rss = [w["peak_rss_mb"] for w in workers if w.get("peak_rss_mb") is not None]
    if rss:
        out["peak_rss_mb"] = round(sum(rss), 1)  # the workers' peaks (not the parent's)
    out["per_worker"] = [
        {k: w.get(k) for k in ("turns", "turns_per_s", "cpu_percent", "loop_lag_ms")}
        for w in workers
    ]
    return out


def save_row(run_dir: Path, variant: str, repeat: int, report: dict[str, Any] | None) -> None:
    """Append one variant load's report to the run folder's ``selfreport.jsonl``."""
    if report is None:
        return
    row = {"variant": variant, "repeat": repeat, **report}
    with open(run_dir / SELF_REPORT_FILE, "a") as fh:
        fh.write(json.dumps(row) + "\n")
